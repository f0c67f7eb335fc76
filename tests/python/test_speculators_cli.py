"""speculators 0.9's own command lines against `hsx serve` (issue 35), on the toy target
(tests/python/toy_target.py): prepare-data with --render-endpoint, regenerate-responses,
generate-offline-data --validate-outputs and online training (speculators.train
--vllm-endpoint, a few steps on CPU through speculators_train_cpu.py), with the file backend
and with the Mooncake backend (issue 34: a `mooncake_master`, hsx putting into the store,
the trainer reading from it). Each step's output is checked by value: token ids against
transformers' render of the same conversations and against `hsx generate`, state files and
the samples the trainer read from Mooncake against `hsx extract`.

test_speculators_pipeline.py drives the same clients' functions without torch; these run the
real CLIs, which import torch (scripts/test.sh installs it into HSX_TORCH_SITE)."""
import json
import pathlib
import re

import numpy as np
import pytest

from conftest import MooncakeServer
from safetensors_numpy import read_safetensors
from toy_target import (LAYERS, chat_ids, dataset_rows, hsx, hsx_states, latest_checkpoint, prepared, python,  # noqa: F401
                        read_jsonl, regenerated, toy, train_args, write_jsonl)

transformers = pytest.importorskip("transformers")


def expected_boundary_rows(target, conversation):
    """The rows prepare-data derives from one conversation, by the rule speculators states
    (one per assistant turn: the generation-prompt render of its context is the masked
    prefix of the full render), with transformers rendering."""
    rows = []
    for j, turn in enumerate(conversation):
        if turn["role"] != "assistant" or j == 0:
            continue
        prompt = chat_ids(target, conversation[:j], True)
        full = chat_ids(target, conversation[:j + 1], False)
        assert full[:len(prompt)] == prompt
        rows.append((tuple(full), tuple([0] * len(prompt) + [1] * (len(full) - len(prompt)))))
    return rows


