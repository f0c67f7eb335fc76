"""The Mooncake sink against the file sink (issue 34's figures), one JSON line per result:

  1. `hsx bench` writing safetensors files to --dir (on /dev/shm on the device) against the
     same bench putting objects into a Mooncake store, alternating, --rounds times. Its
     extract_tokens_per_s lines carry bytes_per_token (a file's or an object's bytes per
     token: what moves per token).
  2. The consumer: `hsx extract` of the bench's first --read-samples prompts to both sinks,
     then the reader's time per sample: hs_connectors' MooncakeTransfer.get_generated (what
     speculators' trainer calls) against safetensors' load_file of the file (what its
     FileTransfer calls).

The store is the deployment that survives a dead hsx: a mooncake_master, a segment holder
(a MooncakeDistributedStore client mounting --segment-gib; the wheel's mooncake_client does
the same, this needs only mooncake.store) and hsx with global_segment_size 0. Everything
runs on this host over TCP. Needs mooncake (the non-CUDA wheel is enough), hs_connectors,
torch and safetensors importable; bench/device_run.sh's `mooncake` mode sets that up.

usage: mooncake_bench.py --hsx BIN [--rounds N] [--read-samples N] [--segment-gib G]
         --extract-args "FLAGS extract and bench share" --bench-args "FLAGS only bench takes (--dir ...)"
"""
import argparse
import json
import os
import pathlib
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time

HOLDER = r"""
import sys, time
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", "P2PHANDSHAKE", int(sys.argv[2]), 64 << 20, "tcp", "", sys.argv[1])
print("ready" if rc == 0 else "setup failed: %d" % rc, flush=True)
if rc == 0:
    sys.stdin.read()  # until the bench closes it
    store.close()
"""


