"""hsx serve's lifecycle against the real binary: request ids that never collide between
servers sharing a storage path."""
import concurrent.futures
import json
import pathlib
import urllib.error
import urllib.request

from conftest import LAYERS, Server, read_safetensors

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

