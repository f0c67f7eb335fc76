"""hsx serve's lifecycle against the real binary: request ids that never collide between
servers sharing a storage path, SIGTERM (drain, its deadline, a second signal, a signal
while the model loads), slow peers that trickle their headers or bodies, request heads
too large, and temp files that a killed server left."""
import concurrent.futures
import http.client
import itertools
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import HSX, LAYERS, MODEL, Server, read_safetensors

HANG = 60  # seconds: only a hang takes this long


def post(server, body, timeout=HANG):
    req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def prompt_of(k):
    return [1 + k % 400, 2 + (7 * k) % 400, 3 + (13 * k) % 400, 4 + k // 400]  # distinct for k < 160000


def assert_file_holds(path, prompt):
    data = read_safetensors(path)
    assert data["token_ids"].tolist() == prompt, f"{path} holds another request's prompt"
    assert data["hidden_states"].shape == (len(prompt), len(LAYERS), 64), path


# --- item 3: request ids -----------------------------------------------------------------

def test_servers_sharing_a_storage_path_never_name_the_same_file(tmp_path):
    """Two servers (and then a restart of one) write to one storage directory; requests
    alternate between them, several at a time. Ids made of the time and a counter
    collided here, so a client read another request's file."""
    storage = tmp_path / "shared"
    for d in ("a", "b", "a2"):
        (tmp_path / d).mkdir()
    servers = [Server(tmp_path / "a", storage=storage), Server(tmp_path / "b", storage=storage)]
    try:
        def run(k, server):
            status, res = post(server, {"prompt": prompt_of(k), "max_tokens": 1})
            assert status == 200, res
            return k, res["id"], res["kv_transfer_params"]["hidden_states_path"]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            done = list(pool.map(lambda k: run(k, servers[k % 2]), range(64)))
        # A restarted server must not reuse a name either: the files above stay as they are.
        before = {path: pathlib.Path(path).read_bytes() for _, _, path in done}
        servers[0].stop()
        servers[0] = Server(tmp_path / "a2", storage=storage)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            done += list(pool.map(lambda k: run(k, servers[k % 2]), range(64, 128)))

        for k, _, path in done:
            assert_file_holds(path, prompt_of(k))
        for path, raw in before.items():
            assert pathlib.Path(path).read_bytes() == raw, f"{path} was overwritten after a restart"
        paths = [p for _, _, p in done]
        assert len(set(paths)) == len(paths), "two requests were handed the same file"
        ids = [i for _, i, _ in done]
        assert len(set(ids)) == len(ids), "two requests got the same id"
        assert all(i.startswith("cmpl-") and len(i) == 5 + 32 for i in ids), ids[:4]  # vLLM's shape
    finally:
        for s in servers:
            s.stop()


# --- helpers for signals and slow peers --------------------------------------------------

def wait_for_log(server, text):
    deadline = time.time() + HANG
    while time.time() < deadline:
        if text in pathlib.Path(server.log.name).read_text() or server.proc.poll() is not None:
            return
        time.sleep(0.05)
    raise AssertionError(f"'{text}' never appeared in the server log")


def metric(server, name):
    with urllib.request.urlopen(server.url + "/metrics", timeout=HANG) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise KeyError(name)


def wait_until_admitted(server, prompt_tokens):
    """Until the engine has taken in this many prompt tokens (all of the test's requests)."""
    deadline = time.time() + HANG
    while metric(server, "hsx_prompt_tokens_total") < prompt_tokens:
        assert time.time() < deadline, "the requests never started"
        time.sleep(0.02)


def stalled_stream(server, k):
    """A streaming completion, under way, whose client never reads. The kernel's loopback
    buffers take far more than its small receive buffer suggests (all 3000 tokens' events,
    0.7 MB with logprobs, went through unread), so what keeps it under way is its length:
    3000 tokens take about 1.8 s on a 2-core machine; only once the buffers are full does
    each write wait out the 5 s write timeout."""
    before = metric(server, "hsx_prompt_tokens_total")
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect(("127.0.0.1", server.port))
    body = json.dumps({"prompt": prompt_of(k), "max_tokens": 3000, "stream": True, "ignore_eos": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_until_admitted(server, before + len(prompt_of(k)))
    return c


def open_stream(server, prompt, max_tokens):
    """A streaming completion whose first event has arrived; the rest is read later."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "return_token_ids": True,
         "kv_transfer_params": {"include_output_tokens": True}}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()
    assert first.startswith(b"data: {"), first
    resp.readline()  # the blank line after the event
    return conn, resp, [json.loads(first[6:])]


def read_events(resp, events):
    """The rest of a stream's events; the last one is [DONE] if it ended properly."""
    try:
        for line in resp:
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    except (http.client.HTTPException, OSError):
        pass  # cut off
    return events


def assert_no_stray_files(storage):
    stray = [p.name for p in storage.iterdir() if ".tmp." in p.name]
    assert not stray, f"temp files left behind: {stray}"


class SlowClients:
    """Connections that send a request a byte at a time, every 0.3 s: its headers (a
    slowloris), or, with `body`, complete headers and then the body. With `reconnect`,
    one that is dropped connects again, as an attacker would."""

    def __init__(self, port, n, body=False, reconnect=False):
        self.port, self.body, self.reconnect = port, body, reconnect
        self.stop = threading.Event()
        self.connected = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()
        deadline = time.time() + HANG
        while self.connected < n:
            assert time.time() < deadline, "slow clients could not connect"
            time.sleep(0.02)

    def run(self):
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=HANG) as s:
                    if self.body:
                        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 100000\r\n\r\n{")
                    else:
                        s.sendall(b"POST /v1/completions HTTP/1.1\r\nX-Slow: ")
                    with self.lock:
                        self.connected += 1
                    while not self.stop.wait(0.3):
                        s.sendall(b" " if self.body else b"x")
            except OSError:
                pass
            if not self.reconnect:
                return
            self.stop.wait(0.05)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=HANG)


# --- item 4: SIGTERM drains --------------------------------------------------------------

def test_sigterm_lets_streams_and_waiting_requests_finish_with_their_files(tmp_path):
    """SIGTERM while four streams and two waiting requests generate: each one runs to
    the end and gets its whole file, then the server exits 0. Streams were cut off."""
    s = Server(tmp_path)
    try:
        max_tokens = 600
        streams = [open_stream(s, prompt_of(k), max_tokens) for k in range(4)]
        waiting = concurrent.futures.ThreadPoolExecutor(2)
        answers = [waiting.submit(post, s, {"prompt": prompt_of(k), "max_tokens": max_tokens, "ignore_eos": True,
                                            "return_token_ids": True,
                                            "kv_transfer_params": {"include_output_tokens": True}})
                   for k in (4, 5)]
        wait_until_admitted(s, 6 * len(prompt_of(0)))
        assert metric(s, "hsx_running_requests") > 0
        s.proc.send_signal(signal.SIGTERM)
        wait_for_log(s, "draining")
        # New connections are refused (or answered 503) while the drain goes on.
        try:
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=HANG)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 503
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
            pass

        outputs = []
        for k, (conn, resp, events) in enumerate(streams):
            events = read_events(resp, events)
            conn.close()
            assert events[-1] == "[DONE]", f"stream {k} was cut off after {len(events)} events"
            last = events[-2]["choices"][0]
            assert last["finish_reason"] == "length", last
            tokens = [t for e in events[:-1] for t in e["choices"][0].get("token_ids") or []]
            outputs.append((prompt_of(k), tokens, events[-2]["kv_transfer_params"]["hidden_states_path"]))
        for k, answer in zip((4, 5), answers):
            status, res = answer.result(timeout=HANG)
            assert status == 200, res
            choice = res["choices"][0]
            outputs.append((prompt_of(k), choice["token_ids"], choice["kv_transfer_params"]["hidden_states_path"]))
        waiting.shutdown()
        assert s.proc.wait(timeout=HANG) == 0

        for prompt, tokens, path in outputs:
            assert len(tokens) == max_tokens
            data = read_safetensors(path)  # whole: prompt and every generated token but the last
            assert data["token_ids"].tolist() == prompt + tokens[:-1], path
            assert data["hidden_states"].shape == (len(prompt) + max_tokens - 1, len(LAYERS), 64), path
        assert_no_stray_files(s.storage)
    finally:
        s.stop()


# --- item 5: the drain deadline and a second signal --------------------------------------

def test_the_drain_deadline_ends_slow_clients_and_the_server_exits(tmp_path):
    # A deadline well inside the stalled request's 1.8 s (with 2 s it finished first in
    # half the runs once handlers sent the tokens made so far as one event).
    s = Server(tmp_path, "--drain-timeout", "0.3")
    slow_headers = SlowClients(s.port, 3)
    stalled = stalled_stream(s, 11)  # a request under way that does not end within the drain
    try:
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=HANG) == 1  # 1: requests were cancelled
        log = (tmp_path / "server.log").read_text()
        assert "the drain deadline passed" in log, log
        assert_no_stray_files(s.storage)
    finally:
        slow_headers.close()
        stalled.close()
        s.stop()


