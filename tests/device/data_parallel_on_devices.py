"""--data-parallel-size on GPUs (run by bench/device_run.sh devices on a machine with
several GPUs; CI has none): hsx extract with one replica per GPU gives the files of one
replica on cuda:0 byte for byte (--batch-invariant: a prompt's bits do not depend on its
batch; the GPUs are of one kind), every replica takes work, and asking for more replicas
than there are GPUs fails naming the flag before writing anything. Exits 1 on any
difference. Usage:
    python3 tests/device/data_parallel_on_devices.py HSX_BINARY NUM_GPUS
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "data" / "models" / "qwen3"


def main():
    hsx, gpus = sys.argv[1], int(sys.argv[2])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        rng = np.random.default_rng(0)
        with open(tmp / "p.jsonl", "w") as f:
            for i in range(64):
                f.write(json.dumps({"id": f"q{i}", "token_ids": rng.integers(0, 512, int(rng.integers(16, 300))).tolist()}) + "\n")

        def extract(out, *extra):
            return subprocess.run([hsx, "extract", "--model", str(MODEL), "--layers", "0,2,4", "--input", str(tmp / "p.jsonl"),
                                   "--output", str(out), "--batch-invariant", *extra], capture_output=True, text=True, timeout=600)

        one = extract(tmp / "one", "--device", "cuda:0")
        many = extract(tmp / "many", "--device", "cuda", "--data-parallel-size", str(gpus))
        if one.returncode or many.returncode:
            failures.append(f"extract failed: {one.stderr[-2000:]} {many.stderr[-2000:]}")
        else:
            files = lambda d: {p.name: p.read_bytes() for p in d.glob("*.safetensors")}
            a, b = files(tmp / "one"), files(tmp / "many")
            if len(a) != 64 or a != b:
                failures.append(f"files differ: {sorted(n for n in a if a.get(n) != b.get(n))[:8]}")
            counts = [int(n) for n in re.search(r"requests per replica: ([\d, ]+)", many.stderr).group(1).split(", ")]
            if len(counts) != gpus or min(counts) == 0:
                failures.append(f"replicas idle: {counts}")
            print(json.dumps({"check": "extract_dp_equals_one", "gpus": gpus, "requests_per_replica": counts}))
        over = extract(tmp / "over", "--device", "cuda", "--data-parallel-size", str(gpus + 1))
        if over.returncode == 0 or f"--data-parallel-size {gpus + 1}: replica {gpus} on cuda:{gpus}" not in over.stderr \
                or (tmp / "over").exists():
            failures.append(f"more replicas than GPUs: {over.returncode} {over.stderr[-1000:]}")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
