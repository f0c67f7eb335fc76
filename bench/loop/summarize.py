"""The loop's figures from OUT (device.sh's results): tok/s per label and batch against plain
decode, acceptance, the hsx/HF acceptance ratio, and how many greedy outputs equal plain
decode's. Usage: python3 summarize.py OUT"""
import json
import os
import re
import sys


def load_outputs(path):
    if not os.path.exists(path):
        return None
    return {r["id"]: r["token_ids"] for r in map(json.loads, open(path))}


def main(out):
    rows = []
    path = os.path.join(out, "serve.jsonl")
    if os.path.exists(path):
        rows = [json.loads(line) for line in open(path) if line.strip()]
    plain = {r["clients"]: r for r in rows if r["label"] == "plain"}
    print(f"{'label':18} {'batch':>5} {'prompts':>7} {'tok/s':>9} {'x plain':>8} {'accept len':>10}  per position   same as plain")
    accept = {}
    for r in rows:
        base = plain.get(r["clients"])
        speed = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        same = ""
        mine = load_outputs(os.path.join(out, "outputs", f"{r['label']}_c{r['clients']}.jsonl"))
        ref = load_outputs(os.path.join(out, "outputs", f"plain_c{r['clients']}.jsonl"))
        if mine and ref and r["label"] != "plain":
            equal = sum(1 for k in mine if ref.get(k) == mine[k])
            same = f"{equal}/{len(mine)}"
        if r["clients"] == 32:
            accept[r["label"]] = r.get("mean_acceptance_length")
        print(f"{r['label']:18} {r['clients']:>5} {r['completed']:>7} {r['tokens_per_s']:>9.1f} {speed:>8.2f} "
              f"{r.get('mean_acceptance_length', ''):>10}  {r.get('acceptance_rate_per_position', '')}  {same}")
    for other, metric in (("eagle3_hf", "acceptance_length_hsx_over_hf"), ("eagle3_fp8", "acceptance_length_fp8_over_hsx")):
        a, b = ("eagle3_hsx", other) if other == "eagle3_hf" else (other, "eagle3_hsx")
        if accept.get(a) and accept.get(b):
            print(json.dumps({"metric": metric, "value": round(accept[a] / accept[b], 4), a: accept[a], b: accept[b]}))
    # speculators' own validation (the same held-back rows for every draft trained on the full set):
    # full_acc_k = all draft tokens up to position k right, so 1 + sum(full_acc) is the acceptance
    # length teacher forcing predicts
    val = {}
    for name in ("hsx", "hf", "fp8", "small"):
        p = os.path.join(out, f"train_{name}.log")
        if not os.path.exists(p):
            continue
        text = open(p).read().replace("\r", "\n")
        acc = {}
        for k, v in re.findall(r"val/full_acc_(\d+)_epoch=([0-9.]+)", text):
            acc[int(k)] = float(v)  # the last epoch's values win
        loss = re.findall(r"val/loss_epoch=([0-9.]+)", text)
        if acc:
            val[name] = 1 + sum(acc.values())
            print(json.dumps({"metric": "val_full_acc_per_position", "draft": name, "value": [acc[k] for k in sorted(acc)],
                              "implied_acceptance_length": round(val[name], 4), "val_loss": float(loss[-1]) if loss else None}))
    if val.get("hsx") and val.get("hf"):
        print(json.dumps({"metric": "val_acceptance_length_hsx_over_hf", "value": round(val["hsx"] / val["hf"], 4)}))
    if val.get("hsx") and val.get("fp8"):
        print(json.dumps({"metric": "val_acceptance_length_fp8_over_hsx", "value": round(val["fp8"] / val["hsx"], 4)}))
    p1 = load_outputs(os.path.join(out, "outputs", "plain_c1.jsonl"))
    p32 = load_outputs(os.path.join(out, "outputs", "plain_c32.jsonl"))
    if p1 and p32:  # how far plain decode itself depends on the batch (bf16, no --batch-invariant)
        print(f"plain decode, batch 1 against batch 32: {sum(1 for k in p1 if p32.get(k) == p1[k])}/{len(p1)} outputs equal")
    for name in ("exact", "compare"):
        p = os.path.join(out, f"{name}.log")
        if os.path.exists(p):
            lines = open(p).read().strip().splitlines()
            print(f"{name}: {lines[-1] if lines else ''}")


if __name__ == "__main__":
    main(sys.argv[1])