def test_a_second_signal_stops_at_once_and_leaves_no_partial_file(tmp_path):
    s = Server(tmp_path, "--drain-timeout", "3600")
    stalled = stalled_stream(s, 11)  # the drain lasts until the second signal
    try:
        conn, resp, events = open_stream(s, prompt_of(7), 3000)
        s.proc.send_signal(signal.SIGTERM)
        wait_for_log(s, "draining")
        assert s.proc.poll() is None  # draining: it waits for the requests under way
        s.proc.send_signal(signal.SIGINT)
        events = read_events(resp, events)
        conn.close()
        assert s.proc.wait(timeout=HANG) == 1
        assert "a second signal" in (tmp_path / "server.log").read_text()
        # The stream finished before the second signal, or ended with an error and left
        # no file; nothing half-written either way.
        finished = any(e != "[DONE]" and e.get("kv_transfer_params") for e in events)
        if not finished:
            assert any(e != "[DONE]" and "error" in e for e in events) or events[-1] != "[DONE]", events[-3:]
        request_file = s.storage / (events[0]["id"] + "-0.safetensors")
        if request_file.exists():
            assert read_safetensors(request_file)["token_ids"].tolist()[:4] == prompt_of(7)
        assert_no_stray_files(s.storage)
    finally:
        stalled.close()
        s.stop()


