"""One-pass regenerate-and-extract against two passes, on the device: conversations/s and
tok/s of `hsx extract --regenerate` against `hsx generate` then `hsx extract` on the
generated conversations, greedy both ways (so the two must give the same tokens, checked).

The model is the Qwen3-8B shape with dummy weights and the test tokenizer (3,000 tokens,
ChatML), so the vocabulary, and the LM head, are smaller than Qwen3-8B's. Each process's
time includes loading the model; a load-only run is measured and reported beside it.
Prints JSON lines. Usage: python3 bench/regenerate_bench.py HSX_BINARY [N] [MAX_TOKENS]"""
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
HSX = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 256
MAX_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 256
LAYERS = "1,2" if os.environ.get("HSX_REGEN_SMOKE") == "1" else "2,18,33,36"
TEMPLATE = ("{% for message in messages %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SMOKE = os.environ.get("HSX_REGEN_SMOKE") == "1"  # a tiny model on the CPU: the script's own check
COMMON = ["--load-format", "dummy", "--device", "cpu" if SMOKE else "cuda", "--kv-cache-gib", "1" if SMOKE else "40",
          *os.environ.get("REGEN_ARGS", "").split()]  # e.g. REGEN_ARGS=--enforce-eager for every run


def run(*args):
    t0 = time.perf_counter()
    r = subprocess.run([HSX, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{args[0]} failed: {r.stderr[-2000:]}")
    # The runs' engine stage times, and with HSX_PROFILE=1 their step profiles, to stderr.
    sys.stderr.write(f"== {args[0]} {' '.join(map(str, args[-4:]))}: {time.perf_counter() - t0:.2f} s\n")
    sys.stderr.write("".join(l + "\n" for l in r.stderr.splitlines() if l.startswith(("hsx profile", "hsx extract: engine"))))
    return time.perf_counter() - t0, r.stdout


def read_ids(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    begin, end = header["token_ids"]["data_offsets"]
    data = raw[8 + n + begin:8 + n + end]
    return [int.from_bytes(data[i:i + 8], "little", signed=True) for i in range(0, len(data), 8)]


def main():
    work = pathlib.Path(tempfile.mkdtemp(prefix="hsx-regen-"))
    model = work / "model"
    model.mkdir()
    tokenizer = json.loads((ROOT / "tests/data/tokenizers/bpe_qwen2/tokenizer.json").read_text())
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    shape = ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 128} if SMOKE else
             {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "intermediate_size": 12288})
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", **shape,
        "vocab_size": 3000, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "max_position_embeddings": 40960, "tie_word_embeddings": False, "eos_token_id": 2}))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (model / "chat_template.jinja").write_text(TEMPLATE)
    words = [t for t in tokenizer["model"]["vocab"] if t.isalpha()]
    rng = random.Random(0)
    conversations = work / "conversations.jsonl"
    with open(conversations, "w") as f:
        for i in range(N):
            question = " ".join(rng.choice(words) for _ in range(rng.randint(100, 400)))
            f.write(json.dumps({"id": f"c{i}", "messages": [
                {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question},
                {"role": "assistant", "content": "(to regenerate)"}]}) + "\n")
    questions = work / "questions.jsonl"  # what generate answers: the conversation before the answer
    with open(questions, "w") as f:
        for line in conversations.read_text().splitlines():
            c = json.loads(line)
            f.write(json.dumps({"id": c["id"], "messages": c["messages"][:2], "add_generation_prompt": True}) + "\n")

    # A process that loads the model and has nothing to run (max-tokens 0 would still prefill).
    empty = work / "empty.jsonl"
    empty.write_text("")
    load_s = min(run("generate", "--model", model, *COMMON, "--input", empty)[0] for _ in range(2))

    # Two passes: generate, then extract the prompts with their answers and the template's end.
    gen_s, out = run("generate", "--model", model, *COMMON, "--input", questions, "--max-tokens", MAX_TOKENS)
    answers = {r["id"]: r["token_ids"] for r in map(json.loads, out.splitlines())}
    _, rendered = run("chat-template", "--model", model, "--input", questions)
    prompts = {}
    for line, text in zip(questions.read_text().splitlines(), rendered.splitlines()):
        prompts[json.loads(line)["id"]] = json.loads(text)["text"]
    finals = work / "finals.jsonl"
    tok_prompts = work / "prompt_texts.jsonl"
    tok_prompts.write_text("".join(json.dumps({"text": prompts[k]}) + "\n" for k in sorted(prompts)) +
                           json.dumps({"text": "<|im_end|>\n"}) + "\n")
    _, ids_out = run("tokenize", "--tokenizer", model / "tokenizer.json", "--input", tok_prompts,
                     "--add-special-tokens", "false")
    ids = [json.loads(line)["ids"] for line in ids_out.splitlines()]
    end_ids = ids[-1]
    prompt_ids = dict(zip(sorted(prompts), ids))
    total_tokens = 0
    with open(finals, "w") as f:
        for k in sorted(prompts):
            answer = answers[k]
            tail = end_ids[1:] if answer and answer[-1] == 2 else end_ids  # a generated <|im_end|> stands for its own
            tokens = prompt_ids[k] + answer + tail
            total_tokens += len(tokens)
            f.write(json.dumps({"id": k, "token_ids": tokens}) + "\n")
    ext_s, _ = run("extract", "--model", model, *COMMON, "--layers", LAYERS, "--input", finals, "--output", work / "two")

    # One pass.
    one_s, _ = run("extract", "--model", model, *COMMON, "--layers", LAYERS, "--input", conversations,
                   "--output", work / "one", "--regenerate", "--temperature", "0", "--max-tokens", MAX_TOKENS)
    same = sum(read_ids(work / "one" / f"{k}.safetensors") == json.loads(line)["token_ids"]
               for k, line in zip(sorted(prompts), finals.read_text().splitlines()))
    two_s = gen_s + ext_s
    for name, seconds, loads in (("two_passes", two_s, 2), ("one_pass", one_s, 1)):
        print(json.dumps({"metric": "regenerate_and_extract", "mode": name, "conversations": N,
                          "tokens": total_tokens, "seconds": round(seconds, 2),
                          "conversations_per_s": round(N / seconds, 2), "tokens_per_s": round(total_tokens / seconds, 1),
                          "seconds_without_loading": round(seconds - loads * load_s, 2),
                          "tokens_per_s_without_loading": round(total_tokens / (seconds - loads * load_s), 1),
                          "model": "qwen3-8b shape, 3000-token vocabulary, dummy weights", "max_tokens": MAX_TOKENS,
                          "layers": LAYERS}))
    print(json.dumps({"metric": "regenerate_one_pass_over_two", "value": round(two_s / one_s, 3),
                      "without_loading": round((two_s - 2 * load_s) / (one_s - load_s), 3),
                      "generate_s": round(gen_s, 2), "extract_s": round(ext_s, 2), "load_s": round(load_s, 2),
                      "same_tokens": f"{same}/{N}"}))


if __name__ == "__main__":
    main()
