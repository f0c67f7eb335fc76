"""Combines the JSON lines of `hsx bench` and hf_baseline.py from one device run into
ratios: hsx against each HF way, and hsx's model FLOP utilization against the bf16
matmul peak measured in the same run."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
by = {r["metric"]: r for r in rows}
hsx = by["extract_tokens_per_s"]
out = {"hsx_tok_s": hsx["value"], "hsx_tflops": hsx["value"] * hsx["flops_per_token"] / 1e12,
       "hsx_peak_device_gib": hsx.get("peak_device_gib")}
if "bf16_matmul_peak_tflops" in by:  # measured with the HF baselines (HF=0 skips both)
    out["peak_tflops"] = by["bf16_matmul_peak_tflops"]["value"]
    out["hsx_mfu"] = out["hsx_tflops"] / out["peak_tflops"]
for name in ("hf_one_at_a_time_tokens_per_s", "hf_sorted_batches_32k_tokens_per_s"):
    if name in by:
        out[name] = by[name]["value"]
        out["ratio_vs_" + name.replace("_tokens_per_s", "")] = hsx["value"] / by[name]["value"]
print(json.dumps(out))
