"""The bf16 matmul peak of this GPU as torch reaches it (8192^3, random data): the
denominator of every MFU figure, measured in the same device run as the figure. Run as a
script, prints one JSON line."""
import json

import torch


def matmul_peak_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (start.elapsed_time(end) / 1e3) / 1e12


def peak_line():
    return json.dumps({"metric": "bf16_matmul_peak_tflops", "value": matmul_peak_tflops(),
                       "what": "torch 8192^3 bf16, random data"})


if __name__ == "__main__":
    print(peak_line(), flush=True)
