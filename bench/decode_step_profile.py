#!/usr/bin/env python3
"""Where a decode step's time goes, from an Nsight Compute CSV or a kernel timeline
(bench/kernel_trace.cpp's, or Nsight Systems'): bench/device_run.sh decodeprofile.

- ncu (`ncu --csv --log-file`): each kernel measured alone, serialized, with its DRAM bytes.
  Durations add up to more than a graph step takes, but say what each kernel costs.
- a timeline (bench/kernel_trace.cpp, or `nsys stats --report cuda_gpu_trace --format csv`
  of a trace taken with --cuda-graph-trace=node): the kernels as a CUDA graph replays them,
  with the idle gap before each: what the step really spends, launch latency included. Where
  kernels overlap (programmatic launches) durations and gaps mislead, so each kernel also
  gets its advance: how far its end moved the latest end so far, idle time included. A
  step's advances add up to its wall time, each share given to the kernel that ended it.

A step is the kernels after one sampling kernel (SampleKernel or GreedyTokensKernel) up to
the next; the summary averages the last --steps decode steps (split-KV attention, no
prefill kernels) of the largest batch in the log. Prints one JSON line per
kernel name and grid (the grid only where a kernel runs with several: launches per step,
microseconds per step and per launch, the gaps before its launches and its advances for a
timeline, TB/s for ncu), most time first, then the step's totals.

Usage: decode_step_profile.py LOG.csv [--steps N] [--layers L]
"""
import argparse
import csv
import json
import re
import sys
from collections import OrderedDict

TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}
STEP_END = re.compile(r"SampleKernel|GreedyTokensKernel")
DECODE = re.compile(r"DecodeKernel")
PREFILL = re.compile(r"HopperKernel|NormRopeStoreRowsKernel|FlashKernel")


def grid_blocks(grid):
    """Blocks in a "(x, y, z)" grid."""
    x, y, z = (int(v) for v in re.findall(r"\d+", grid)[:3])
    return x * y * z


def read_ncu(rows):
    """Kernels in launch order from ncu's one-row-per-metric CSV."""
    kernels = OrderedDict()
    for row in rows:
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row["Grid Size"], "us": 0.0,
                                           "bytes": 0.0, "gap_us": None, "advance_us": None})
        metric, unit = row["Metric Name"], row["Metric Unit"]
        value = float(row["Metric Value"].replace(",", "") or 0)
        if metric == "gpu__time_duration.sum":
            k["us"] = value * TIME_UNITS[unit]
        elif metric.startswith("dram__bytes_"):
            k["bytes"] += value * BYTE_UNITS[unit]
    return list(kernels.values())


def read_timeline(rows):
    """Kernels in start order from a GPU trace (memcpys and memsets left out)."""
    kernels, end, latest = [], None, None
    for row in sorted(rows, key=lambda r: int(r["Start (ns)"])):
        if not row.get("GrdX"):  # a copy or set, not a kernel
            continue
        start, duration = int(row["Start (ns)"]), int(row["Duration (ns)"])
        grid = f'({row["GrdX"]}, {row["GrdY"]}, {row["GrdZ"]})'
        kernels.append({"name": row["Name"], "grid": grid, "us": duration / 1e3, "bytes": None,
                        "gap_us": (start - end) / 1e3 if end is not None else 0.0,
                        "advance_us": max(0, start + duration - latest) / 1e3 if latest is not None else 0.0})
        end = start + duration
        latest = end if latest is None else max(latest, end)
    return kernels


def read_kernels(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"') or line[:1].isalnum()]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{path}: no CSV rows")
    return read_ncu(rows) if "Metric Name" in rows[0] else read_timeline(rows)


def short_name(name):
    """A kernel's name without namespaces and arguments, with short template arguments."""
    name = re.sub(r"\(.*", "", re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", name))
    name = re.sub(r"^void ", "", name)
    base = re.sub(r"<.*", "", name).split("::")[-1]
    targs = re.search(r"<(.*)>", name)
    return f"{base}<{targs.group(1)}>" if targs and len(targs.group(1)) <= 24 else base


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--steps", type=int, default=1, help="average over the last N whole steps")
    parser.add_argument("--layers", type=int, default=0, help="also print launches per layer")
    args = parser.parse_args()
    kernels = read_kernels(args.log)
    # Decode steps: segments ending in a sampling kernel with split-KV attention and no
    # prefill attention; of those, the ones of the bench's batch (the sampling grid most of
    # them have), since a bench also runs a few smaller steps.
    ends = [i for i, k in enumerate(kernels) if STEP_END.search(k["name"])]
    segments = [kernels[a + 1:b + 1] for a, b in zip(ends, ends[1:])]
    decode = [seg for seg in segments if any(DECODE.search(k["name"]) for k in seg)
              and not any(PREFILL.search(k["name"]) for k in seg)]
    if not decode:
        sys.exit(f"{args.log}: no whole decode step between two sampling kernels")
    grids = [grid_blocks(seg[-1]["grid"]) for seg in decode]
    usual = max(set(grids), key=grids.count)
    chosen = [seg for seg, grid in zip(decode, grids) if grid == usual][-args.steps:]
    steps = len(chosen)
    step = [k for seg in chosen for k in seg]
    # A kernel launched with several grids (the GEMV of each projection) is one entry a grid.
    grids_of = {}
    for k in step:
        grids_of.setdefault(short_name(k["name"]), set()).add(k["grid"])
    groups = OrderedDict()
    for k in step:
        name = short_name(k["name"])
        g = groups.setdefault(name if len(grids_of[name]) == 1 else f"{name} {k['grid']}",
                              {"launches": 0, "us": 0.0, "gap_us": 0.0, "advance_us": 0.0, "bytes": 0.0})
        g["launches"] += 1
        g["us"] += k["us"]
        g["gap_us"] += k["gap_us"] or 0.0
        g["advance_us"] += k["advance_us"] or 0.0
        g["bytes"] += k["bytes"] or 0.0
    has_gaps, has_bytes = step[0]["gap_us"] is not None, step[0]["bytes"] is not None
    # Most time first: for a timeline the wall time each ended, else the kernels' own.
    cost = (lambda g: g["advance_us"]) if has_gaps else (lambda g: g["us"])
    for name, g in sorted(groups.items(), key=lambda item: -cost(item[1])):
        line = {"kernel": name, "launches_per_step": round(g["launches"] / steps, 2),
                "us_per_step": round(g["us"] / steps, 1), "us_per_launch": round(g["us"] / g["launches"], 2)}
        if has_gaps:
            line["gap_us_per_step"] = round(g["gap_us"] / steps, 1)
            line["advance_us_per_step"] = round(g["advance_us"] / steps, 1)
        if has_bytes and g["us"] > 0:
            line["tb_per_s"] = round(g["bytes"] / (g["us"] * 1e-6) / 1e12, 2)
        if args.layers:
            line["launches_per_layer"] = round(g["launches"] / steps / args.layers, 2)
        print(json.dumps(line))
    total = {"steps": steps, "kernels_per_step": round(len(step) / steps, 1),
             "kernel_us_per_step": round(sum(k["us"] for k in step) / steps, 1)}
    if has_gaps:
        total["gap_us_per_step"] = round(sum(k["gap_us"] for k in step) / steps, 1)
        total["wall_us_per_step"] = round(sum(k["advance_us"] for k in step) / steps, 1)
    if has_bytes:
        total["gb_per_step"] = round(sum(k["bytes"] for k in step) / steps / 1e9, 3)
    print(json.dumps(total))


if __name__ == "__main__":
    main()
