"""hsx's tokenizer against Hugging Face `tokenizers` on an adversarial corpus, for tokenizers in
the styles of Llama 3, Qwen 3, SmolLM2, Gemma and Mistral, one tokenizer per supported
normalizer / pre-tokenizer / post-processor variant, and the fixture tokenizers.

Encoding is compared with and without special tokens; decoding on random id sequences (which
cut characters apart, so invalid UTF-8 must become U+FFFD exactly as HF makes it).
"""
import json
import pathlib

import pytest

tokenizers = pytest.importorskip("tokenizers")

import tokenizer_corpus  # noqa: E402
from tokenizer_corpus import (build_tokenizers, compare, describe,  # noqa: E402
                              generate_corpus, special_strings)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "data" / "tokenizers"
CORPUS_SIZE = 2000
# Each component variant sees the first VARIANT_CORPUS strings: the edge cases, then a random
# mix; the family styles see all of them. Together this runs in CI's minute on 2 cores.
VARIANT_CORPUS = 600


@pytest.fixture(scope="module")
def built():
    configs = build_tokenizers()
    fixtures = {p.name: json.loads((p / "tokenizer.json").read_text())
                for p in sorted(FIXTURES.iterdir()) if (p / "tokenizer.json").exists()}
    corpus = generate_corpus(special_strings(list(configs.values()) + list(fixtures.values())),
                             count=CORPUS_SIZE)
    return configs, corpus


def test_generated_corpus_is_adversarial(built):
    _, corpus = built
    assert len(corpus) == CORPUS_SIZE
    joined = "".join(corpus)
    for needle in ["\u200d", "\U0001f3fd", "\r\n", "\u00a0", "\u3000", "\u0301",
                   "<|im_start|>", "<bos>", "\x00", "\x1b"]:
        assert needle in joined, needle
    for script in [tokenizer_corpus.HANGUL, tokenizer_corpus.CJK, tokenizer_corpus.THAI,
                   tokenizer_corpus.DEVANAGARI, tokenizer_corpus.ARABIC]:
        assert any(c in joined for c in script), script[:10]


def test_built_tokenizers_match_hugging_face(built, tmp_path):
    configs, corpus = built
    report, failures = [], []
    for name, config in configs.items():
        path = tmp_path / name / "tokenizer.json"
        path.parent.mkdir()
        path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
        family = name in tokenizer_corpus.FAMILIES
        cases, mismatches = compare(path, corpus if family else corpus[:VARIANT_CORPUS],
                                    path.parent, seed=len(name),
                                    decode_cases=300 if family else 100)
        report.append(f"{name}: {cases - len(mismatches)}/{cases}")
        if mismatches:
            failures.append(f"{name}: {len(mismatches)} of {cases} differ\n{describe(mismatches)}")
    print("\n".join(report))
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("name", ["bpe_llama3", "bpe_qwen2", "spm_bpe"])
def test_fixture_tokenizers_match_hugging_face(built, tmp_path, name):
    _, corpus = built
    cases, mismatches = compare(FIXTURES / name / "tokenizer.json", corpus, tmp_path, seed=7)
    print(f"{name}: {cases - len(mismatches)}/{cases}")
    assert not mismatches, f"{len(mismatches)} of {cases} differ\n{describe(mismatches)}"