# --- item 6: a signal while the model loads ----------------------------------------------

def catches(pid, sig):
    """Whether process `pid` has installed a handler for `sig` (SigCgt in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (sig - 1) & 1)


@pytest.mark.parametrize("sig, delay", [(signal.SIGTERM, 0), (signal.SIGTERM, 0.003), (signal.SIGTERM, 0.01),
                                        (signal.SIGTERM, 0.03), (signal.SIGTERM, 0.1), (signal.SIGINT, 0),
                                        (signal.SIGINT, 0.01)])
def test_a_signal_sent_while_starting_always_ends_the_process(tmp_path, sig, delay):
    """The signal goes `delay` seconds after the server installs its handler: while the
    model loads, or as serving begins. Such a signal used to wait unread and was lost."""
    spec = {"method": "extract_hidden_states",
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": LAYERS}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector",
          "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "hidden_states")}}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    proc = subprocess.Popen([HSX, "serve", str(MODEL), "--port", str(port), "--speculative-config",
                             json.dumps(spec), "--kv-transfer-config", json.dumps(kv)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + HANG
        while not catches(proc.pid, sig):
            assert proc.poll() is None and time.time() < deadline, "the server never installed its handler"
            time.sleep(0.0005)
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a signal {delay}s after the handler was installed was lost: the server kept running")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert b"hsx serve: stopped" in err, err


# --- item 7: slow peers cannot hold every thread -----------------------------------------

def test_slow_clients_beyond_the_thread_count_do_not_starve_the_others(tmp_path):
    s = Server(tmp_path, "--http-threads", "2", "--http-header-timeout", "1")
    slow = SlowClients(s.port, 10, reconnect=True)  # five times the threads, reconnecting when dropped
    try:
        with urllib.request.urlopen(s.url + "/health", timeout=HANG) as r:
            assert r.status == 200
        status, res = post(s, {"prompt": prompt_of(3), "max_tokens": 2})
        assert status == 200, res
        assert_file_holds(res["kv_transfer_params"]["hidden_states_path"], prompt_of(3))
    finally:
        slow.close()
        s.stop()


def stop_at_once(server):
    """Ends a server that a test found hanging, so the failure is reported quickly."""
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()
    server.stop()


def test_slow_bodies_beyond_the_thread_count_do_not_starve_the_others(tmp_path):
    """Uploads that send whole headers, then a body byte every 0.3 s, five times the
    threads: no pause trips the read timeout, so only the cap on bodies arriving at once
    keeps threads free. They held every thread (nothing else was served), and SIGTERM
    waited the whole drain for them, then exited 1."""
    s = Server(tmp_path, "--http-threads", "2")  # one body slot: a quarter of the threads, at least one
    slow = SlowClients(s.port, 10, body=True, reconnect=True)
    try:
        with urllib.request.urlopen(s.url + "/health", timeout=15) as r:
            assert r.status == 200
        status, res = post(s, {"prompt": prompt_of(5), "max_tokens": 2}, timeout=15)
        assert status == 200, res
        # The one body slot is a slow client's: a body that does not come at once gets 503.
        with socket.create_connection(("127.0.0.1", s.port), timeout=15) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            answer = c.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After" in answer, answer
        # A drain does not wait for bodies still arriving: they are answered 503 at once.
        started = time.time()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=15) == 0
        assert time.time() - started < 10
    finally:
        slow.close()
        stop_at_once(s)


def test_a_body_slower_than_its_deadline_gets_408(tmp_path):
    s = Server(tmp_path, "--http-body-timeout", "1")
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=15) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            c.settimeout(0.3)
            answer, deadline = b"", time.time() + 15
            while not answer and time.time() < deadline:
                try:
                    answer = c.recv(4096)
                except socket.timeout:
                    c.sendall(b" ")  # a byte every 0.3 s: each pause is well within the read timeout
            c.settimeout(15)
            while chunk := c.recv(4096):  # the rest of the answer, until the server closes
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"--http-body-timeout" in answer, answer
    finally:
        stop_at_once(s)


# --- item 2 of round 2: a request's line and headers too large ----------------------------

def test_a_request_line_or_headers_too_large_get_414_and_431(server):
    """Sent fast, they are refused at 64 KiB instead of piling up; the connection used to
    be closed with no answer at all."""
    cases = [(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n", b"HTTP/1.1 414"),  # past the cap
             (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", b"HTTP/1.1 414"),   # past 0.11's own limit
             (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"y" * 1000) for i in range(100)) +
              b"\r\n", b"HTTP/1.1 431")]
    for request, status in cases:
        with socket.create_connection(("127.0.0.1", server.port), timeout=15) as c:
            c.sendall(request)
            answer = c.recv(12)
        assert answer == status, (request[:40], answer)
    with urllib.request.urlopen(server.url + "/health", timeout=15) as r:
        assert r.status == 200


# --- item 3 of round 2: temp files of a killed server ------------------------------------

def temp_file_host():
    """This host as hsx's temp file names carry it."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64] or "unknown-host"


def test_a_restart_removes_only_this_hosts_dead_writers_temp_files(tmp_path):
    """A server killed with -9 leaves its temp files; the next start on the same storage
    removes those, and leaves a live writer's and other hosts' (on shared storage a pid
    of another host means nothing here). Nothing removed them."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    storage = tmp_path / "shared"
    killed = Server(tmp_path / "a", storage=storage)
    killed.proc.kill()
    killed.proc.wait()
    killed.stop()
    host, dead, live = temp_file_host(), killed.proc.pid, os.getpid()
    name = "cmpl-0123456789abcdef0123456789abcdef-0.safetensors.tmp."
    removed = [f"{name}{host}.{dead}.0"]
    kept = [f"{name}{host}.{live}.0", f"{name}other-host.{dead}.0", f"{name}{dead}.0"]
    for n in removed + kept:
        (storage / n).write_bytes(b"partial")
    s = Server(tmp_path / "b", storage=storage)
    try:
        names = {p.name for p in storage.iterdir()}
        assert not set(removed) & names, names
        assert set(kept) <= names, names
        assert "removed 1 temp file(s)" in (tmp_path / "b" / "server.log").read_text()
    finally:
        s.stop()
