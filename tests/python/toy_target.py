"""The toy target that speculators' own CLIs and trainer run against (issue 35's CLI tests,
issue 37's toy loop), and the Python that runs them.

The target is the qwen3 fixture (tests/data/models/qwen3: 4 layers, hidden 64) grown to the
bpe_qwen2 tokenizer's 3000 ids, with real weights on disk (f32 safetensors) rather than
--load-format dummy: speculators' trainer reads the verifier's embed_tokens and lm_head from
the same directory hsx serves. ChatML template; <|im_end|> (id 2) is the end of a turn and
the model's eos.

speculators' CLIs import torch, which the rest of the suite does without: scripts/test.sh
installs torch and the trainer's dependencies into a separate site (HSX_TORCH_SITE), and the
tests run speculators in subprocesses with that site on PYTHONPATH. Without it the tests
skip, unless HSX_REQUIRE_TORCH=1 (CI sets it), where they fail."""
import importlib
import json
import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import HSX, MODEL, TOKENIZER, extraction_configs, free_port, wait_for_server
from safetensors_numpy import read_safetensors

VOCAB = 3000
CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LAYERS = [1, 2, 3, 4]  # EAGLE-3's three aux layers (speculators' --target-layer-ids) + the last layer
AUX = LAYERS[:-1]
TORCH_SITE = os.environ.get("HSX_TORCH_SITE", "")
CPU_TRAIN = pathlib.Path(__file__).with_name("speculators_train_cpu.py")


def build_target(path):
    """Writes the toy target's directory at `path` and returns it."""
    from safetensors.numpy import save_file
    path = pathlib.Path(path)
    path.mkdir(parents=True)
    config = json.loads((MODEL / "config.json").read_text())
    config.update(vocab_size=VOCAB, eos_token_id=2, bos_token_id=None, dtype="float32")
    (path / "config.json").write_text(json.dumps(config, indent=1))
    weights = read_safetensors(MODEL / "model.safetensors")
    rng = np.random.default_rng(37)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = weights[name]
        extra = rng.normal(0, float(w.std()), (VOCAB - w.shape[0], w.shape[1])).astype(np.float32)
        weights[name] = np.concatenate([w, extra])
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in weights.items()}, str(path / "model.safetensors"))
    (path / "tokenizer.json").write_text(TOKENIZER.read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "model_max_length": 4096}))
    (path / "chat_template.jinja").write_text(CHATML)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return path


