"""Speculative decoding against plain decode from one call's `hsx bench --decode` lines
(bench/device_run.sh specadaptive, mtpadaptive): each speculative run's tok/s over the mean
of the plain runs at its batch (run first and last, so their difference shows the call's
drift), for the decode phase and end to end (prefill included: the figure where the KV
cache holds only part of the batch and requests run in waves).

Usage: python3 bench/speculative_ratios.py RUNS.jsonl   (prints one JSON line per run)"""
import json
import sys


def main(path):
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    plain = {}
    for r in runs:
        if "speculative_config" not in r:
            plain.setdefault(r["batch"], []).append(r)
    for r in runs:
        base = plain.get(r["batch"], [])
        if "speculative_config" not in r or not base:
            continue
        out = {"batch": r["batch"], "speculative_config": json.loads(r["speculative_config"]),
               "forced_accept_rate": r.get("forced_accept_rate"),
               "mean_acceptance_length": r.get("mean_acceptance_length"),
               "plain_runs": [p["value"] for p in base],
               "x_plain": r["value"] / (sum(p["value"] for p in base) / len(base))}
        whole = [p["end_to_end_tokens_per_s"] for p in base if "end_to_end_tokens_per_s" in p]
        if whole and "end_to_end_tokens_per_s" in r:
            out["x_plain_end_to_end"] = r["end_to_end_tokens_per_s"] / (sum(whole) / len(whole))
        if "draft_length" in r:
            out["request_steps_by_k"] = r["draft_length"]["request_steps_by_k"]
            if "probe_drafts" in r["draft_length"]:
                out["probe_drafts"] = r["draft_length"]["probe_drafts"]
        print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
