#!/usr/bin/env bash
# Runs on the device machine with prebuilt binaries (BIN, default .devbin; see
# scripts/device_bundle.sh): the CUDA and batch-invariance tests, the Qwen3-8B extraction
# bench with and without --batch-invariant alternately (A B A B), and a file check at full
# size: the same prompts extracted under two token budgets must give identical files with
# --batch-invariant (and, for comparison, how many differ without it). Results go to $OUT.
set -uo pipefail
here=$(pwd)
bin=${BIN:-.devbin}
export LD_LIBRARY_PATH="$here/$bin:${LD_LIBRARY_PATH:-}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"

HSX_TEST_DATA="${HSX_TEST_DATA:-$here/tests/data}" timeout 240 "$bin/hsx_tests" --gtest_filter='*Cuda*:*BatchInvariant*' \
  >"$OUT/tests.log" 2>&1
echo "tests exit $?"
grep -E "^\[  (PASSED|FAILED|  SKIPPED) |differs|Failure|default mode differs" "$OUT/tests.log" | head -60

dir=/dev/shm/hsx-bi
bench() {
  "$bin/hsx" bench --device cuda --model qwen3-8b --load-format dummy --num-prompts 256 --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,18,33,36 --max-num-batched-tokens 16384 --kv-cache-gib 40 \
    --dir "$dir" "$@" 2>/dev/null | grep extract_tokens_per_s
}
for round in 1 2; do
  echo "A default $(bench)"
  echo "B batch-invariant $(bench --batch-invariant)"
done | tee "$OUT/ab.txt"

# Full-size files: 48 of the bench's prompts under budgets 16384 and 1000 (chunked, other batches).
head -48 "$dir/prompts.jsonl" >"$dir/check.jsonl"
for mode in "--batch-invariant" ""; do
  for budget in 16384 1000; do
    rm -rf "$dir/out-$budget"
    env ${PROFILE:-} "$bin/hsx" extract --device cuda --model qwen3-8b --load-format dummy --layers 2,18,33,36 \
      --input "$dir/check.jsonl" --output "$dir/out-$budget" --max-num-batched-tokens "$budget" --kv-cache-gib 40 \
      $mode 2>>"$OUT/extract.err" >/dev/null
  done
  same=0 differ=0
  for f in "$dir"/out-16384/*.safetensors; do
    if cmp -s "$f" "$dir/out-1000/$(basename "$f")"; then same=$((same + 1)); else differ=$((differ + 1)); fi
  done
  echo "${mode:-default}: $same files identical, $differ differ between budgets 16384 and 1000" | tee -a "$OUT/files.txt"
done
