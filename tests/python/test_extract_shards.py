"""hsx extract split across processes (--shard i/n, or a launcher's environment) and
joined by `hsx manifest merge`: the shards' files are one process's, byte for byte, the
merged manifest is its manifest, a killed shard resumes, and bad specs fail before any
output exists. --batch-invariant makes a prompt's bits independent of its batch, so
files from different batchings can be compared exactly."""
import json
import os
import signal
import subprocess
import time

import numpy as np

from conftest import HSX, MODEL

TIMEOUT = 300


def write_prompts(path, n, seed=0):
    rng = np.random.default_rng(seed)
    prompts = {f"q{i}": rng.integers(0, 512, int(rng.integers(8, 60))).tolist() for i in range(n)}
    with open(path, "w") as f:
        for pid, ids in prompts.items():
            f.write(json.dumps({"id": pid, "token_ids": ids}) + "\n")
    return prompts


def extract_cmd(prompts, out, *extra):
    return [HSX, "extract", "--model", str(MODEL), "--layers", "0,2,4", "--input", str(prompts), "--output", str(out),
            "--batch-invariant", "--writer-threads", "1", *extra]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
           and not k.startswith("OMPI_COMM_WORLD")}
    env.update(extra)
    return env


def run(cmd, **kw):
    kw.setdefault("env", clean_env())
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, **kw)


def manifest_entries(path):
    """(id, file name, num_tokens) per line: paths differ by directory only."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted((e["id"], os.path.basename(e["path"]), e["num_tokens"]) for e in entries)


def state_files(out):
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name.endswith(".safetensors")}


def assert_same_as(out, ref):
    assert state_files(out) == state_files(ref)  # names and bytes
    assert manifest_entries(out / "manifest.jsonl") == manifest_entries(ref / "manifest.jsonl")
    assert not [p for p in out.iterdir() if ".tmp." in p.name]


def test_two_shards_equal_one_process_and_merge(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    ref = tmp_path / "ref"
    r = run(extract_cmd(tmp_path / "p.jsonl", ref))
    assert r.returncode == 0, r.stderr
    assert len(state_files(ref)) == len(prompts)

    out = tmp_path / "out"
    # One by the flag, one by OpenMPI's environment, at the same time, into one directory.
    procs = [subprocess.Popen(extract_cmd(tmp_path / "p.jsonl", out, "--shard", "0/2"), env=clean_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
             subprocess.Popen(extract_cmd(tmp_path / "p.jsonl", out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=clean_env(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2"))]
    for p in procs:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
    shard_ids = [{e[0] for e in manifest_entries(out / f"manifest.shard-0000{i}-of-00002.jsonl")} for i in range(2)]
    assert shard_ids[0] and shard_ids[1], "one shard did everything"
    assert not shard_ids[0] & shard_ids[1]
    assert shard_ids[0] | shard_ids[1] == set(prompts)
    assert not (out / "manifest.jsonl").exists()

    r = run([HSX, "manifest", "merge", str(out)])
    assert r.returncode == 0, r.stderr
    assert "16 files of 2 shards" in r.stderr
    assert_same_as(out, ref)


def test_resume_after_killing_one_shard(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 40, seed=1)
    ref = tmp_path / "ref"
    assert run(extract_cmd(tmp_path / "p.jsonl", ref)).returncode == 0
    out = tmp_path / "out"
    slow = ("--max-num-seqs", "1", "--max-num-batched-tokens", "16")  # many small steps: time to kill it mid-run
    assert run(extract_cmd(tmp_path / "p.jsonl", out, "--shard", "0/2")).returncode == 0
    victim = subprocess.Popen(extract_cmd(tmp_path / "p.jsonl", out, "--shard", "1/2", *slow), env=clean_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = out / "manifest.shard-00001-of-00002.jsonl"
    deadline = time.time() + TIMEOUT
    while not (manifest.exists() and manifest.read_text().count("\n") >= 2) and time.time() < deadline:
        time.sleep(0.01)
    assert victim.poll() is None, "the shard finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=TIMEOUT)
    done_before = manifest.read_text().count("\n")

    r = run([HSX, "manifest", "merge", str(out)])
    assert r.returncode == 1
    assert "shard(s) 1 of 2 did not finish (no shard-00001-of-00002.done" in r.stderr, r.stderr
    assert not (out / "manifest.jsonl").exists()

    r = run(extract_cmd(tmp_path / "p.jsonl", out, "--shard", "1/2"))
    assert r.returncode == 0, r.stderr
    assert f"skipped {done_before} already in the manifest" in r.stderr, r.stderr
    assert run([HSX, "manifest", "merge", str(out)]).returncode == 0
    assert_same_as(out, ref)
    assert len(state_files(out)) == len(prompts)


def test_bad_shard_specs_fail_before_any_output(tmp_path):
    write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "out"
    cases = [
        (["--shard", "2/2"], {}, "--shard '2/2': shard index 2 is not below the shard count 2"),
        (["--shard", "1-2"], {}, "--shard '1-2': expected i/n"),
        (["--shard", "0/0"], {}, "the shard count must be at least 1"),
        ([], {"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ([], {"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID/SLURM_NTASKS = 3/2 is not a rank below a size"),
        ([], {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RANK": "1", "WORLD_SIZE": "2"},
         "the launchers disagree: SLURM_PROCID/SLURM_NTASKS = 0/2 but RANK/WORLD_SIZE = 1/2"),
    ]
    for flags, env, message in cases:
        r = run(extract_cmd(tmp_path / "p.jsonl", out, *flags), env=clean_env(**env))
        assert r.returncode != 0, flags
        assert message in r.stderr, (flags, env, r.stderr)
        assert not out.exists(), (flags, env)


def test_a_launcher_of_one_process_and_a_shard_rerun_with_other_settings(tmp_path):
    write_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "out"
    r = run(extract_cmd(tmp_path / "p.jsonl", out), env=clean_env(RANK="0", WORLD_SIZE="1"))
    assert r.returncode == 0, r.stderr
    assert (out / "manifest.jsonl").exists()  # unsharded
    other = tmp_path / "other"
    assert run(extract_cmd(tmp_path / "p.jsonl", other, "--shard", "0/2")).returncode == 0
    r = run([HSX, "extract", "--model", str(MODEL), "--layers", "0,2", "--input", str(tmp_path / "p.jsonl"),
             "--output", str(other), "--shard", "0/2"])
    assert r.returncode == 1
    assert "shard-00000-of-00002.json: this shard ran before with layers = [0,2,4], now [0,2]" in r.stderr, r.stderr
    r = run([HSX, "manifest", "merge", str(other)])
    assert r.returncode == 1
    assert "shard(s) 1 of 2 have no manifest" in r.stderr, r.stderr


def test_shards_that_own_no_line_still_merge(tmp_path):
    write_prompts(tmp_path / "p.jsonl", 1)
    out = tmp_path / "out"
    for i in range(4):  # one prompt, four shards: three own nothing
        r = run(extract_cmd(tmp_path / "p.jsonl", out, "--shard", f"{i}/4"))
        assert r.returncode == 0, r.stderr
    r = run([HSX, "manifest", "merge", str(out)])
    assert r.returncode == 0, r.stderr
    assert "1 files of 4 shards" in r.stderr