def speculators_env():
    """The environment for speculators' CLIs: the torch site first on PYTHONPATH."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if TORCH_SITE:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (TORCH_SITE, env.get("PYTHONPATH")) if p)
    return env


def require_speculators_cli():
    """Skips (or, with HSX_REQUIRE_TORCH=1, fails) unless the packages speculators' CLIs
    import are there: torch, datasets and speculators. Only looked up, not imported (an
    import of torch takes many seconds); a broken install fails the CLI steps themselves."""
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; "
                            "sys.exit(' '.join(m for m in ('torch', 'datasets', 'speculators') if u.find_spec(m) is None) or None)"],
                           env=speculators_env(), capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        why = f"speculators' CLIs need torch and datasets (HSX_TORCH_SITE={TORCH_SITE!r}); missing: {probe.stderr.strip()}"
        if os.environ.get("HSX_REQUIRE_TORCH") == "1":
            pytest.fail(why)
        pytest.skip(why)


def python(*args, timeout=900):
    """`python3 ARGS` with the torch site (speculators' CLIs: `-m speculators ...`); the
    finished process, asserted to have succeeded, its output in the message."""
    cmd = [sys.executable, *map(str, args)]
    run = subprocess.run(cmd, env=speculators_env(), capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"{' '.join(cmd)}\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    return run


def hsx(*args, timeout=600):
    run = subprocess.run([HSX, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"hsx {' '.join(map(str, args))}: {run.stderr[-4000:]}"
    return run


def read_jsonl(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def write_jsonl(path, rows):
    pathlib.Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dataset_rows(path):
    """The rows of a dataset prepare-data saved (datasets' load_from_disk, in the torch site)."""
    run = python("-c", "import json, sys; from datasets import load_from_disk; "
                 "d = load_from_disk(sys.argv[1]).with_format(None); "
                 "print(json.dumps([{'input_ids': r['input_ids'], 'loss_mask': r['loss_mask']} for r in d]))", path)
    return json.loads(run.stdout.strip().splitlines()[-1])


def train_args(target, data, save, steps):
    """speculators' EAGLE-3 trainer as bench/loop/device.sh runs it, a few steps on CPU:
    the CPU shim (speculators_train_cpu.py), no dataloader workers, sdpa attention for the
    draft (speculators' default flex attention has no backward on CPU), the eager loss."""
    return [CPU_TRAIN, "--speculator-type", "eagle3", "--verifier-name-or-path", target, "--data-path", data,
            "--target-layer-ids", *AUX, "--draft-vocab-size", 1000, "--epochs", 1, "--max-steps", steps,
            "--total-seq-len", 512, "--train-data-ratio", 0.9, "--num-workers", 0, "--save-path", save,
            "--log-dir", f"{save}.logs", "--seed", 0, "--loss-implementation", "eager", "--draft-attn-impl", "sdpa"]


def latest_checkpoint(save):
    """The last epoch's checkpoint folder speculators wrote (SAVE/<epoch>)."""
    epochs = sorted(int(p.name) for p in pathlib.Path(save).iterdir() if p.name.isdigit())
    assert epochs, f"no checkpoint in {save}: {sorted(p.name for p in pathlib.Path(save).iterdir())}"
    return pathlib.Path(save) / str(epochs[-1])


# ---------------------------------------------------------------------------- data


def conversations():
    """Conversations of real text no one here wrote: the standard library's module docstrings.
    Each asks what a module is for and answers with its docstring's first paragraph; every
    third goes on for a second turn (the next paragraph)."""
    names = ["json", "csv", "heapq", "bisect", "shlex", "textwrap", "difflib", "fractions", "statistics",
             "zipfile", "tarfile", "gzip", "base64", "random", "calendar", "pprint", "argparse", "sched"]
    out = []
    for k, name in enumerate(names):
        paragraphs = [" ".join(p.split()) for p in (importlib.import_module(name).__doc__ or "").split("\n\n")]
        paragraphs = [p for p in paragraphs if p][:3] + [name, name]
        turns = [{"role": "user", "content": f"What is Python's {name} module for?"},
                 {"role": "assistant", "content": paragraphs[0]}]
        if k % 3 == 0:
            turns += [{"role": "user", "content": "Tell me more."}, {"role": "assistant", "content": paragraphs[1]}]
        out.append({"id": name, "conversations": turns})
    return out


def chat_ids(target, messages, add_generation_prompt):
    """transformers' apply_chat_template(tokenize=True) on the target: the reference render."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(target))
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


# ---------------------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def toy(tmp_path_factory):
    """The toy target served by `hsx serve` as speculators' generate-offline-data and online
    training expect vLLM: extraction on (layers LAYERS, files to `storage`), served under
    its path (speculators names the model by --verifier-name-or-path / --model), and
    --batch-invariant so its states equal `hsx extract`'s bit for bit."""
    require_speculators_cli()
    tmp = tmp_path_factory.mktemp("toy")
    target = build_target(tmp / "target")
    storage = tmp / "served_states"
    spec, kv = extraction_configs(storage, LAYERS)
    port = free_port()
    log_path = tmp / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([HSX, "serve", str(target), "--port", str(port), "--batch-invariant",
                             "--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for_server(url, proc, log_path)
    data = write_jsonl(tmp / "conversations.jsonl", conversations())
    yield types.SimpleNamespace(target=target, url=url, tmp=tmp, storage=storage, log_path=log_path, data=data)
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture(scope="session")
def regenerated(toy):
    """speculators' regenerate-responses against the server, greedy: its JSONL rows."""
    out = toy.tmp / "regenerated.jsonl"
    python("-m", "speculators", "regenerate-responses", "--endpoint", toy.url + "/v1/chat/completions",
           "--dataset", toy.data, "--max-tokens", 24, "--sampling-params", json.dumps({"temperature": 0}),
           "--concurrency", 4, "--max-retries", 0, "--outfile", out)
    return read_jsonl(out)


@pytest.fixture(scope="session")
def prepared(toy, regenerated):
    """prepare-data on the regenerated rows (pre-tokenized: no render), with the token
    frequencies the reduced draft vocabulary is chosen from: the training set."""
    out = toy.tmp / "prepared"
    python("-m", "speculators", "prepare-data", "--model", toy.target, "--data", toy.tmp / "regenerated.jsonl",
           "--output", out, "--seq-length", 512, "--no-skip-token-freq", "--num-preprocessing-workers", 1)
    return types.SimpleNamespace(path=out, rows=dataset_rows(out))


@pytest.fixture(scope="session")
def hsx_states(toy, prepared):
    """`hsx extract` of every prepared row, row r to hs_<r>.safetensors: the file names
    speculators' FileTransfer reads (bench/loop's extract-input)."""
    lines = write_jsonl(toy.tmp / "extract.jsonl",
                        [{"id": f"hs_{r}", "token_ids": row["input_ids"]} for r, row in enumerate(prepared.rows)])
    out = toy.tmp / "hsx_states"
    hsx("extract", "--model", toy.target, "--batch-invariant", "--layers", ",".join(map(str, LAYERS)),
        "--input", lines, "--output", out)
    return out
