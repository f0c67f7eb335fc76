"""An adversarial text corpus, tokenizer.json files in the styles of real model families built
with Hugging Face `tokenizers`, and the comparison of `hsx tokenize` with HF on them.

Everything is generated from fixed seeds, so a failure reproduces.
"""

import copy
import json
import os
import pathlib
import random
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
HSX = os.environ.get("HSX_BINARY", str(ROOT / "build" / "src" / "hsx"))
DECODE_CASES = 300

# Characters by script and kind; the generator mixes them.
LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéèêëàâäôöûüçñßøåæœÉÀÇÑİıſﬁ"
CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切官跑图急朝且坐"  # noqa: E501
HIRAGANA_KATAKANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー"  # noqa: E501
HANGUL = "가나다라마바사아자차카타파하한국어안녕하세요감사합니다대한민국서울사랑해요좋은아침입니다뷁똠챩"  # noqa: E501
ARABIC = "ابتثجحخدذرزسشصضطظعغفقكلمنهوي" + "\u064b\u064e\u064f\u0650\u0651\u0652" + "٠١٢٣٤٥٦٧٨٩"
DEVANAGARI = "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह" + "\u093e\u093f\u0940\u0941\u0942\u0947\u0948\u094b\u094c\u094d\u0902\u0903" + "०१२३४५६७८९"  # noqa: E501
THAI = "กขคงจฉชซญดตถทธนบปผพภมยรลวศษสหอฮ" + "\u0e31\u0e34\u0e35\u0e36\u0e37\u0e38\u0e39\u0e47\u0e48\u0e49\u0e4a\u0e4b" + "ะาำเแโใไ๐๑๒๓๔๕๖๗๘๙"  # noqa: E501
CYRILLIC_GREEK = "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯαβγδεζηθικλμνξοπρσςτυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ"  # noqa: E501
DIGITS = "0123456789" + "²³¹¼½¾" + "Ⅰ Ⅱ Ⅻ ⅷ".replace(" ", "") + "①②⑩" + "０１２９" + "𝟎𝟗"
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "«»“”‘’„‹›—–‐…·•¡¿、。，．！？：；（）【】「」『』《》〈〉‿⁀※§¶†‡" + "€£¥₩₹¢°±×÷≠≤≥∞√∑∫∂∆∇≈"  # noqa: E501
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u2000", "\u2003", "\u2009", "\u200a",
          "\u202f", "\u205f", "\u3000", "\u1680", "\u2028", "\u2029", "\u0085", "\u000b",
          "\u000c", "\u180e", "\u200b", "\ufeff", "\n\n\n", " \n ", "\t\t", "    "]
CONTROL = [chr(c) for c in list(range(0, 9)) + list(range(14, 32)) + [0x7f, 0x80, 0x9f, 0xad]] + \
    ["\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069", "\u00ad", "\ufffd", "\ufffe"]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u20dd", "\u0489", "\u0903",
             "\u1ab0", "\u1dc0", "\ufe20", "\u0345", "\u0344", "\u0e31"]
EMOJI = ["😀", "😂", "🤖", "🚀", "🎉", "❤️", "👍", "👍🏽", "👍🏿", "👋🏻", "🧑🏾‍💻", "👨‍👩‍👧‍👦",
         "👩‍❤️‍💋‍👨", "🏳️‍🌈", "🏴‍☠️", "🇫🇷", "🇯🇵🇰🇷", "1️⃣", "#️⃣", "©️", "™", "🫠", "🪿",
         "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☺", "✈️", "⌚", "🤷‍♀️", "🙆🏼‍♂️"]
WORDS = ["hello", "world", "Hello", "WORLD", "the", "The", "tokenizer", "don't", "I'm", "we'll",
         "they've", "it's", "She'd", "ÇA", "naïve", "café", "résumé", "straße", "İstanbul", "ǅemal",
         "ΣΊΣΥΦΟΣ", "ﬁnance", "Ǆ", "ß", "ｆｕｌｌｗｉｄｔｈ", "x86_64", "snake_case_name", "CamelCaseWord",
         "e-mail", "https://example.com/a?b=c&d=e#f", "user@example.org", "C++", "3.14159",
         "1,000,000", "-42", "0x1F", "1e-9", "v2.0.1", "12:30", "2024-01-01", "$100", "50%",
         "Ⓐⓑ", "ʰʲ", "ǃǂ", "ⅫⅣ", "x²", "①②", "'s", "'S", "'T", "'re", "'VE", "'ll", "'d", "'M", "‘quoted’", "\"double\""]
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "#include <stdio.h>\nint main() { printf(\"%d\\n\", 42); }", "SELECT * FROM t WHERE id = 7;",
        "    if x:\n        pass\n", "<div class=\"a\">&nbsp;</div>", "λx. x + 1", "a=b;c=d",
        "```python\nprint('hi')\n```", "{\"key\": [1, 2, {\"n\": null}]}"]


