#!/usr/bin/env bash
# Runs on the device machine (through the device tool) with prebuilt binaries carried in
# .devbin/: the CUDA tests, then the Qwen3-8B extraction benchmark against Hugging Face.
# Usage: bash bench/device_run.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
here=$(pwd)
export LD_LIBRARY_PATH="$here/.devbin:${LD_LIBRARY_PATH:-}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
if [ "$what" != bench ]; then
  HSX_TEST_DATA="$here/tests/data" .devbin/hsx_tests --gtest_filter='*Cuda*' 2>&1 | tee "$OUT/tests.log" | grep -E "^\[bf16\]|OK|FAILED|Failure|Expected|actual|error" | head -60
fi
if [ "$what" != tests ]; then
  dir=/dev/shm/hsx-bench
  .devbin/hsx bench --device cuda --model qwen3-8b --load-format dummy --num-prompts 256 --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,18,33,36 --max-num-batched-tokens 16384 --kv-cache-gib 40 \
    --dir "$dir" 2>"$OUT/bench.err" | tee "$OUT/bench.jsonl"
  tail -3 "$OUT/bench.err"
  if [ "${HF:-1}" = 1 ]; then
    python3 bench/hf_baseline.py "$dir/prompts.jsonl" /dev/shm/hf-out 2,18,33,36 2>"$OUT/hf.err" | tee -a "$OUT/bench.jsonl"
    tail -3 "$OUT/hf.err"
  fi
  python3 bench/report.py "$OUT/bench.jsonl"
fi
