"""A SentencePiece ('llama') GGUF tokenizer through hsx against transformers' conversion of the
same file: a SentencePiece-style BPE trained here (byte fallback, '▁' for spaces), written as
llama.cpp writes such vocabularies (tokens, scores, token types, no merges: they are derived
from the scores), converted by transformers' GGUF support, compared on the 2,000-string corpus.
"""
import json

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from gguf_tokenizer import convert  # noqa: E402
from tokenizer_corpus import _spm_model, compare, describe, generate_corpus, training_text  # noqa: E402

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def write_spm_gguf(path, chat_template=None):
    config = _spm_model(training_text(), 600)
    vocab = config["model"]["vocab"]
    specials = {"<s>": CONTROL, "</s>": CONTROL, "<tool>": USER_DEFINED}
    for token in specials:
        vocab.setdefault(token, len(vocab))
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    types = [specials.get(t, UNKNOWN if t == "<unk>" else BYTE if t.startswith("<0x") else NORMAL) for t in tokens]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])  # SentencePiece BPE: earlier pieces merge first
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_unk_token_id(vocab["<unk>"])
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path):
    model = tmp_path / "spm.gguf"
    write_spm_gguf(model)
    tokenizer = convert(model, tmp_path / "converted")
    corpus = generate_corpus(["<s>", "</s>", "<tool>", "<unk>"], count=2000)
    cases, mismatches = compare(tmp_path / "converted" / "tokenizer.json", corpus, tmp_path, seed=5, hsx_tokenizer=model,
                                encode=lambda texts, special: [tokenizer(t, add_special_tokens=special).input_ids
                                                               for t in texts])
    print(f"{cases - len(mismatches)}/{cases} equal")
    assert not mismatches, f"{len(mismatches)} of {cases} differ\n{describe(mismatches)}"
    assert json.loads((tmp_path / "converted" / "tokenizer.json").read_text())["model"]["merges"]


# Uses bos_token and eos_token, which come from the file's tokenizer.ggml.*_token_id.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<tool>{{ m['role'] }}\n{{ m['content'] | trim }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}<tool>assistant\n{% endif %}")


def test_gguf_chat_template_renders_as_transformers_conversion(tmp_path):
    """The file's tokenizer.chat_template is the model's template (as a directory's is):
    `hsx chat-template` renders what transformers' GGUF conversion renders, with the file's
    BOS and EOS texts; a file without one is still refused as having no template."""
    import subprocess

    from conftest import HSX
    model = tmp_path / "chat.gguf"
    write_spm_gguf(model, CHAT_TEMPLATE)
    tokenizer = convert(model, tmp_path / "converted")
    assert tokenizer.chat_template == CHAT_TEMPLATE
    conversations = [
        {"messages": [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hello there"}],
         "add_generation_prompt": True},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    ]
    lines = tmp_path / "lines.jsonl"
    lines.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    run = subprocess.run([HSX, "chat-template", "--model", str(model), "--input", str(lines)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rendered = [json.loads(line)["text"] for line in run.stdout.splitlines()]
    expected = [tokenizer.apply_chat_template(c["messages"], tokenize=False,
                                              add_generation_prompt=c.get("add_generation_prompt", False))
                for c in conversations]
    assert rendered == expected
    assert rendered[0].startswith("<s><tool>system") and "</s>" in rendered[0]
    plain = tmp_path / "plain.gguf"
    write_spm_gguf(plain)
    run = subprocess.run([HSX, "chat-template", "--model", str(plain), "--input", str(lines)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "no chat template" in run.stderr, run.stderr