def _text_of(rng, pools):
    pool = rng.choice(pools)
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))


def generate_corpus(special_strings, count=2000, seed=1234):
    """`count` adversarial strings, plus fixed edge cases. `special_strings` are the added
    tokens of the tokenizers under test, embedded in text so their matching is exercised."""
    rng = random.Random(seed)
    scripts = [LATIN, CJK, HIRAGANA_KATAKANA, HANGUL, ARABIC, DEVANAGARI, THAI, CYRILLIC_GREEK]
    fixed = ["", " ", "  ", "\n", "\t", "\r\n", "a", "Hello world", " Hello world", "Hello  world ",
             "   leading", "trailing   ", "\u00a0nbsp\u00a0", "1234567890", "12345678901234567890",
             "3.14 2.718 1000000", "x" * 3000, "ab" * 1500, " " * 500, "\n" * 300, "9" * 1000,
             "𝟎𝟗𝟎𝟗", "ﬁ ﬂ", "ᾈ", "ǈ", "ŉ", "İi̇", "ΣΑΣ", "\ufeffBOM", "a\u0301e\u0301", "e\u0301\u0302\u0303"]
    fixed += [s for s in special_strings]
    fixed += [f"a{s}b" for s in special_strings] + [f" {s} " for s in special_strings]
    fixed += [f"x  {s}  y" for s in special_strings] + [s + s for s in special_strings]
    corpus = list(fixed)
    kinds = ["script", "mixed", "emoji", "spaces", "digits", "control", "combining", "special",
             "words", "code", "long", "sentence"]
    while len(corpus) < count:
        kind = rng.choice(kinds)
        parts = []
        for _ in range(rng.randint(1, 8)):
            if kind == "script":
                parts.append(_text_of(rng, scripts))
                parts.append(rng.choice([" ", "", "\n", "  "]))
            elif kind == "emoji":
                parts.append(rng.choice(EMOJI) * rng.randint(1, 3))
                parts.append(rng.choice(["", " ", "a", "字", "🏽", "\u200d"]))
            elif kind == "spaces":
                parts.append(rng.choice(SPACES) * rng.randint(1, 4))
                parts.append(rng.choice(WORDS + ["", "x", "字"]))
            elif kind == "digits":
                parts.append("".join(rng.choice(DIGITS[:10]) for _ in range(rng.randint(1, 25))))
                parts.append(rng.choice(["", " ", ".", ",", "a", rng.choice(DIGITS)]))
            elif kind == "control":
                parts.append(rng.choice(CONTROL))
                parts.append(rng.choice(WORDS + [" ", ""]))
            elif kind == "combining":
                parts.append(rng.choice(LATIN + "아ก") + "".join(
                    rng.choice(COMBINING) for _ in range(rng.randint(1, 4))))
            elif kind == "special":
                parts.append(rng.choice(special_strings) if special_strings else "<s>")
                parts.append(rng.choice(WORDS + SPACES + [""]))
                if rng.random() < 0.3:  # a special token cut short or doubled
                    s = rng.choice(special_strings) if special_strings else "<s>"
                    parts.append(s[: rng.randint(0, len(s))])
            elif kind == "words":
                parts.append(rng.choice(WORDS))
                parts.append(rng.choice([" ", "", "  ", "\n", ",", ". "]))
            elif kind == "code":
                parts.append(rng.choice(CODE))
            elif kind == "long":
                parts.append(rng.choice(WORDS + list(CJK[:20])) * rng.randint(50, 300))
            elif kind == "sentence":
                words = [rng.choice(WORDS) for _ in range(rng.randint(3, 15))]
                parts.append(" ".join(words) + rng.choice([".", "!", "?", "", "\n"]))
            else:  # mixed
                pool = rng.choice([LATIN, CJK, HANGUL, ARABIC, THAI, DEVANAGARI, PUNCTUATION,
                                   DIGITS, "".join(SPACES), "".join(EMOJI), "".join(COMBINING),
                                   "".join(CONTROL)])
                parts.append(rng.choice(pool))
        corpus.append("".join(parts))
    return corpus


