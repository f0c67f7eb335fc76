"""bench/make_dummy_mtp.py writes a Gemma 4 assistant that hsx loads and drafts with: at the MTP
fixture's shape its tensors are the fixture assistant's (less the centroid head's), greedy
generation with it gives the plain tokens, and `hsx bench --decode` runs it against a dummy
target of gemma-4-31b's layout (k = v full layers with their own KV-head count and head_dim)."""
import json
import subprocess
import sys

from conftest import HSX, ROOT, read_safetensors

SCRIPT = ROOT / "bench" / "make_dummy_mtp.py"
FIXTURE = ROOT / "tests" / "data" / "mtp"
# The fixture target (tests/data/mtp/gemma4_target) and the fixture assistant's own shape.
FIXTURE_SHAPE = ["--backbone-hidden", "64", "--vocab", "512", "--head-dim", "16", "--kv-heads", "2",
                 "--global-head-dim", "32", "--global-kv-heads", "0", "--sliding-window", "16",
                 "--max-position", "4096", "--hidden", "32", "--intermediate", "96", "--heads", "2",
                 "--layer-types", "sliding,full"]


def make(out, *args):
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def hsx(*args):
    done = subprocess.run([HSX, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def test_tensors_are_the_fixture_assistants_without_the_centroid_head(tmp_path):
    report = make(tmp_path / "a", *FIXTURE_SHAPE)
    ours = read_safetensors(tmp_path / "a" / "model.safetensors")
    theirs = read_safetensors(FIXTURE / "gemma4_assistant" / "model.safetensors")
    expected = {k: v.shape for k, v in theirs.items() if not k.startswith("masked_embedding.")}
    assert {k: v.shape for k, v in ours.items()} == expected
    assert report["params"] == sum(v.size for v in ours.values())
    assert all((ours[k] == 1).all() for k in ours if k.endswith("norm.weight") or k.endswith("layer_scalar"))
    assert 0.01 < ours["model.embed_tokens.weight"].std() < 0.03
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["use_ordered_embeddings"] is False and config["model_type"] == "gemma4_assistant"


def test_greedy_tokens_with_the_drafts_are_the_plain_ones(tmp_path):
    make(tmp_path / "a", *FIXTURE_SHAPE)
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": f"p{k}", "token_ids": [(37 * k + 11 * i) % 509 + 3 for i in range(9 + 7 * k)]} for k in range(3)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["generate", "--device", "cpu", "--model", str(FIXTURE / "gemma4_target"), "--input", str(prompts),
              "--max-tokens", "20", "--ignore-eos", "--kv-cache-gib", "0.05"]
    plain = sorted(hsx(*common).stdout.splitlines())
    spec = {"method": "mtp", "model": str(tmp_path / "a"), "num_speculative_tokens": 3}
    drafted = hsx(*common, "--speculative-config", json.dumps(spec))
    assert sorted(drafted.stdout.splitlines()) == plain and len(plain) == 3
    assert "speculative decoding accepted" in drafted.stderr and " of 0 drafts" not in drafted.stderr


def test_bench_decode_drafts_for_a_dummy_target_of_the_31b_layout(tmp_path):
    # gemma-4-31b's config (src/model/named_configs.cpp) scaled down: sliding layers 16-wide with
    # 2 KV heads, full layers (every 6th) 32-wide with 1 KV head and k = v.
    target = tmp_path / "target"
    target.mkdir()
    text = {
        "dtype": "bfloat16", "hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_global_key_value_heads": 1, "global_head_dim": 32,
        "attention_k_eq_v": True, "intermediate_size": 128, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "sliding_window": 16,
        "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "vocab_size": 512, "max_position_embeddings": 4096, "tie_word_embeddings": True, "eos_token_id": 1}
    (target / "config.json").write_text(json.dumps({"architectures": ["Gemma4ForConditionalGeneration"], "text_config": text}))
    make(tmp_path / "a", "--backbone-hidden", "64", "--vocab", "512", "--head-dim", "16", "--kv-heads", "2",
         "--global-head-dim", "32", "--global-kv-heads", "1", "--sliding-window", "16", "--max-position", "4096",
         "--hidden", "32", "--intermediate", "64", "--heads", "4", "--dtype", "f32")
    spec = {"method": "mtp", "model": str(tmp_path / "a"), "num_speculative_tokens": 4}
    out = hsx("bench", "--decode", "--device", "cpu", "--model", str(target), "--load-format", "dummy",
              "--prompt-len", "32", "--new-tokens", "16", "--kv-cache-gib", "0.05", "--batch-sizes", "1,2",
              "--speculative-config", json.dumps(spec), "--spec-bench-accept-rate", "1")
    lines = [json.loads(line) for line in out.stdout.splitlines() if '"batch"' in line]
    assert [r["batch"] for r in lines] == [1, 2]
    for r in lines:  # every draft forced through: K accepted per round
        assert r["draft_tokens"] > 0 and r["acceptance_rate_per_position"] == [1.0] * 4, r
        assert r["mean_acceptance_length"] == 5.0, r
