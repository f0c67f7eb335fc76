#!/usr/bin/env bash
# Installs hsx's build and test dependencies from Debian's packages. Idempotent:
# packages already present are skipped, so a warm machine pays only the dpkg check.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev   # JSON config / JSONL / tokenizer.json parsing
  libdnnl-dev          # CPU f32 GEMM (oneDNN's sgemm) for the reference backend
  libopenblas-dev      # the GEMM without oneDNN (-DHSX_CPU_GEMM=OpenBLAS); hsx bench's comparison
  libpcre2-dev         # Unicode-aware regex for tokenizer pre-tokenization
  libutf8proc-dev      # NFC normalization and UTF-8 handling
  libcli11-dev         # command-line parsing
  libcpp-httplib-dev   # HTTP server for hsx serve
  libgtest-dev         # unit tests
  python3-pip          # the demo model and the python tests' packages come from PyPI
  libibverbs1          # rdma-core's verbs library, which PyPI's Mooncake wheels link (tests/python/test_mooncake_sink.py)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
