"""The loop at toy scale, on CPU (issue 37, item 4): hsx regenerates and extracts a target's
states in speculators' file format, speculators' own trainer trains an EAGLE-3 draft on them
for a few steps, and hsx serves the checkpoint speculators wrote, losslessly. It catches
format drift between speculators and hsx: the states' layout and names, the checkpoint's
config and tensors (reduced draft vocabulary with d2t/t2d, norms, aux layer ids).

Data: the session fixtures of toy_target.py (regenerate-responses through `hsx serve`,
prepare-data, `hsx extract --layers 1,2,3,4` to hs_<row>.safetensors), as
bench/loop/device.sh does on the device with SmolLM2."""
import json
import re
import shutil
import subprocess

import pytest

from conftest import HSX
from toy_target import (AUX, chat_ids, hsx, hsx_states, latest_checkpoint, prepared, python,  # noqa: F401
                        read_jsonl, regenerated, toy, train_args, write_jsonl)

K = 3


@pytest.fixture(scope="module")
def draft(toy, prepared, hsx_states):
    """The checkpoint speculators' trainer writes after 4 steps on hsx's states."""
    save = toy.tmp / "ckpt_offline"
    python(*train_args(toy.target, prepared.path, save, 4), "--hidden-states-path", hsx_states)
    return latest_checkpoint(save)


@pytest.fixture(scope="module")
def prompts(toy, tmp_path_factory):
    """Every conversation's first question, rendered by transformers with the generation prompt."""
    rows = [{"id": c["id"], "token_ids": chat_ids(toy.target, c["conversations"][:1], True)}
            for c in read_jsonl(toy.data)]
    return write_jsonl(tmp_path_factory.mktemp("loop") / "prompts.jsonl", rows)


def spec(model):
    return json.dumps({"method": "eagle3", "model": str(model), "num_speculative_tokens": K})


def generate(toy, prompts, *extra):
    """`hsx generate --batch-invariant`: greedy tokens by id, and the run's stderr."""
    run = hsx("generate", "--model", toy.target, "--batch-invariant", "--input", prompts, "--max-tokens", 40,
              "--ignore-eos", *extra)
    return {r["id"]: r["token_ids"] for r in map(json.loads, run.stdout.splitlines())}, run.stderr


def test_checkpoint_is_speculators_eagle3_with_a_reduced_vocab(draft):
    config = json.loads((draft / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3DraftModel"]
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX
    assert config["draft_vocab_size"] == 1000 and config["transformer_layer_config"]["vocab_size"] == 3000
    header = (draft / "model.safetensors").read_bytes()
    assert b'"d2t"' in header[:4096] and b'"t2d"' in header[:4096]  # the reduced-vocab mapping hsx applies


def test_hsx_serves_the_trained_draft_losslessly(toy, prompts, draft):
    plain, _ = generate(toy, prompts)
    drafted, log = generate(toy, prompts, "--speculative-config", spec(draft))
    assert drafted == plain  # greedy output identical to plain decode, token for token
    m = re.search(r"accepted (\d+) of (\d+) drafts", log)
    assert m, log
    accepted, proposed = int(m[1]), int(m[2])
    # Every verification step drafts K tokens: 18 prompts, 40 tokens each, at least 40/(K+1)
    # steps a prompt, all of them drafting.
    assert proposed >= 18 * K * 40 // (K + 1), log
    assert 0 <= accepted <= proposed


@pytest.mark.parametrize("damage", ["truncated_weights", "layer_ids"])
def test_a_damaged_checkpoint_is_refused(toy, prompts, draft, tmp_path, damage):
    bad = tmp_path / "draft"
    shutil.copytree(draft, bad)
    if damage == "truncated_weights":
        weights = bad / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
        expect = r"model\.safetensors.*(truncated|out of range)"
    else:  # aux layer ids that do not match the fc weight speculators trained
        config = json.loads((bad / "config.json").read_text())
        config["eagle_aux_hidden_state_layer_ids"] = AUX[:2]
        (bad / "config.json").write_text(json.dumps(config))
        expect = r"fc\.weight.*shape"
    run = subprocess.run([HSX, "generate", "--model", str(toy.target), "--input", str(prompts), "--max-tokens", "4",
                          "--speculative-config", spec(bad)], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and run.stdout == ""
    assert re.search(expect, run.stderr), run.stderr
