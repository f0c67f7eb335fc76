#!/usr/bin/env python3
"""Summarizes one decode step from an Nsight Compute CSV log (bench/device_run.sh decodeprofile).

ncu serializes kernels, so its durations are each kernel alone: their sum is more than a
graph step takes, but the per-kernel figures say where the time goes. The step is the
kernels after the last-but-one sampling kernel (SampleKernel or GreedyTokensKernel) up to the last.
Prints one JSON line per kernel name (count, total and mean microseconds, DRAM bytes and
TB/s), then a line with the step's totals.

Usage: ncu_decode_step.py LOG.csv [--per-layer LAYERS]
"""
import argparse
import csv
import json
import re
import sys
from collections import OrderedDict

TIME_UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}


def read_kernels(path):
    """Kernels in launch order: dicts of name, grid, us (duration), bytes (DRAM read + write)."""
    kernels = OrderedDict()
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu prefixes its own messages with ==
    for row in csv.DictReader(lines):
        key = row["ID"]
        k = kernels.setdefault(key, {"name": row["Kernel Name"], "grid": row.get("Grid Size", ""), "us": 0.0,
                                     "bytes": 0.0})
        metric, unit = row["Metric Name"], row["Metric Unit"]
        value = float(row["Metric Value"].replace(",", "") or 0)
        if metric == "gpu__time_duration.sum":
            k["us"] = value * TIME_UNITS[unit]
        elif metric.startswith("dram__bytes_"):
            k["bytes"] += value * BYTE_UNITS[unit]
    return list(kernels.values())


def short_name(name):
    """A kernel's name without its namespaces, arguments and most template arguments."""
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"^(void )?", "", name)
    base = re.sub(r"<.*", "", name).split("::")[-1]
    args = re.search(r"<(.*)>", name)
    return f"{base}<{args.group(1)[:24]}>" if args and len(args.group(1)) <= 24 else base


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--per-layer", type=int, default=0, help="also print counts and times per layer")
    args = parser.parse_args()
    kernels = read_kernels(args.log)
    ends = [i for i, k in enumerate(kernels) if re.search(r"SampleKernel|GreedyTokensKernel", k["name"])]
    if len(ends) < 2:
        sys.exit(f"{args.log}: fewer than two sampling kernels; no whole decode step to summarize")
    step = kernels[ends[-2] + 1:ends[-1] + 1]
    groups = OrderedDict()
    for k in step:
        g = groups.setdefault(short_name(k["name"]), {"count": 0, "us": 0.0, "bytes": 0.0, "grid": k["grid"]})
        g["count"] += 1
        g["us"] += k["us"]
        g["bytes"] += k["bytes"]
    for name, g in sorted(groups.items(), key=lambda item: -item[1]["us"]):
        line = {"kernel": name, "count": g["count"], "total_us": round(g["us"], 1),
                "mean_us": round(g["us"] / g["count"], 2), "grid": g["grid"],
                "tb_per_s": round(g["bytes"] / (g["us"] * 1e-6) / 1e12, 2) if g["us"] > 0 else 0.0}
        if args.per_layer:
            line["per_layer"] = round(g["count"] / args.per_layer, 2)
        print(json.dumps(line))
    total_us = sum(k["us"] for k in step)
    total_bytes = sum(k["bytes"] for k in step)
    print(json.dumps({"step_kernels": len(step), "step_us": round(total_us, 1),
                      "step_gb": round(total_bytes / 1e9, 3),
                      "tb_per_s": round(total_bytes / (total_us * 1e-6) / 1e12, 2) if total_us else 0.0}))


if __name__ == "__main__":
    main()
