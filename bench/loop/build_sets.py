"""Glue between hsx's JSONL and speculators' prepared dataset (device side, stdlib plus
`datasets` for the last two commands).

  pretok PROMPTS GENERATED OUT     prompt ids + hsx generate's answer ids -> speculators'
                                   pre-tokenized rows {"input_ids", "loss_mask"} (loss on the
                                   answer, its end-of-turn token included)
  extract-input DATASET OUT        the prepared (shuffled) dataset's rows -> hsx extract's input,
                                   {"id": "hs_<row>", "token_ids"}: row r's states land in
                                   hs_<r>.safetensors, the name speculators' FileTransfer reads
  subset FULL SUB FULL_STATES SUB_STATES
                                   a smaller prepared dataset (prepare-data --max-samples) linked
                                   to the full one's state files, matched by their tokens
"""
import json
import os
import sys


def pretok(prompts, generated, out):
    answers = {}
    with open(generated) as f:
        for line in f:
            r = json.loads(line)
            answers[r["id"]] = r["token_ids"]
    kept = 0
    with open(prompts) as f, open(out, "w") as o:
        for line in f:
            p = json.loads(line)
            answer = answers.get(p["id"])
            if not answer:
                continue
            o.write(json.dumps({"input_ids": p["token_ids"] + answer,
                                "loss_mask": [0] * len(p["token_ids"]) + [1] * len(answer)}) + "\n")
            kept += 1
    print(json.dumps({"pretokenized_rows": kept, "answers": len(answers)}))


def extract_input(dataset, out):
    from datasets import load_from_disk
    data = load_from_disk(dataset).with_format(None)
    with open(out, "w") as o:
        for row, ids in enumerate(data["input_ids"]):
            o.write(json.dumps({"id": f"hs_{row}", "token_ids": ids}) + "\n")
    print(json.dumps({"extract_rows": len(data)}))


def subset(full, sub, full_states, sub_states):
    from datasets import load_from_disk
    where = {tuple(ids): row for row, ids in enumerate(load_from_disk(full).with_format(None)["input_ids"])}
    os.makedirs(sub_states, exist_ok=True)
    rows = load_from_disk(sub).with_format(None)["input_ids"]
    for row, ids in enumerate(rows):
        target = os.path.join(full_states, f"hs_{where[tuple(ids)]}.safetensors")
        link = os.path.join(sub_states, f"hs_{row}.safetensors")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)
    print(json.dumps({"subset_rows": len(rows), "states": sub_states}))


if __name__ == "__main__":
    {"pretok": pretok, "extract-input": extract_input, "subset": subset}[sys.argv[1]](*sys.argv[2:])
