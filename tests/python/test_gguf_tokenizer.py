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


def write_spm_gguf(path):
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
