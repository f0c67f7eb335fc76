"""bench/speculative_ratios.py: each speculative run against the mean of the plain runs at
its batch, for the decode phase and end to end, from bench --decode's JSON lines."""
import json
import subprocess
import sys

from conftest import ROOT


def run(tmp_path, lines):
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json: a log line\n")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "speculative_ratios.py"), str(path)],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_ratios_against_the_mean_of_the_plain_runs_at_each_batch(tmp_path):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "draft_length": "adaptive"})
    lines = [
        {"batch": 1, "value": 200.0, "end_to_end_tokens_per_s": 100.0},
        {"batch": 32, "value": 5000.0, "end_to_end_tokens_per_s": 2000.0},
        {"batch": 32, "value": 4500.0, "speculative_config": spec, "mean_acceptance_length": 1.5,
         "end_to_end_tokens_per_s": 1900.0, "draft_length": {"request_steps_by_k": [10, 0, 0, 2]}},
        {"batch": 1, "value": 210.0, "speculative_config": spec},
        {"batch": 32, "value": 4000.0, "end_to_end_tokens_per_s": 1800.0},
        {"batch": 128, "value": 9.0, "speculative_config": spec},  # no plain run there: left out
    ]
    rows = run(tmp_path, lines)
    assert [r["batch"] for r in rows] == [32, 1]
    b32, b1 = rows
    assert b32["plain_runs"] == [5000.0, 4000.0]
    assert abs(b32["x_plain"] - 1.0) < 1e-12
    assert abs(b32["x_plain_end_to_end"] - 1.0) < 1e-12
    assert b32["request_steps_by_k"] == [10, 0, 0, 2]
    assert b32["speculative_config"]["method"] == "ngram"
    assert abs(b1["x_plain"] - 1.05) < 1e-12
    assert "x_plain_end_to_end" not in b1  # the speculative run printed none