def training_text():
    """Text to train the BPE models on: enough of every script for merges to exist."""
    rng = random.Random(99)
    lines = []
    for _ in range(3000):
        kind = rng.random()
        if kind < 0.4:
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))))
        elif kind < 0.8:
            pool = rng.choice([LATIN, CJK, HIRAGANA_KATAKANA, HANGUL, ARABIC, DEVANAGARI, THAI,
                               CYRILLIC_GREEK])
            lines.append(" ".join("".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
                                  for _ in range(rng.randint(2, 8))))
        elif kind < 0.9:
            lines.append(rng.choice(CODE))
        else:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 9)))
                                  for _ in range(rng.randint(1, 5))))
    return lines


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level_model(tokenizers, lines, vocab_size, pre_tokenizer):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    return json.loads(tok.to_str())


def _spm_model(lines, vocab_size):
    """A SentencePiece-style BPE (▁ for spaces) with <0xNN> byte-fallback tokens."""
    from tokenizers import Tokenizer, models, normalizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<unk>"], limit_alphabet=400)
    tok.train_from_iterator(lines, trainer)
    config = json.loads(tok.to_str())
    vocab = config["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    return config


def _added(tid, content, special=True, lstrip=False, rstrip=False, single_word=False,
           normalized=None):
    return {"id": tid, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def _with_added(config, tokens):
    """Adds tokens (content, flags) after the vocabulary, as HF numbers them."""
    config = copy.deepcopy(config)
    next_id = len(config["model"]["vocab"])
    config["added_tokens"] = list(config.get("added_tokens") or [])
    for content, flags in tokens:
        existing = config["model"]["vocab"].get(content)
        config["added_tokens"].append(_added(existing if existing is not None else next_id,
                                             content, **flags))
        if existing is None:
            next_id += 1
    return config


def _template(bos=None, eos=None):
    single, special = [], {}
    if bos:
        single.append({"SpecialToken": {"id": bos[0], "type_id": 0}})
        special[bos[0]] = {"id": bos[0], "ids": [bos[1]], "tokens": [bos[0]]}
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    if eos:
        single.append({"SpecialToken": {"id": eos[0], "type_id": 0}})
        special[eos[0]] = {"id": eos[0], "ids": [eos[1]], "tokens": [eos[0]]}
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": special}


def _split(pattern, behavior="Isolated", invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern},
            "behavior": behavior, "invert": invert}


BYTE_LEVEL_PRE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True}
SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}]}


FAMILIES = ["llama3", "qwen3", "smollm2", "gemma", "mistral"]


