"""`hsx bench --decode --input`: the serve-in-the-loop evaluation of a draft on real prompts.
Its acceptance figures must be the engine's own counts for exactly the file's prompts
(the warm-up left out), the same that `hsx serve` reports on /metrics for the same
requests, and its output tokens those of `hsx generate` (end-of-sequence honoured)."""
import json
import re
import subprocess
import urllib.request

from conftest import HSX, ROOT, read_safetensors
from test_server_speculative import DRAFT, MODEL, PlainServer, streamed_tokens

SPEC = {"method": "eagle3", "model": str(DRAFT), "num_speculative_tokens": 3}
NEW_TOKENS = 24  # streamed_tokens' max_tokens


def prompts_file(tmp_path):
    golden = read_safetensors(MODEL / "golden.safetensors")
    prompts = [[int(t) for t in golden[f"prompt_{k}"]] for k in range(3)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": "same", "token_ids": p}) + "\n" for p in prompts))  # ids may repeat
    return prompts, path


def bench(path, *extra, model=MODEL):
    out = subprocess.run([HSX, "bench", "--decode", "--model", str(model), "--input", str(path), "--batch-invariant",
                          "--new-tokens", str(NEW_TOKENS), *extra], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if '"decode_tokens_per_s"' in line]


def metric(text, name):
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))


def test_acceptance_is_the_servers_for_the_same_prompts(tmp_path):
    prompts, path = prompts_file(tmp_path)
    rows = bench(path, "--batch-sizes", "1,3", "--ignore-eos", "--speculative-config", json.dumps(SPEC))
    assert [r["batch"] for r in rows] == [1, 3]
    server = PlainServer(tmp_path, "--speculative-config", json.dumps(SPEC))
    try:
        for p in prompts:
            assert len(streamed_tokens(server.url, p)) == NEW_TOKENS
        text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    finally:
        server.stop()
    drafts = metric(text, "vllm:spec_decode_num_drafts_total")
    accepted = metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    per_pos = [metric(text, f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}') for i in range(3)]
    assert accepted > 0  # llama_copy's drafts are accepted: the comparison below has something to compare
    for r in rows:
        assert r["prompts"] == 3 and r["output_tokens"] == 3 * NEW_TOKENS
        # --batch-invariant: the same tokens at either batch size, so the same drafts and acceptances
        assert r["verifications"] == drafts
        assert r["accepted_tokens"] == accepted
        assert abs(r["mean_acceptance_length"] - (1 + accepted / drafts)) < 1e-9
        assert all(abs(a - b / drafts) < 1e-9 for a, b in zip(r["acceptance_rate_per_position"], per_pos, strict=True))


def test_output_tokens_are_generates_and_end_at_eos(tmp_path):
    prompts, path = prompts_file(tmp_path)
    unique = tmp_path / "unique.jsonl"  # generate wants distinct ids
    unique.write_text("".join(json.dumps({"id": str(k), "token_ids": p}) + "\n" for k, p in enumerate(prompts)))

    def generate(model):
        out = subprocess.run([HSX, "generate", "--model", str(model), "--input", str(unique), "--batch-invariant",
                              "--max-tokens", str(NEW_TOKENS)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return {r["id"]: r["token_ids"] for r in map(json.loads, out.stdout.splitlines())}

    # The random fixture never emits its end-of-sequence id within NEW_TOKENS: a copy of it
    # whose generation_config makes prompt 1's 5th new token one, so that a request ends early.
    eos = generate(MODEL)["1"][4]
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model / name).symlink_to(MODEL / name)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    lengths = {k: len(v) for k, v in generate(model).items()}
    assert lengths["1"] <= 5 and sum(lengths.values()) < 3 * NEW_TOKENS
    (row,) = bench(path, "--batch-sizes", "2", model=model)
    assert row["output_tokens"] == sum(lengths.values()) and row["prompts"] == 3
    assert "mean_acceptance_length" not in row  # no draft, no acceptance figures
    (row,) = bench(path, "--batch-sizes", "2", "--ignore-eos", model=model)
    assert row["output_tokens"] == 3 * NEW_TOKENS


def test_bad_input_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "token_ids": [1, 2, 3]}\n{"id": "b", "token_ids": "nope"}\n')
    out = subprocess.run([HSX, "bench", "--decode", "--model", str(MODEL), "--input", str(path), "--batch-sizes", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "bad.jsonl" in out.stderr and ":2" in out.stderr, out.stderr
    out = subprocess.run([HSX, "bench", "--model", str(MODEL), "--input", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "--decode" in out.stderr
