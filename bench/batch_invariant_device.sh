#!/usr/bin/env bash
# Runs on the device machine with prebuilt binaries (BIN, default .devbin; see
# scripts/device_bundle.sh): the CUDA and batch-invariance tests, the Qwen3-8B extraction
# bench with and without --batch-invariant alternately (A B A B), and a file check at full
# size: the same prompts extracted in big steps, in 64-token chunks and one at a time must
# give identical files with --batch-invariant (and, for comparison, how many differ
# without it). Results go to $OUT. TESTS=0 skips the tests, AB=0 the bench.
set -uo pipefail
here=$(pwd)
bin=${BIN:-.devbin}
export LD_LIBRARY_PATH="$here/$bin:${LD_LIBRARY_PATH:-}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${TESTS:-1}" = 1 ]; then
HSX_TEST_DATA="${HSX_TEST_DATA:-$here/tests/data}" timeout 240 "$bin/hsx_tests" --gtest_filter='*Cuda*:*BatchInvariant*' \
  >"$OUT/tests.log" 2>&1
echo "tests exit $?"
grep -E "^\[  (PASSED|FAILED|  SKIPPED) |differs|Failure" "$OUT/tests.log" | head -60
fi

dir=/dev/shm/hsx-bi
bench() {
  "$bin/hsx" bench --device cuda --model qwen3-8b --load-format dummy --num-prompts "${prompts:-256}" --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,18,33,36 --max-num-batched-tokens 16384 --kv-cache-gib 40 \
    --dir "$dir" "$@" 2>/dev/null | grep extract_tokens_per_s
}
if [ "${AB:-1}" = 1 ]; then
  for round in 1 2; do
    echo "A default $(bench)"
    echo "B batch-invariant $(bench --batch-invariant)"
  done | tee "$OUT/ab.txt"
else  # the check below needs the bench's prompts
  prompts=48 bench >/dev/null
fi

# Full-size files: 48 of the bench's prompts under a 16384-token budget, against a 64-token
# budget (small chunks, small m) and one prompt at a time (--max-num-seqs 1).
head -48 "$dir/prompts.jsonl" >"$dir/check.jsonl"
for mode in "--batch-invariant" ""; do
  for run in "big --max-num-batched-tokens 16384" "chunked --max-num-batched-tokens 64" "single --max-num-seqs 1"; do
    set -- $run
    name=$1
    shift
    rm -rf "$dir/out-$name"
    env ${PROFILE:-} "$bin/hsx" extract --device cuda --model qwen3-8b --load-format dummy --layers 2,18,33,36 \
      --input "$dir/check.jsonl" --output "$dir/out-$name" --kv-cache-gib 40 "$@" $mode 2>>"$OUT/extract.err" >/dev/null
  done
  for name in chunked single; do
    same=0 differ=0
    for f in "$dir"/out-big/*.safetensors; do
      if cmp -s "$f" "$dir/out-$name/$(basename "$f")"; then same=$((same + 1)); else differ=$((differ + 1)); fi
    done
    echo "${mode:-default} $name: $same files identical to the 16384-token run, $differ differ" | tee -a "$OUT/files.txt"
  done
done