def build_tokenizers():
    """{name: tokenizer.json dict}: the family styles (FAMILIES), then one tokenizer per
    component variant (normalizers, pre-tokenizers, added-token flags, post-processors)."""
    import tokenizers
    from tokenizers import pre_tokenizers
    lines = training_text()
    seq = pre_tokenizers.Sequence
    out = {}

    llama3 = _byte_level_model(tokenizers, lines, 3000, seq([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    llama3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        _split(LLAMA3_REGEX), BYTE_LEVEL_PRE]}
    llama3["decoder"] = BYTE_LEVEL_DECODER
    llama3 = _with_added(llama3, [("<|begin_of_text|>", {}), ("<|end_of_text|>", {}),
                                  ("<|start_header_id|>", {}), ("<|end_header_id|>", {}),
                                  ("<|eot_id|>", {}), ("<|reserved_special_token_0|>", {})])
    bos = next(t["id"] for t in llama3["added_tokens"] if t["content"] == "<|begin_of_text|>")
    llama3["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        _template(bos=("<|begin_of_text|>", bos))]}
    out["llama3"] = llama3

    qwen = _byte_level_model(tokenizers, lines, 3000, seq([
        pre_tokenizers.Split(tokenizers.Regex(QWEN2_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    qwen["normalizer"] = {"type": "NFC"}
    qwen["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [_split(QWEN2_REGEX),
                                                                   BYTE_LEVEL_PRE]}
    qwen["decoder"] = BYTE_LEVEL_DECODER
    qwen["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": False, "use_regex": False}
    qwen = _with_added(qwen, [("<|endoftext|>", {}), ("<|im_start|>", {}), ("<|im_end|>", {}),
                              ("<think>", {"special": False}), ("</think>", {"special": False}),
                              ("<tool_call>", {"special": False})])
    out["qwen3"] = qwen

    smollm = _byte_level_model(tokenizers, lines, 3000, seq([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]))
    smollm["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    smollm["decoder"] = BYTE_LEVEL_DECODER
    smollm["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True,
                                "trim_offsets": False, "use_regex": True}
    smollm = _with_added(smollm, [("<|endoftext|>", {}), ("<|im_start|>", {}),
                                  ("<|im_end|>", {})])
    out["smollm2"] = smollm

    spm = _spm_model(lines, 2500)
    gemma = copy.deepcopy(spm)
    gemma["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    gemma["pre_tokenizer"] = None
    gemma["decoder"] = SPM_DECODER
    gemma = _with_added(gemma, [("<pad>", {}), ("<eos>", {}), ("<bos>", {}),
                                ("<start_of_turn>", {}), ("<end_of_turn>", {}),
                                ("<start_of_image>", {}), ("\n\n", {"special": False}),
                                ("<mask>", {"lstrip": True, "rstrip": True})])
    gemma_bos = next(t["id"] for t in gemma["added_tokens"] if t["content"] == "<bos>")
    gemma["post_processor"] = _template(bos=("<bos>", gemma_bos))
    out["gemma"] = gemma

    # Llama 2 / Mistral 7B v0.1: Prepend + Replace, Strip in the decoder, "<s> $A".
    mistral = copy.deepcopy(spm)
    mistral["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    mistral["pre_tokenizer"] = None
    mistral["decoder"] = {"type": "Sequence", "decoders": SPM_DECODER["decoders"] + [
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    mistral = _with_added(mistral, [("<s>", {}), ("</s>", {}), ("[INST]", {}), ("[/INST]", {})])
    s_id = next(t["id"] for t in mistral["added_tokens"] if t["content"] == "<s>")
    mistral["post_processor"] = _template(bos=("<s>", s_id))
    out["mistral"] = mistral

    # Mistral v0.3 / newer Llama-2 conversions: Metaspace with prepend_scheme "first".
    for scheme in ["first", "always", "never"]:
        for split in [False, True]:
            meta = copy.deepcopy(mistral)
            meta["normalizer"] = None
            meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁",
                                     "prepend_scheme": scheme, "split": split}
            meta["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                               "split": split}
            e_id = next(t["id"] for t in meta["added_tokens"] if t["content"] == "</s>")
            meta["post_processor"] = _template(bos=("<s>", s_id), eos=("</s>", e_id))
            out[f"metaspace_{scheme}_{'split' if split else 'whole'}"] = meta

    # Component variants over the byte-level model: the variant, then byte-level mapping.
    base = copy.deepcopy(qwen)
    base["normalizer"] = None
    base["post_processor"] = None

    def variant(name, pre=None, normalizer=None, byte_level=True):
        config = copy.deepcopy(base)
        steps = ([pre] if pre else []) + ([BYTE_LEVEL_PRE] if byte_level else [])
        config["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps}
        config["normalizer"] = normalizer
        out[name] = config

    variant("digits_contiguous", {"type": "Digits", "individual_digits": False})
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            variant(f"split_{behavior}_{invert}", _split(r"\s+|\p{P}", behavior, invert))
        variant(f"split_literal_{behavior}", _split(" ", behavior, literal=True))
        variant(f"punctuation_{behavior}", {"type": "Punctuation", "behavior": behavior})
    variant("whitespace", {"type": "Whitespace"})
    variant("whitespace_split", {"type": "WhitespaceSplit"})
    variant("bert_pre", {"type": "BertPreTokenizer"})
    variant("char_delimiter", {"type": "CharDelimiterSplit", "delimiter": "a"})
    variant("metaspace_then_bytes", {"type": "Metaspace", "replacement": "▁",
                                     "prepend_scheme": "always", "split": True})
    for prefix in [False, True]:
        for regex in [False, True]:
            config = copy.deepcopy(base)
            config["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": prefix,
                                       "trim_offsets": True, "use_regex": regex}
            out[f"byte_level_prefix{int(prefix)}_regex{int(regex)}"] = config
    config = copy.deepcopy(base)
    config["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, {"type": "Whitespace"},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}
    out["digits_whitespace_bytes_prefix"] = config
    for form in ["NFC", "NFD", "NFKC", "NFKD"]:
        variant(f"normalizer_{form}", normalizer={"type": form})
    variant("normalizer_lowercase", normalizer={"type": "Lowercase"})
    variant("normalizer_strip", normalizer={"type": "Strip", "strip_left": True,
                                            "strip_right": True})
    variant("normalizer_strip_accents", normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]})
    variant("normalizer_replace_regex", normalizer={"type": "Replace",
                                                    "pattern": {"Regex": r"\s+"}, "content": " "})
    variant("normalizer_prepend", normalizer={"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": False, "strip_right": True},
        {"type": "Prepend", "prepend": "▁"}, {"type": "NFKC"}]})

    # Added-token flags, with normalized tokens matched after a lowercasing normalizer.
    flags = copy.deepcopy(base)
    flags["normalizer"] = {"type": "Lowercase"}
    flags["pre_tokenizer"] = qwen["pre_tokenizer"]
    flags = _with_added(flags, [
        ("<mask>", {"lstrip": True, "rstrip": True}), ("[L]", {"lstrip": True}),
        ("[R]", {"rstrip": True}), ("cat", {"special": False, "single_word": True}),
        ("Hello World", {"special": False, "normalized": True}),
        ("<SW>", {"single_word": True}), ("ab", {"special": False, "normalized": False}),
        ("<|endoftext|>", {})])
    flags["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 0],
                               "cls": ["<mask>", 0], "trim_offsets": True,
                               "add_prefix_space": False}
    for token in flags["added_tokens"]:
        if token["content"] == "<|endoftext|>":
            flags["post_processor"]["sep"][1] = token["id"]
        if token["content"] == "<mask>":
            flags["post_processor"]["cls"][1] = token["id"]
    out["added_token_flags"] = flags
    return out


def special_strings(configs):
    strings = set()
    for config in configs:
        for token in config.get("added_tokens") or []:
            strings.add(token["content"])
    return sorted(strings)


def run_hsx_tokenize(tokenizer_path, lines, tmp_path):
    """Runs `hsx tokenize` over JSONL `lines`; returns its answers, one per line."""
    input_path = pathlib.Path(tmp_path) / "input.jsonl"
    input_path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = subprocess.run([HSX, "tokenize", "--tokenizer", str(tokenizer_path), "--input",
                             str(input_path)], capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    # Split at \n only: JSON strings may hold U+2028 and other line separators unescaped.
    answers = [json.loads(line) for line in result.stdout.decode("utf-8").split("\n") if line]
    assert len(answers) == len(lines)
    return answers


def compare(tokenizer_path, texts, tmp_path, seed, encode=None, decode_cases=DECODE_CASES, hsx_tokenizer=None):
    """(cases, mismatches) of hsx against HF `tokenizers` on `texts`, encoded with and without
    special tokens, and on random id sequences and cut encodings, decoded. `encode(texts,
    add_special_tokens)`, when given, is the reference encoder instead (transformers').
    `hsx_tokenizer` is what hsx reads instead of the same tokenizer.json (a .gguf file)."""
    import tokenizers
    hf = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    if encode is None:
        def encode(batch, add_special_tokens):
            return [e.ids for e in hf.encode_batch(batch, add_special_tokens=add_special_tokens)]
    rng = random.Random(seed)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    id_lists = [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
                for _ in range(decode_cases)]
    # Decoding what the corpus encodes to, cut at random points (inside characters), too.
    for ids in encode(texts[:decode_cases], False):
        cut = rng.randint(0, len(ids))
        if ids[:cut]:
            id_lists.append(ids[:cut])
    lines = ([{"text": t} for t in texts] +
             [{"text": t, "add_special_tokens": False} for t in texts] +
             [{"ids": ids} for ids in id_lists])
    expected = ([{"ids": ids} for ids in encode(texts, True)] +
                [{"ids": ids} for ids in encode(texts, False)] +
                [{"text": hf.decode(ids, skip_special_tokens=False)} for ids in id_lists])
    answers = run_hsx_tokenize(hsx_tokenizer or tokenizer_path, lines, tmp_path)
    mismatches = [(line, want, got) for line, want, got in zip(lines, expected, answers)
                  if want != got]
    return len(lines), mismatches


def describe(mismatches):
    return "\n".join(f"input {json.dumps(line)[:300]}\n  HF  {json.dumps(want)[:300]}\n"
                     f"  hsx {json.dumps(got)[:300]}" for line, want, got in mismatches[:5])
