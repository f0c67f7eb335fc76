"""Starts `hsx serve` on a fixture model for the client tests (real `openai` and
`speculators` clients against the real binary), and the Mooncake store it can put into."""
import argparse
import contextlib
import functools
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from safetensors_numpy import read_safetensors  # noqa: F401 (tests import it from here)

ROOT = pathlib.Path(__file__).resolve().parents[2]
HSX = os.environ.get("HSX_BINARY", str(ROOT / "build" / "src" / "hsx"))
MODEL = ROOT / "tests" / "data" / "models" / "qwen3"
LAYERS = [0, 2, 4]
TOKENIZER = ROOT / "tests" / "data" / "tokenizers" / "bpe_qwen2" / "tokenizer.json"
TEXT_MODEL_LEN = 256
# A post-processor that adds a BOS (<|endoftext|>, id 0) to every encoding, as Llama 3's and Gemma's do.
BOS_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}


def wait_for_server(url, proc, log_path, timeout=60):
    """Until url/health answers. A server that exits first, or is not up within timeout
    seconds, fails the test with its log (and is killed)."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError("hsx serve did not come up: " + pathlib.Path(log_path).read_text())
            time.sleep(0.1)


def extraction_configs(storage, layers):
    """vLLM's --speculative-config and --kv-transfer-config for hidden-state extraction into
    files under storage, as speculators' launcher writes them."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    return spec, kv


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp, *extra, storage=None, model=MODEL, connector=None):
        """connector: fields that replace the ExampleHiddenStatesConnector's (kv_connector, module path)."""
        self.port = free_port()
        self.storage = storage or tmp / "hidden_states"
        self.url = f"http://127.0.0.1:{self.port}"
        spec, kv = extraction_configs(self.storage, LAYERS)
        kv["kv_connector_extra_config"].update({"num_writer_threads": 4, "use_synchronization_lock": True})
        kv.update(connector or {})
        self.log = open(tmp / "server.log", "w")
        self.proc = subprocess.Popen(
            [HSX, "serve", str(model), "--port", str(self.port), "--served-model-name", "qwen3-fixture",
             "--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_server(self.url, self.proc, tmp / "server.log", timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


def text_model(tmp, bos=False, files=None):
    """A model directory for text requests: the qwen3 fixture's shapes (dummy weights), a
    3000-token vocabulary and the bpe_qwen2 tokenizer, with a BOS post-processor if `bos`,
    plus `files` ({name: text})."""
    model = tmp / "model"
    model.mkdir()
    config = json.loads((MODEL / "config.json").read_text())
    config.update(vocab_size=3000, max_position_embeddings=TEXT_MODEL_LEN)
    (model / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads(TOKENIZER.read_text())
    if bos:
        tokenizer["post_processor"] = BOS_POST_PROCESSOR
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    for name, text in (files or {}).items():
        (model / name).write_text(text)
    return model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def golden():
    return read_safetensors(MODEL / "golden.safetensors")


# ---------------------------------------------------------------------------- Mooncake


@functools.cache
def mooncake_backend():
    """hs_connectors' MooncakeBackend (on torch_numpy_shim where torch does not import: it
    builds configs and argument parsers, no tensors). ImportError without hs-connectors."""
    import torch_numpy_shim
    torch_numpy_shim.install()
    try:
        from hs_connectors.transfer import MooncakeBackend
    finally:
        torch_numpy_shim.forget()
    return MooncakeBackend


def mooncake_launch_args(master_address, segment_gib):
    """The flags hs_connectors' launch_vllm.py / train.py take for the Mooncake backend."""
    parser = argparse.ArgumentParser()
    mooncake_backend().add_launch_args(parser)
    return parser.parse_args(["--mooncake-master", master_address, "--mooncake-global-segment-gib", str(segment_gib),
                              "--mooncake-local-buffer-gib", "0.0625", "--mooncake-writer-threads", "2"])


def mooncake_kv_transfer_config(master_address, segment_gib):
    """--kv-transfer-config for MooncakeHiddenStatesConnector, as hs_connectors builds it for
    vLLM, on localhost (MOONCAKE_LOCAL_HOSTNAME, which hsx's children and readers inherit)."""
    os.environ["MOONCAKE_LOCAL_HOSTNAME"] = "127.0.0.1"
    kv = mooncake_backend().build_kv_transfer_config(mooncake_launch_args(master_address, segment_gib))
    assert kv["kv_connector"] == "MooncakeHiddenStatesConnector"
    return kv


class Master:
    """A `mooncake_master` (from Mooncake's PyPI wheel) on a port of its own, which a test
    can kill and start again there."""

    def __init__(self):
        self.exe = shutil.which("mooncake_master")
        assert self.exe, "mooncake_master is not on PATH although mooncake.store imports"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"mooncake_master_{self.port}.log", "w")
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen([self.exe, f"--rpc_port={self.port}", f"--metrics_port={free_port()}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None and time.time() < deadline, "mooncake_master did not start"
                time.sleep(0.1)

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_master():
    m = Master()
    try:
        yield m.address
    finally:
        m.stop()


@pytest.fixture
def master():
    """A master for each test: a client that went away uncleanly (a killed helper, a stopped
    mooncake_client) leaves its segment registered until the master's client TTL, and puts
    placed there fail with -800 meanwhile."""
    with running_master() as address:
        yield address


class MooncakeServer:
    """`hsx serve` with hs_connectors' Mooncake kv-transfer config, as launch_vllm.py writes
    it. served_model_name None: served under the model's path (as speculators expects)."""

    def __init__(self, tmp, master_address, *extra, model=MODEL, segment_gib=0.125, layers=LAYERS,
                 served_model_name="qwen3-fixture"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}}}
        kv = mooncake_kv_transfer_config(master_address, segment_gib)
        name = ["--served-model-name", served_model_name] if served_model_name else []
        self.log_path = tmp / "mooncake_server.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [HSX, "serve", str(model), "--port", str(self.port), *name,
             "--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_server(self.url, self.proc, self.log_path)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()
