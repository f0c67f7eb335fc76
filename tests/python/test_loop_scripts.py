"""bench/loop's CPU-side pieces: the Debian description parser, the pre-tokenized rows
speculators' prepare-data takes, the summary of a serve run, and serve_bench against the
CPU binary (n-gram drafts on the fixture model, lossless against plain decode)."""
import importlib.util
import json
import subprocess
import sys

from conftest import HSX, ROOT

LOOP = ROOT / "bench" / "loop"


def load(name):
    spec = importlib.util.spec_from_file_location(f"loop_{name}", LOOP / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRANSLATION = """Package: foo
Description-md5: 1
Description-en: frobnicates widgets
 Foo frobnicates widgets of every size, quickly and with care, using the
 frobnication algorithm its authors invented for the purpose.
 .
 This package contains the command-line tool.

Package: foo-doc
Description-md5: 1
Description-en: frobnicates widgets
 (the same description: skipped)

Package: tiny
Description-md5: 2
Description-en: too short
 Short.
"""


def test_debian_records_dedupe_and_paragraphs(tmp_path):
    path = tmp_path / "Translation-en"
    path.write_text(TRANSLATION)
    records = list(load("make_data").debian_records(path))
    assert records == [("foo", "frobnicates widgets",
                        "Foo frobnicates widgets of every size, quickly and with care, using the frobnication "
                        "algorithm its authors invented for the purpose.\n\nThis package contains the command-line tool.")]


def test_pretok_masks_the_answer(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"id": "a", "token_ids": [1, 2, 3]}\n{"id": "b", "token_ids": [4]}\n')
    (tmp_path / "g.jsonl").write_text('{"id": "a", "token_ids": [7, 8], "text": "x"}\n')
    load("build_sets").pretok(tmp_path / "p.jsonl", tmp_path / "g.jsonl", tmp_path / "o.jsonl")
    rows = [json.loads(line) for line in open(tmp_path / "o.jsonl")]
    assert rows == [{"input_ids": [1, 2, 3, 7, 8], "loss_mask": [0, 0, 0, 1, 1]}]


def test_serve_bench_ngram_is_lossless_and_summarized(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [5 + i, 6, 7, 5 + i, 6, 7, 5 + i, 6]}) + "\n"
                               for i in range(4)))
    out = tmp_path / "out"
    model = str(ROOT / "tests" / "data" / "models" / "qwen3")
    for label, spec in (("plain", ""), ("ngram", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}')):
        lines = subprocess.run(
            [sys.executable, str(LOOP / "serve_bench.py"), "--hsx", HSX, "--model", model, "--device", "cpu",
             "--prompts", str(prompts), "--label", label, "--spec", spec, "--runs", "32:4,1:4", "--max-tokens", "12",
             "--outputs", str(out / "outputs"), "--log", str(tmp_path / "serve.log")],
            check=True, capture_output=True, text=True, timeout=300).stdout
        with open(out / "serve.jsonl", "a") as f:
            f.write(lines)
    runs = [json.loads(line) for line in open(out / "serve.jsonl")]
    assert [(r["label"], r["clients"], r["completed"]) for r in runs] == [
        ("plain", 32, 4), ("plain", 1, 4), ("ngram", 32, 4), ("ngram", 1, 4)]
    assert all("mean_acceptance_length" in r for r in runs if r["label"] == "ngram")
    for clients in (1, 32):  # greedy on the f32 CPU path: the same tokens with drafts
        plain = open(out / "outputs" / f"plain_c{clients}.jsonl").read()
        assert open(out / "outputs" / f"ngram_c{clients}.jsonl").read() == plain
    summary = subprocess.run([sys.executable, str(LOOP / "summarize.py"), str(out)], check=True,
                             capture_output=True, text=True).stdout
    assert "ngram" in summary and "4/4" in summary
