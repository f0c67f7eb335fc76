#!/usr/bin/env bash
# Installs dependencies, builds hsx, and extracts the hidden states of layers 1, 2 and 4
# for the example prompts with the bundled tiny model, printing each file it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)"
out=${1:-/tmp/hsx-demo}
rm -rf "$out"
./build/src/hsx extract --model examples/tiny-qwen3 --layers 1,2,4 --input examples/prompts.jsonl --output "$out"
