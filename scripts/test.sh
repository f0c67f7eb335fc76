#!/usr/bin/env bash
# Installs dependencies, builds hsx with warnings as errors, and runs every test, then
# runs the suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DHSX_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
# The server against real clients: openai, and speculators' data-generation client
# (installed without its heavy dependencies; only its openai-based client module is used).
python3 -m pip install --quiet --disable-pip-version-check openai pytest numpy
# ml_dtypes (JAX's numpy dtypes): the E4M3 rounding reference for hs-connectors' FP8 files.
python3 -m pip install --quiet --disable-pip-version-check ml_dtypes
# The tokenizer against Hugging Face: tokenizers (the reference), transformers and gguf (the
# reference encode, and the conversion of real models' GGUF tokenizers); gguf is also the
# reference for GGUF reading and dequantization, safetensors writes the converted GGUF
# model's directory; no torch needed. Chat templates against jinja2 and transformers'
# apply_chat_template (which needs jinja2).
python3 -m pip install --quiet --disable-pip-version-check tokenizers transformers gguf safetensors "jinja2>=3.1.6"
python3 -m pip install --quiet --disable-pip-version-check --no-deps speculators
# speculators' own HTTP clients, which its --no-deps install leaves out: httpx (prepare-data's
# render client) and aiohttp (regenerate-responses' chat poster). Both are small, pure clients.
python3 -m pip install --quiet --disable-pip-version-check httpx aiohttp
# The Mooncake capture sink against the real store and reader: Mooncake's CPU wheel (the store's
# Python client and mooncake_master) and hs-connectors (--no-deps: it needs torch and vLLM, which
# the test replaces by tests/python/torch_numpy_shim.py where torch does not import).
python3 -m pip install --quiet --disable-pip-version-check mooncake-transfer-engine-non-cuda
python3 -m pip install --quiet --disable-pip-version-check --no-deps hs-connectors==0.9.0
# PyTorch and what speculators' CLIs and trainer import, in a site of their own (see the
# script): tests/python/test_speculators_cli.py and test_toy_loop.py run speculators' own
# command lines from it, and fail rather than skip here where it is missing.
HSX_TORCH_SITE=$(bash scripts/install_torch.sh)
HSX_BINARY="$PWD/build/src/hsx" HSX_TORCH_SITE="$HSX_TORCH_SITE" HSX_REQUIRE_TORCH=1 python3 -m pytest tests/python -q
# Sanitizers cover the host code; the CUDA backend is compiled (and its tests skip
# without a GPU) in the first build.
cmake -S . -B build-asan -G Ninja -DHSX_WERROR=ON -DHSX_SANITIZE=ON -DHSX_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs"
