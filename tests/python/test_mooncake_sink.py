"""hsx's Mooncake capture sink against the real clients: a `mooncake_master` from PyPI,
Mooncake's store, and hs_connectors' own reader (MooncakeBackend/MooncakeTransfer ->
MooncakeHiddenStatesStore.get_sample) reading what hsx put. The tensors must equal, byte
for byte, the file sink's safetensors files for the same prompts.

Without torch (PyPI has no CPU-only wheel), hs_connectors runs on torch_numpy_shim: the
reader's code is hs_connectors', only its buffer allocation and views are numpy's."""
import concurrent.futures
import contextlib
import http.client
import json
import os
import pathlib
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time

import numpy as np
import pytest

import torch_numpy_shim
from conftest import (HSX, LAYERS, MODEL, Master, MooncakeServer, Server, free_port, mooncake_kv_transfer_config,
                      mooncake_launch_args, running_master)
from test_nonfinite_states import poisoned_model
from test_server_load import post

TORCH = torch_numpy_shim.install()
try:
    import mooncake.store  # noqa: F401
    from hs_connectors.mooncake_store import MooncakeIntegrityError
    from hs_connectors.transfer import MooncakeBackend
    MISSING = None
except ImportError as e:  # scripts/test.sh installs both; only a platform without wheels lacks them
    MISSING = f"Mooncake or hs-connectors not importable: {e}"
torch_numpy_shim.forget()

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
PUT_TOOL = pathlib.Path(HSX).parent.parent / "tests" / "hsx_mooncake_put"
TORCH_DTYPES = {"F32": "torch.float32", "BF16": "torch.bfloat16", "F16": "torch.float16", "I64": "torch.int64"}


def raw_tensors(path):
    """{name: (torch dtype name, shape, bytes)} of a safetensors file, bytes as stored."""
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {name: (TORCH_DTYPES[m["dtype"]], tuple(m["shape"]), raw[8 + n + m["data_offsets"][0]:8 + n + m["data_offsets"][1]])
            for name, m in header.items() if name != "__metadata__"}