def emit(**fields):
    print(json.dumps(fields), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_binary():
    exe = shutil.which("mooncake_master")
    if exe:
        return exe
    import mooncake  # the wheel keeps the binary beside its modules
    exe = pathlib.Path(mooncake.__path__[0]) / "mooncake_master"
    if not exe.exists():
        sys.exit("mooncake_master is neither on PATH nor in the mooncake package (%s)" % exe.parent)
    return str(exe)


class Store:
    """mooncake_master plus the segment holder, on this host."""

    def __init__(self, segment_bytes, logdir):
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.master = subprocess.Popen([master_binary(), "--rpc_port=%d" % self.port, "--metrics_port=%d" % free_port()],
                                       stdout=open(logdir / "mooncake_master.log", "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.master.poll() is not None or time.time() > deadline:
                    sys.exit("mooncake_master did not start: see %s" % (logdir / "mooncake_master.log"))
                time.sleep(0.1)
        self.holder = subprocess.Popen([sys.executable, "-c", HOLDER, self.address, str(segment_bytes)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=open(logdir / "mooncake_holder.log", "w"), text=True)
        line = self.holder.stdout.readline().strip()
        if line != "ready":
            self.close()
            sys.exit("the segment holder did not mount %d bytes (%s): see %s" %
                     (segment_bytes, line or "it exited", logdir / "mooncake_holder.log"))

    def kv_transfer_config(self):
        """As hs_connectors' MooncakeBackend.build_kv_transfer_config writes it, with
        --mooncake-global-segment-gib 0: hsx contributes no memory."""
        return {"kv_connector": "MooncakeHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_module_path": "hs_connectors.mooncake_hidden_states_connector",
                "kv_connector_extra_config": {"mooncake": {
                    "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "master_server_address": self.address, "global_segment_size": 0,
                    "local_buffer_size": 64 << 20, "protocol": "tcp", "device_name": "",
                    "num_writer_threads": 4}}}

    def close(self):
        if self.holder.poll() is None:
            self.holder.stdin.close()
            try:
                self.holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.holder.kill()
        self.master.terminate()
        self.master.wait(timeout=30)


def run(cmd, log):
    with open(log, "a") as err:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d): see %s" % (shlex.join(cmd[:2]), r.returncode, log))
    return r.stdout


def bench_line(stdout):
    for line in stdout.splitlines():
        if line.startswith("{") and json.loads(line).get("metric") == "extract_tokens_per_s":
            return json.loads(line)
    sys.exit("hsx bench printed no extract_tokens_per_s line:\n" + stdout)


def raw_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, parsed by hand."""
    raw = pathlib.Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return {k: (m["dtype"], m["shape"], memoryview(raw)[8 + n + m["data_offsets"][0]:8 + n + m["data_offsets"][1]])
            for k, m in header.items() if k != "__metadata__"}


def file_reader():
    """(name, load, same): the trainer's file read (safetensors' load_file, as hs_connectors'
    FileTransfer reads; hs_connectors cannot import without safetensors anyway), and a
    comparison of what the two readers return. Without torch (this repository's CI machine),
    hs_connectors runs on tests/python's numpy shim and the bytes are compared: that run
    checks, it does not measure."""
    try:
        import torch
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
        import torch_numpy_shim
        torch_numpy_shim.install()
        return ("raw bytes (no torch here: not a measurement)", raw_safetensors,
                lambda a, b: a[2] == b.numpy().tobytes())
    from safetensors.torch import load_file
    return "safetensors.torch.load_file", load_file, lambda a, b: a.dtype == b.dtype and torch.equal(a, b)


def read_times(entries, files_dir, address):
    """Seconds per sample for each reader, the file reader's name and the bytes each read;
    the two readers' tensors must be equal."""
    name, load, same = file_reader()
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig
    from hs_connectors.transfer import MooncakeTransfer

    transfer = MooncakeTransfer(MooncakeHiddenStatesStore(MooncakeStoreConfig(
        local_hostname="127.0.0.1", master_server_address=address, global_segment_size=0,
        local_buffer_size=64 << 20)))
    transfer.setup()
    mooncake_s, file_s, object_bytes, file_bytes = [], [], 0, 0
    for e in entries:
        path = files_dir / (e["id"] + ".safetensors")
        t0 = time.perf_counter()
        from_file = load(str(path))
        t1 = time.perf_counter()
        from_store = transfer.get_generated(e["kv_transfer_params"])
        t2 = time.perf_counter()
        file_s.append(t1 - t0)
        mooncake_s.append(t2 - t1)
        object_bytes += e["kv_transfer_params"]["metadata"]["total_aligned_bytes"]
        file_bytes += path.stat().st_size
        for t in ("hidden_states", "token_ids"):
            if not same(from_file[t], from_store[t]):
                sys.exit("sample %s: %s read from Mooncake differs from the file's" % (e["id"], t))
        transfer.delete(e["kv_transfer_params"]["handle"])
    return mooncake_s, file_s, name, object_bytes, file_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hsx", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--read-samples", type=int, default=64)
    ap.add_argument("--segment-gib", type=float, default=16.0,
                    help="The holder's segment: more than one bench run's objects, so that nothing is evicted")
    ap.add_argument("--extract-args", required=True)
    ap.add_argument("--bench-args", required=True, help="must include --dir DIR (its prompts.jsonl is reused)")
    ap.add_argument("--logdir", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    logdir = pathlib.Path(a.logdir)
    extract_args, bench_args = shlex.split(a.extract_args), shlex.split(a.bench_args)
    bench_dir = pathlib.Path(bench_args[bench_args.index("--dir") + 1])
    store = Store(int(a.segment_gib * (1 << 30)), logdir)
    try:
        kv = json.dumps(store.kv_transfer_config())
        for r in range(a.rounds):
            tok_s = {}
            for sink in ("files", "mooncake"):
                extra = ["--kv-transfer-config", kv] if sink == "mooncake" else []
                line = bench_line(run([a.hsx, "bench", *extract_args, *bench_args, *extra], logdir / "mooncake_bench.err"))
                tok_s[sink] = line["value"]
                emit(**line, round=r, sink_kind=sink)
                if sink == "mooncake":
                    import mooncake.store  # the objects the bench put: gone, so the next run has the whole segment
                    cleaner = mooncake.store.MooncakeDistributedStore()
                    if cleaner.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", store.address) == 0:
                        emit(metric="mooncake_objects_removed", value=cleaner.remove_all(), round=r)
                        cleaner.close()
            emit(metric="mooncake_over_files", value=tok_s["mooncake"] / tok_s["files"], round=r, goal=0.9)

        prompts = (bench_dir / "prompts.jsonl").read_text().splitlines()[: a.read_samples]
        work = bench_dir / "read"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "prompts.jsonl").write_text("".join(p + "\n" for p in prompts))
        base = [a.hsx, "extract", *extract_args, "--input", str(work / "prompts.jsonl")]
        run(base + ["--output", str(work / "files")], logdir / "mooncake_bench.err")
        run(base + ["--output", str(work / "mooncake"), "--kv-transfer-config", kv], logdir / "mooncake_bench.err")
        entries = [json.loads(l) for l in (work / "mooncake" / "manifest.jsonl").read_text().splitlines()]
        mooncake_s, file_s, file_reader_name, object_bytes, file_bytes = read_times(entries, work / "files", store.address)
        n = len(entries)
        for reader, times, nbytes in (("MooncakeTransfer.get_generated", mooncake_s, object_bytes),
                                      (file_reader_name + " of " + str(work / "files"), file_s, file_bytes)):
            emit(metric="consumer_read_ms_per_sample", reader=reader, value=1e3 * statistics.mean(times),
                 median_ms=1e3 * statistics.median(times), gb_per_s=nbytes / sum(times) / 1e9, samples=n,
                 mean_bytes=nbytes / n)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