def test_prepare_data_with_render_endpoint(toy):
    out = toy.tmp / "prepared_render"
    python("-m", "speculators", "prepare-data", "--model", toy.target, "--data", toy.data, "--output", out,
           "--render-endpoint", toy.url, "--seq-length", 512, "--num-preprocessing-workers", 1)
    rows = dataset_rows(out)
    expected = [r for c in read_jsonl(toy.data) for r in expected_boundary_rows(toy.target, c["conversations"])]
    assert len(expected) == 24  # 18 conversations, 6 of them with a second answer
    got = sorted((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in rows)
    assert got == sorted(expected)
    # The supervised tokens are the answers' text and end-of-turn, nothing of the prompt.
    tok = transformers.AutoTokenizer.from_pretrained(str(toy.target))
    answers = {t["content"] + "<|im_end|>\n" for c in read_jsonl(toy.data) for t in c["conversations"]
               if t["role"] == "assistant"}
    for ids, mask in got:
        assert tok.decode([i for i, m in zip(ids, mask) if m]) in answers


def test_regenerate_responses(toy, regenerated, tmp_path):
    """Greedy regeneration through the chat endpoint with return_token_ids: one boundary row
    per conversation (speculators ends a conversation once prompt + completion pass
    --max-tokens, and the toy target never ends a turn early, so the second questions are
    not reached); its prompt is transformers' render of the first question, its completion
    what `hsx generate` answers greedily, its mask the boundary between them."""
    conversations = {c["id"]: c["conversations"] for c in read_jsonl(toy.data)}
    assert sorted(r["id"] for r in regenerated) == sorted(f"{k}_gen0" for k in conversations)
    prompts = []
    for row in regenerated:
        boundary = row["loss_mask"].index(1)
        assert row["loss_mask"] == [0] * boundary + [1] * (len(row["input_ids"]) - boundary)
        first_question = conversations[row["primary_id"]][:1]
        assert row["input_ids"][:boundary] == chat_ids(toy.target, first_question, True), row["id"]
        prompts.append({"id": row["id"], "token_ids": row["input_ids"][:boundary],
                        "completion": row["input_ids"][boundary:]})
    lines = write_jsonl(tmp_path / "prompts.jsonl", [{"id": p["id"], "token_ids": p["token_ids"]} for p in prompts])
    greedy = {r["id"]: r["token_ids"] for r in read_jsonl_text(
        hsx("generate", "--model", toy.target, "--batch-invariant", "--input", lines, "--max-tokens", 24).stdout)}
    for p in prompts:
        assert p["completion"] == greedy[p["id"]], p["id"]


def read_jsonl_text(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_generate_offline_data_validates_and_equals_extract(toy, prepared, hsx_states):
    out = toy.tmp / "offline_states"
    run = python("-m", "speculators", "generate-offline-data", "--model", toy.target, "--endpoint", toy.url + "/v1",
                 "--preprocessed-data", prepared.path, "--output", out, "--validate-outputs", "--fail-on-error",
                 "--concurrency", 4)
    files = sorted(out.glob("hs_*.safetensors"), key=lambda p: int(p.stem[3:]))
    assert len(files) == len(prepared.rows), run.stderr[-3000:]
    for r, path in enumerate(files):
        assert path.name == f"hs_{r}.safetensors"
        served = read_safetensors(path)
        extracted = read_safetensors(hsx_states / path.name)
        assert served["token_ids"].tolist() == prepared.rows[r]["input_ids"]
        assert served["hidden_states"].shape == (len(prepared.rows[r]["input_ids"]), len(LAYERS), 64)
        assert np.array_equal(served["hidden_states"], extracted["hidden_states"]), path.name  # --batch-invariant
        assert np.isfinite(served["hidden_states"]).all()


def test_online_training_against_the_server(toy, prepared):
    """speculators.train --vllm-endpoint: the trainer asks the server for each sample's
    states while it trains (on_missing=generate). A failed round trip only drops the
    sample, and the run still exits 0, so the log must show every sample arrived."""
    save = toy.tmp / "ckpt_online"
    states = toy.tmp / "online_states"
    states.mkdir()
    run = python(*train_args(toy.target, prepared.path, save, 3), "--hidden-states-path", states,
                 "--vllm-endpoint", toy.url + "/v1", "--max-consecutive-generation-failures", 1)
    log = run.stdout + run.stderr
    assert "round trip failed" not in log, log[-4000:]
    steps = re.findall(r"train/error_records=([0-9.e+-]+)", log)
    assert len(steps) >= 2 and all(float(s) == 0 for s in steps), log[-4000:]  # one epoch: 2 steps
    losses = [float(x) for x in re.findall(r"train/loss=([0-9.e+-]+)", log)]
    assert len(losses) == len(steps) and all(np.isfinite(losses)) and min(losses) > 0, losses
    ckpt = latest_checkpoint(save)
    assert json.loads((ckpt / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == LAYERS[:-1]


def test_online_training_over_mooncake_reads_what_hsx_computed(toy, prepared, hsx_states, master, monkeypatch):
    """speculators.train --vllm-endpoint --hidden-states-backend mooncake against `hsx serve`
    with hs_connectors' Mooncake kv-transfer config: hsx puts each request's states into the
    store, the trainer's MooncakeTransfer reads them (then deletes them) and trains on them.
    speculators_train_recorded.py saves every sample the transfer handed the loader: each
    must equal, value for value, `hsx extract`'s file of the same row (--batch-invariant),
    and each row (training and validation) must have been read once."""
    pytest.importorskip("mooncake.store", reason="Mooncake's wheel (scripts/test.sh installs it)")
    save = toy.tmp / "ckpt_mooncake"
    record = toy.tmp / "mooncake_samples"
    record.mkdir()
    monkeypatch.setenv("HSX_RECORD_DIR", str(record))
    # Served under its path, as the trainer names the model by --verifier-name-or-path.
    server = MooncakeServer(toy.tmp, master, "--batch-invariant", model=toy.target, layers=LAYERS,
                            served_model_name=None)
    try:
        args = train_args(toy.target, prepared.path, save, 3)
        args[0] = pathlib.Path(__file__).with_name("speculators_train_recorded.py")
        # A small segment and buffer for the trainer's own Mooncake client (4 and 2 GiB by default).
        run = python(*args, "--hidden-states-backend", "mooncake", "--mooncake-master", master,
                     "--mooncake-global-segment-gib", 0.0625, "--mooncake-local-buffer-gib", 0.0625,
                     "--vllm-endpoint", server.url + "/v1", "--max-consecutive-generation-failures", 1)
    finally:
        server.stop()
    log = run.stdout + run.stderr
    assert "round trip failed" not in log, log[-4000:]
    steps = re.findall(r"train/error_records=([0-9.e+-]+)", log)
    assert len(steps) >= 2 and all(float(s) == 0 for s in steps), log[-4000:]
    losses = [float(x) for x in re.findall(r"train/loss=([0-9.e+-]+)", log)]
    assert len(losses) == len(steps) and all(np.isfinite(losses)) and min(losses) > 0, losses
    rows = {tuple(r["input_ids"]): i for i, r in enumerate(prepared.rows)}
    samples = sorted(record.glob("*.safetensors"), key=lambda p: int(p.stem))
    read = []
    for path in samples:
        params = json.loads(path.with_suffix(".json").read_text())
        assert params["version"] == 1 and params["handle"].startswith("cmpl-"), params
        got = read_safetensors(path)
        r = rows[tuple(got["token_ids"].tolist())]
        expected = read_safetensors(hsx_states / f"hs_{r}.safetensors")
        assert set(got) == set(expected), (path.name, set(got))
        for name in expected:
            assert got[name].dtype == expected[name].dtype and np.array_equal(got[name], expected[name]), (r, name)
        read.append(r)
    assert len({json.loads(p.with_suffix(".json").read_text())["handle"] for p in samples}) == len(samples)
    # One epoch and its validation: every row asked for and read once, none lost or repeated.
    assert sorted(read) == list(range(len(prepared.rows))), read