def tensor_bytes(t):
    """A reader tensor's dtype name, shape and bytes, from real torch or the shim."""
    if TORCH == "torch":
        import torch
        return str(t.dtype), tuple(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes()
    return repr(t.dtype), tuple(t.shape), t.numpy().tobytes()


@contextlib.contextmanager
def standalone_segment(master_address, tmp, mb=128):
    """A `mooncake_client` (the wheel's standalone store client) mounting `mb` MB of memory
    into the store: the deployment where hsx contributes none (global_segment_size 0) and
    its objects outlive it. Its service port opens once the segment is mounted."""
    exe = shutil.which("mooncake_client")
    assert exe, "mooncake_client is not on PATH although mooncake.store imports"
    port = free_port()
    proc = subprocess.Popen([exe, f"-master_server_address={master_address}", "-metadata_server=P2PHANDSHAKE",
                             "-host=127.0.0.1", f"-port={port}", f"-http_port={free_port()}",
                             f"-global_segment_size={mb} MB"],
                            stdout=open(tmp / f"mooncake_client_{port}.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, "mooncake_client did not start"
            time.sleep(0.05)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class PutTool:
    """hsx's MooncakeSink, configured exactly as hs_connectors configures vLLM."""

    def __init__(self, master_address, segment_gib=0.125, env=None):
        kv = mooncake_kv_transfer_config(master_address, segment_gib)
        # Its log (Mooncake's warnings) to a file: a pipe nobody reads could fill and stall it.
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([str(PUT_TOOL), json.dumps(kv["kv_connector_extra_config"]["mooncake"])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise RuntimeError(self.read_log())
        assert "ready" in json.loads(line)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def read_log(self):
        self.log.seek(0)
        return self.log.read()

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0, self.read_log()[-3000:]


def reader(master_address, segment_gib=0.0625):
    """hs_connectors' reader, as speculators' trainer makes it. Its client mounts a segment
    too (4 GiB by default), and the master may place anyone's puts there."""
    transfer = MooncakeBackend.from_train_args(mooncake_launch_args(master_address, segment_gib), "")
    transfer.setup()
    return transfer


def test_hs_connectors_reads_what_hsx_put_equal_to_the_file_sink(tmp_path, master):
    rng = np.random.default_rng(3)
    prompts = {pid: rng.integers(0, 512, int(rng.integers(5, 40))).tolist() for pid in ["q0", "7", "a.b"]}
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": k, "token_ids": v}) + "\n" for k, v in prompts.items()))
    out = tmp_path / "files"
    r = subprocess.run([HSX, "extract", "--model", str(MODEL), "--layers", "0,2,4", "--input", str(tmp_path / "p.jsonl"),
                        "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    tool = PutTool(master)
    try:
        transfer = reader(master)
        for pid, ids in prompts.items():
            receipt = tool.ask(op="put", id=pid, file=str(out / f"{pid}.safetensors"))
            assert "error" not in receipt, receipt
            params = receipt["transfer_params"]
            assert params["handle"] == {"q0": "q0", "7": "k7", "a.b": "a_b"}[pid]  # sanitize_key's rule
            assert params["version"] == 1 and params["metadata"]["num_tokens"] == len(ids)
            sample = transfer.get_generated(json.loads(json.dumps(params)))  # as it arrives over HTTP
            expected = raw_tensors(out / f"{pid}.safetensors")
            assert set(sample) == set(expected)
            for name, tensor in sample.items():
                assert tensor_bytes(tensor) == expected[name], (pid, name)
            assert np.frombuffer(expected["token_ids"][2], np.int64).tolist() == ids
            transfer.delete(params["handle"])
    finally:
        tool.close()


def test_a_failed_request_leaves_the_error_marker_the_reader_sees(master):
    tool = PutTool(master)
    try:
        assert tool.ask(op="fail", id="req/9", why="non-finite hidden state at layer 2") == {"ok": True}
        transfer = reader(master)
        manifest = {"handle": "req_9", "version": 1, "tensors": {}, "metadata": {"total_aligned_bytes": 0}}
        with pytest.raises(MooncakeIntegrityError, match="non-finite hidden state at layer 2"):
            transfer.get_generated(manifest)
        transfer.delete("req_9")
    finally:
        tool.close()


def write_f32_states(path, t, layers, hidden):
    states = np.ones((t, layers, hidden), np.float32)
    ids = np.arange(t, dtype=np.int64)
    header = {"hidden_states": {"dtype": "F32", "shape": [t, layers, hidden], "data_offsets": [0, states.nbytes]},
              "token_ids": {"dtype": "I64", "shape": [t], "data_offsets": [states.nbytes, states.nbytes + ids.nbytes]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + states.tobytes() + ids.tobytes())


def test_a_store_too_full_for_a_request_fails_it_alone(tmp_path, master):
    big, small = tmp_path / "big.safetensors", tmp_path / "small.safetensors"
    write_f32_states(big, 1700, 3, 4096)  # ~84 MB: more than any segment here
    write_f32_states(small, 4, 3, 8)
    tool = PutTool(master, segment_gib=0.0625)
    try:
        failed = tool.ask(op="put", id="huge", file=str(big))
        assert "request 'huge'" in failed["error"]
        transfer = reader(master)
        with pytest.raises(MooncakeIntegrityError, match="put_from"):
            transfer.get_generated({"handle": "huge", "version": 1, "tensors": {}, "metadata": {"total_aligned_bytes": 0}})
        ok = tool.ask(op="put", id="after", file=str(small))  # the sink goes on
        sample = transfer.get_generated(ok["transfer_params"])
        assert tensor_bytes(sample["hidden_states"])[2] == np.ones((4, 3, 8), np.float32).tobytes()
        transfer.delete("huge")
        transfer.delete("after")
    finally:
        tool.close()


def test_missing_mooncake_and_a_down_master_are_clear_errors(tmp_path):
    wrapper = tmp_path / "python_without_site"
    wrapper.write_text("#!/bin/sh\nexec python3 -S \"$@\"\n")
    wrapper.chmod(0o755)
    with socket.socket() as listener:  # something at the master's address, so that the probe passes
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = "127.0.0.1:%d" % listener.getsockname()[1]
        with pytest.raises(RuntimeError, match="Mooncake is not installed.*pip install mooncake-transfer-engine"):
            PutTool(address, env={**os.environ, "HSX_PYTHON": str(wrapper)})
    start = time.time()
    with pytest.raises(RuntimeError, match="not reachable.*mooncake_master --rpc_port"):
        PutTool(f"127.0.0.1:{free_port()}")
    assert time.time() - start < 15


def test_objects_outlive_hsx_in_a_standalone_clients_segment(tmp_path, master):
    """hsx extract's use: with global_segment_size 0, hsx's objects go to the memory a
    `mooncake_client` (from the same wheel) mounts, and stay after hsx exits."""
    small = tmp_path / "small.safetensors"
    write_f32_states(small, 5, 3, 8)
    with standalone_segment(master, tmp_path):
        tool = PutTool(master, segment_gib=0)
        receipt = tool.ask(op="put", id="kept", file=str(small))
        tool.close()
        assert "error" not in receipt, receipt
        sample = reader(master).get_generated(receipt["transfer_params"])
        assert tensor_bytes(sample["hidden_states"])[2] == np.ones((5, 3, 8), np.float32).tobytes()


def test_a_helper_that_dies_fails_puts_with_its_reason_and_no_hang(tmp_path):
    small = tmp_path / "small.safetensors"
    write_f32_states(small, 2, 3, 8)
    with running_master() as master:
        helper_dies(master, small)


def helper_dies(master, small):
    tool = PutTool(master)
    try:
        helper = subprocess.run(["pgrep", "-P", str(tool.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(helper) == 1
        os.kill(int(helper[0]), 9)
        start = time.time()
        answer = tool.ask(op="put", id="late", file=str(small))
        assert "Mooncake helper" in answer["error"] and "exited" in answer["error"], answer
        assert "Mooncake helper" in tool.ask(op="put", id="later", file=str(small))["error"]
        assert time.time() - start < 10
    finally:
        tool.close()


def test_serve_answers_with_the_manifest_hs_connectors_reads(tmp_path, master):
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    files = Server(tmp_path)
    try:
        status, body, _ = post(files, {"prompt": prompt, "max_tokens": 1})
        assert status == 200, body
        expected = raw_tensors(body["kv_transfer_params"]["hidden_states_path"])
    finally:
        files.stop()
    before = set(tmp_path.rglob("*"))
    server = MooncakeServer(tmp_path, master)
    try:
        status, body, _ = post(server, {"prompt": prompt, "max_tokens": 1})
        assert status == 200, body
        params = body["choices"][0]["kv_transfer_params"]
        assert body["kv_transfer_params"] == params
        assert params["version"] == 1 and params["handle"].startswith("cmpl-")
        assert params["metadata"]["num_tokens"] == len(prompt)
        assert params["metadata"]["extract_mode"] == "prompt_only"
        transfer = reader(master)
        sample = transfer.get_generated(params)
        assert set(sample) == set(expected)
        for name, tensor in sample.items():
            assert tensor_bytes(tensor) == expected[name], name
        transfer.delete(params["handle"])
        # Concurrent requests: each writer channel stages its own object.
        rng = np.random.default_rng(11)
        many = [rng.integers(0, 512, int(rng.integers(4, 64))).tolist() for _ in range(12)]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda p: post(server, {"prompt": p, "max_tokens": 2}), many))
        for p, (status, body, _) in zip(many, answers):
            assert status == 200, body
            sample = transfer.get_generated(body["kv_transfer_params"])
            assert tensor_bytes(sample["token_ids"])[2] == np.array(p, np.int64).tobytes()
            assert tensor_bytes(sample["hidden_states"])[1] == (len(p), len(LAYERS), expected["hidden_states"][1][2])
        assert set(tmp_path.rglob("*")) - before == {server.log_path}, "Mooncake must not touch disk"
    finally:
        server.stop()


def test_serve_a_request_failed_after_admission_leaves_the_marker_and_the_server_goes_on(tmp_path, master):
    server = MooncakeServer(tmp_path, master, model=poisoned_model(tmp_path))
    try:
        status, body, _ = post(server, {"prompt": [1, 2, 3, 7, 5], "max_tokens": 1})
        assert 400 <= status < 600, body
        # The error names the request, whose id is its key (sanitize_key leaves "cmpl-<hex>-0" as it is).
        handle = re.search(r"request '(cmpl-[0-9a-f]+-0)'", body["error"]["message"]).group(1)
        # Like vLLM's producer, whose manifest goes out before its put, the failed request's
        # answer carries kv_transfer_params: the reader waits on them and meets the marker.
        params = body["kv_transfer_params"]
        assert params["handle"] == handle and params["version"] == 1, params
        transfer = reader(master)
        with pytest.raises(MooncakeIntegrityError, match="layer 0 at token position 3 is not finite"):
            transfer.store.get_sample(params, timeout=15)
        transfer.delete(handle)
        # A stream's error event carries them too.
        events = stream_events(server, {"prompt": [1, 2, 3, 7, 5], "max_tokens": 1, "stream": True})
        failed = [e for e in events if "error" in e]
        assert len(failed) == 1 and failed[0]["kv_transfer_params"]["version"] == 1, events
        with pytest.raises(MooncakeIntegrityError, match="not finite"):
            transfer.store.get_sample(failed[0]["kv_transfer_params"], timeout=15)
        transfer.delete(failed[0]["kv_transfer_params"]["handle"])
        status, body, _ = post(server, {"prompt": [1, 2, 3, 4, 5], "max_tokens": 1})
        assert status == 200, body
        sample = transfer.get_generated(body["kv_transfer_params"])
        assert tensor_bytes(sample["token_ids"])[2] == np.array([1, 2, 3, 4, 5], np.int64).tobytes()
    finally:
        server.stop()


def test_serve_with_the_master_down_fails_at_start_up(tmp_path):
    start = time.time()
    with pytest.raises(RuntimeError, match="not reachable.*mooncake_master"):
        MooncakeServer(tmp_path, f"127.0.0.1:{free_port()}")
    assert time.time() - start < 30


def test_extract_puts_every_prompt_for_hs_connectors_to_read_after_it_exits(tmp_path, master):
    """hsx extract through the same sink: global_segment_size 0, so the objects live in a
    mooncake_client's memory and outlive the run; manifest.jsonl carries each manifest."""
    rng = np.random.default_rng(5)
    prompts = {f"p{i}": rng.integers(0, 512, int(rng.integers(5, 30))).tolist() for i in range(4)}
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": k, "token_ids": v}) + "\n" for k, v in prompts.items()))
    base = [HSX, "extract", "--model", str(MODEL), "--layers", "0,2,4", "--input", str(tmp_path / "p.jsonl")]
    r = subprocess.run(base + ["--output", str(tmp_path / "files")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with standalone_segment(master, tmp_path):
        kv = mooncake_kv_transfer_config(master, 0)
        out = tmp_path / "mooncake"
        r = subprocess.run(base + ["--output", str(out), "--kv-transfer-config", json.dumps(kv)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in out.iterdir()) == ["manifest.jsonl"]  # no state files
        entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
        assert sorted(e["id"] for e in entries) == sorted(prompts)
        transfer = reader(master)
        for e in entries:
            sample = transfer.get_generated(e["kv_transfer_params"])
            expected = raw_tensors(tmp_path / "files" / f"{e['id']}.safetensors")
            for name, tensor in sample.items():
                assert tensor_bytes(tensor) == expected[name], (e["id"], name)


def test_extract_a_line_failed_after_admission_leaves_the_marker_and_the_rest_go_on(tmp_path, master):
    """A line whose states are not finite (the poisoned embedding of token 7) fails after
    admission: extract reports it and, as serve does, puts its ":error" marker under the
    line's key, so that hs_connectors' reader waiting for it meets the error instead of
    timing out. The other lines are put and listed as usual."""
    prompts = {"bad": [1, 2, 3, 7, 5], "ok": [1, 2, 3, 4, 5], "b.7": [7, 9, 11]}
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": k, "token_ids": v}) + "\n" for k, v in prompts.items()))
    with standalone_segment(master, tmp_path):
        kv = mooncake_kv_transfer_config(master, 0)
        out = tmp_path / "mooncake"
        r = subprocess.run([HSX, "extract", "--model", str(poisoned_model(tmp_path)), "--layers", "0,2,4", "--input",
                            str(tmp_path / "p.jsonl"), "--output", str(out), "--kv-transfer-config", json.dumps(kv)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, r.stderr
        assert "p.jsonl:1: request 'bad': the hidden state of layer 0 at token position 3 is not finite" in r.stderr, r.stderr
        assert "p.jsonl:3: request 'b.7': the hidden state of layer 0 at token position 0 is not finite" in r.stderr, r.stderr
        entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
        assert [e["id"] for e in entries] == ["ok"]
        transfer = reader(master, 0)
        for handle, position in [("bad", 3), ("b_7", 0)]:  # sanitize_key's rule
            waiting = {"handle": handle, "version": 1, "tensors": {}, "metadata": {"total_aligned_bytes": 0}}
            with pytest.raises(MooncakeIntegrityError, match=f"layer 0 at token position {position} is not finite"):
                transfer.store.get_sample(waiting, timeout=10)
            transfer.delete(handle)
        sample = transfer.get_generated(entries[0]["kv_transfer_params"])
        assert tensor_bytes(sample["token_ids"])[2] == np.array(prompts["ok"], np.int64).tobytes()


def stream_events(server, body):
    """The JSON events of one streamed POST /v1/completions."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        raw = conn.getresponse().read().decode()
    finally:
        conn.close()
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


@pytest.fixture
def killable_master():
    m = Master()
    try:
        yield m
    finally:
        m.stop()


def health(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def test_serve_master_killed_mid_run_fails_the_affected_requests_alone(tmp_path, killable_master):
    """SIGKILL of mooncake_master while requests run: puts fail at once with Mooncake's
    RPC_FAIL (-900), named; those requests alone fail, each answer carrying its
    kv_transfer_params and saying that its marker could not be written (the master is what
    would hold it). hsx stays up; Mooncake's client reconnects to a master started again
    at the same address and remounts its segment, and puts succeed again. The restarted
    master's index is empty: objects put before the kill are gone (no HA master here)."""
    master = killable_master
    server = MooncakeServer(tmp_path, master.address)
    rng = np.random.default_rng(17)
    try:
        status, before, _ = post(server, {"prompt": [5, 6, 7, 8], "max_tokens": 1})
        assert status == 200, before
        stop = time.time() + 1e9
        answers = []

        def client(seed):
            local = np.random.default_rng(seed)
            while time.time() < stop:
                p = local.integers(0, 512, int(local.integers(4, 48))).tolist()
                answers.append((time.time(), post(server, {"prompt": p, "max_tokens": 2})))

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client, int(rng.integers(1 << 30))) for _ in range(4)]
            time.sleep(1.0)
            killed_at = time.time()
            master.kill()
            time.sleep(2.0)
            stop = time.time()
            for f in futures:
                f.result()
        assert health(server) == 200  # up, with the master down
        ok = [b for t, (st, b, _) in answers if st == 200]
        failed = [(t, st, b) for t, (st, b, _) in answers if st != 200]
        assert ok and failed, (len(ok), len(failed))
        for t, st, b in failed:
            assert t > killed_at - 1 and st == 500, (st, b)
            message = b["error"]["message"]
            assert "status -900" in message and "Mooncake master" in message, message
            assert "error marker" in message and "could not be written either" in message, message
            assert b["kv_transfer_params"]["version"] == 1 and b["kv_transfer_params"]["handle"].startswith("cmpl-")
        master.start()
        deadline = time.time() + 30
        while True:  # the client's ping thread finds the master again and remounts (a few seconds)
            status, body, _ = post(server, {"prompt": [9, 8, 7, 6, 5], "max_tokens": 1})
            if status == 200 or time.time() > deadline:
                break
            time.sleep(0.5)
        assert status == 200, body
        # A reader with no memory of its own: the master places puts in any mounted segment,
        # and one that goes away (a reader closed) takes the objects placed there with it.
        transfer = reader(master.address, 0)
        sample = transfer.get_generated(body["kv_transfer_params"])
        assert tensor_bytes(sample["token_ids"])[2] == np.array([9, 8, 7, 6, 5], np.int64).tobytes()
        assert transfer.store._store.is_exist(before["kv_transfer_params"]["handle"]) == 0  # lost with the old master
    finally:
        server.stop()


def test_kill_9_of_serve_loses_no_answered_sample_held_in_a_standalone_segment(tmp_path, master):
    """hsx with global_segment_size 0 beside a mooncake_client that holds the memory: every
    sample whose answer was sent reads back, byte for byte, after `kill -9` of hsx. The
    control: with hsx's own segment, the same kill takes the samples with it. The readers
    here mount no memory, so the master can place objects only where the test means."""
    rng = np.random.default_rng(23)
    prompts = [rng.integers(0, 512, int(rng.integers(4, 40))).tolist() for _ in range(6)]

    def serve_and_kill(master, segment_gib):
        server = MooncakeServer(tmp_path, master, segment_gib=segment_gib)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda p: post(server, {"prompt": p, "max_tokens": 1}), prompts))
        assert all(st == 200 for st, _, _ in answers), [b["error"]["message"] for st, b, _ in answers if st != 200]
        params = [b["kv_transfer_params"] for _, b, _ in answers]
        early = reader(master, 0)
        before = [{n: tensor_bytes(t) for n, t in early.get_generated(p).items()} for p in params]
        helper = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split()
        server.proc.kill()
        server.proc.wait(timeout=10)
        for pid in helper:  # PR_SET_PDEATHSIG takes the helper along
            deadline = time.time() + 10
            while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
                time.sleep(0.05)
            assert not os.path.exists(f"/proc/{pid}"), "the Mooncake helper outlived hsx"
        return params, before

    with standalone_segment(master, tmp_path):
        params, before = serve_and_kill(master, 0)
        transfer = reader(master, 0)
        for p, b, ids in zip(params, before, prompts):
            sample = transfer.get_generated(p)
            assert {n: tensor_bytes(t) for n, t in sample.items()} == b
            assert b["token_ids"][2] == np.array(ids, np.int64).tobytes()
            transfer.delete(p["handle"])
    # A master of its own: the stopped mooncake_client's segment stays registered with the
    # first until its client TTL, and puts placed there fail with -800 meanwhile.
    with running_master() as control:
        params, _ = serve_and_kill(control, 0.125)
        with pytest.raises(MooncakeIntegrityError, match="returned -800"):  # its owner is gone
            reader(control, 0).store.get_sample(params[0], timeout=5)
