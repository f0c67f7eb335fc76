#!/usr/bin/env bash
# Runs on the device machine (through the device tool) with prebuilt binaries carried in
# .devbin/: the CUDA tests, then the Qwen3-8B extraction benchmark against Hugging Face.
# Usage: bash bench/device_run.sh [tests|bench|all|sweep|moe|server|gemma|gptoss|ab|bins|decode|sampling|decodeab|devices|spec|specbench|specab|specadaptive|treebench|mtpadaptive|mtpbench|decodebins|decodeprofile|spectrace|gemv|attention|fp8|fp8states|mooncake|regen|tp|scale]
#   all = tests + bench; sweep includes moe; gptoss = the gpt-oss-20b shape (dummy bf16 experts, as
#   hsx runs MXFP4 checkpoints after dequantizing them at load): the gpt-oss CUDA tests, extraction
#   tok/s and MFU (with the matmul peak), decode at batch 1 and 32 (fraction of the memory bound); server = hsx serve under 32 and 64 clients
#   against hsx extract (bench/server_load.py); gemma = the gemma-4-31b shape and its MFU;
#   bins = that bench on several builds in .devbin (AB_BINS="hsx-e3e23cd hsx"), alternating, twice;
#   ab = the Qwen3-8B bench alternating between two environments, AB_A and AB_B (e.g.
#   AB_B=HSX_ATTENTION=mma), two runs each, plus one HSX_PROFILE run of each; AB_ARGS
#   adds bench arguments to every run (e.g. AB_ARGS="--quantization fp8");
#   decode = hsx bench --decode (batch 1, 32, 128; greedy, and temperature 1 / top-p 0.9
#   at 32; batch 1 and 32 with --enforce-eager) against HF transformers' generate;
#   sampling = the sampling/verification CUDA tests, then bench --decode greedy against temperature 1 /
#   top-p 0.9 at batch 1, 32, 128 (issue 10), and the sample op's profile at 32;
#   decodeab = bench --decode at DECODE_BATCHES (default 1,32,128) under each environment of
#   AB_ENVS, ;-separated, "default" for none (default: the decode fusions off, then on),
#   alternating, twice;
#   decodebins = bench --decode at batch 1, 32, 128 on the builds AB_BINS names in .devbin/,
#   alternating, twice; decodeprofile = at PROFILE_BATCHES (default "1 32 128"), the kernels of
#   graph-replayed decode steps with the idle gaps between them (bench/kernel_trace.cpp), and
#   (NCU=0 skips) Nsight Compute's times and DRAM bytes of each kernel of an eager step alone,
#   both summarized by bench/decode_step_profile.py; spectrace = decodeprofile's timeline of plain
#   decode and adaptive EAGLE-3 at zero acceptance (K = 0: the target's step plus the draft's
#   KV-only pass) at PROFILE_BATCHES (default 128);
#   devices = hsx serve on cuda:0 and cuda:1 (tests/device/serve_on_devices.py, 2 GPUs), and
#   extract with a replica per GPU against one (tests/device/data_parallel_on_devices.py);
#   spec = hsx generate on the llama fixture plain, with n-gram and with EAGLE-3 drafts, and
#   on the Gemma 4 fixture plain and with the MTP assistant; specbench = bench --decode on the
#   Qwen3-8B shape plain, with a random EAGLE-3 draft (zero acceptance: the overhead) and n-gram;
#   specadaptive = bench --decode at batch 1..128 on the Qwen3-8B shape plain and with
#   "draft_length": "adaptive" (EAGLE-3 K=3 forced 0, K=4 forced 0.745, n-gram K=3);
#   treebench = bench --decode at batch 1 and 32 on the Qwen3-8B shape plain, and with a random
#   EAGLE-3 draft (zero acceptance) as a chain of 8, a static tree of 8 and a dynamic tree of 8
#   (top 4, 4 depths): what each round and its 9-row verification cost;
#   specab = specbench's batch-1 cases, K=3 forced 0 and K=4 forced 0.745, on the builds
#   AB_BINS names in .devbin/, alternating, with plain decode before each round; twice;
#   mtpadaptive = bench --decode at batch 1, 8, 32, 128 on the gemma-4-31b shape plain and with a random
#   Gemma 4 MTP assistant, "draft_length": "adaptive" (K=3 zero acceptance, K=4 forced 0.745);
#   mtpbench = bench --decode on the gemma-4-31b shape plain, with a random Gemma 4 MTP assistant of
#   an estimated shape (bench/make_dummy_mtp.py: zero acceptance) and with forced acceptance;
#   gemv = the decode GEMVs alone on the Qwen3-8B projections and a step's layers, at 1 and 4 rows
#   (bench/gemv_bench.cu);
#   attention = the Hopper prefill attention kernel alone at 16k, 4k and 1k contexts, TFLOP/s,
#   with the SM clock and power sampled beside it (bench/attention_bench.cu);
#   fp8 = the Qwen3-8B extraction bench in bf16 and with --quantization fp8;
#   fp8states = that bench writing bf16 files and hs-connectors' FP8 files, alternating, twice,
#   then tests/python/test_fp8_states.py with hs-connectors' FP8Transfer (its wheel in .whl);
#   mooncake = (issue 34) that bench with the file sink on /dev/shm against the Mooncake sink
#   (a local mooncake_master, a segment holder, hsx with no segment of its own), alternating,
#   twice, with bytes per token, then the consumer's read time per sample: hs-connectors'
#   MooncakeTransfer against safetensors' load_file (bench/mooncake_bench.py). Carry
#   .mooncake.tar.xz and .whl (scripts/mooncake_device_bundle.sh makes both);
#   regen = bench/regenerate_bench.py: extract --regenerate against generate then extract;
#   tp = (2 GPUs) the TP tests, extraction at TP=1, TP=2 and DP=2, decode at TP=1 and TP=2;
#   scale = (4 or 8 GPUs) issue 14's runs: DP over every GPU, Llama-3.1-70B at TP=4 and 8
#   (extraction; decode at batch 1, TP=8), Qwen3-30B-A3B at TP=1 and 4, the bf16 matmul peak
set -uo pipefail
what=${1:-all}
here=$(pwd)
if [ -f .devbin.tgz ]; then rm -rf .devbin && tar xzf .devbin.tgz; fi  # scripts/device_bundle.sh packs it
export LD_LIBRARY_PATH="$here/.devbin:${LD_LIBRARY_PATH:-}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
if [ "$what" = tests ] || [ "$what" = all ]; then
  HSX_TEST_DATA="$here/tests/data" .devbin/hsx_tests --gtest_filter='*Cuda*:*/cuda:*BatchInvariantOps*:*BatchInvariantEngine*' 2>&1 |
    tee "$OUT/tests.log" | grep -E "^\[bf16\]|^\[fp8\]|^\[sampling\]|PASSED|FAILED|Failure|Expected|actual|error" | head -60
fi
qwen3_8b_bench() {  # exported, so `env VAR=... bash -c qwen3_8b_bench` can run it
  "${HSX_BIN:-.devbin/hsx}" bench --device cuda --model qwen3-8b --load-format dummy --num-prompts 256 --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,18,33,36 --max-num-batched-tokens 16384 --kv-cache-gib 40 \
    --dir /dev/shm/hsx-bench "$@"
}
export -f qwen3_8b_bench
if [ "$what" = bench ] || [ "$what" = all ]; then
  dir=/dev/shm/hsx-bench
  qwen3_8b_bench 2>"$OUT/bench.err" | tee "$OUT/bench.jsonl"
  tail -3 "$OUT/bench.err"
  if [ "${HF:-1}" = 1 ]; then
    python3 bench/hf_baseline.py "$dir/prompts.jsonl" /dev/shm/hf-out 2,18,33,36 2>"$OUT/hf.err" | tee -a "$OUT/bench.jsonl"
    tail -3 "$OUT/hf.err"
  fi
  python3 bench/report.py "$OUT/bench.jsonl"
fi
if [ "$what" = sweep ]; then
  # Cost against prompt length (about 128k tokens each).
  for spec in "1024 128" "128 1024" "32 4096" "8 16384"; do
    set -- $spec
    .devbin/hsx bench --device cuda --model qwen3-8b --load-format dummy --num-prompts "$1" --median-len "$2" \
      --min-len "$2" --max-len "$2" --layers 2,18,33,36 --max-num-batched-tokens 16384 --kv-cache-gib 40 \
      --dir /dev/shm/hsx-sweep 2>/dev/null
  done
fi
if [ "$what" = sweep ] || [ "$what" = moe ]; then
  timeout 240 .devbin/hsx bench --device cuda --model qwen3-30b-a3b --load-format dummy --num-prompts 64 --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,24,45,48 --max-num-batched-tokens 16384 --kv-cache-gib 20 \
    --dir /dev/shm/hsx-moe 2>"$OUT/moe.err" || echo "moe bench exit $?"
fi
if [ "$what" = server ]; then
  python3 bench/server_load.py --hsx .devbin/hsx --device cuda --load-format dummy --model qwen3-8b \
    --layers 2,18,33,36 --num-prompts 768 --median-len 700 --min-len 32 --max-len 4096 \
    --max-num-batched-tokens 8192 --kv-cache-gib 40 --storage /dev/shm/hsx-serve-bench 2>"$OUT/server.err" \
    | tee "$OUT/server.jsonl"
  tail -3 "$OUT/server.err"
fi
if [ "$what" = gemma ]; then  # with the matmul peak, for its MFU
  python3 bench/matmul_peak.py > "$OUT/gemma.jsonl"
  timeout 300 .devbin/hsx bench --device cuda --model gemma-4-31b --load-format dummy --num-prompts 64 --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,30,57,60 --max-num-batched-tokens 16384 --kv-cache-gib 30 \
    --dir /dev/shm/hsx-gemma 2>"$OUT/gemma.err" >>"$OUT/gemma.jsonl" || echo "gemma bench exit $?"
  tail -2 "$OUT/gemma.err"
  cat "$OUT/gemma.jsonl" && python3 bench/report.py "$OUT/gemma.jsonl"
fi
if [ "$what" = ab ]; then
  for side in A B; do
    var="AB_$side"
    echo "== $side: ${!var:-default}"
    env ${!var:-} HSX_PROFILE=1 bash -c "qwen3_8b_bench ${AB_ARGS:-}" 2>&1 >/dev/null | grep "hsx profile"
  done
  for round in 1 2; do
    for side in A B; do
      var="AB_$side"
      echo "$side $(env ${!var:-} bash -c "qwen3_8b_bench ${AB_ARGS:-}" 2>/dev/null | grep extract_tokens_per_s)"
    done
  done | tee "$OUT/ab.txt"
fi
if [ "$what" = bins ]; then  # the same bench on several builds (AB_BINS="hsx-old hsx" in .devbin/), alternating
  for round in 1 2; do
    for b in ${AB_BINS:-hsx}; do
      echo "$b $(HSX_BIN=.devbin/$b bash -c qwen3_8b_bench 2>/dev/null | grep extract_tokens_per_s)"
    done
  done | tee "$OUT/bins.txt"
fi
if [ "$what" = spec ]; then  # speculative decoding on the GPU: the same greedy tokens with and without drafts
  python3 - > /tmp/spec_prompts.jsonl <<'PY'
import json
from safetensors.numpy import load_file
g = load_file("tests/data/eagle3/llama_copy/golden.safetensors")
for k in range(4):
    print(json.dumps({"id": f"p{k}", "token_ids": [int(t) for t in g[f"prompt_{k}"]]}))
PY
  gen() { local model=$1; shift; .devbin/hsx generate --device cuda --model "$model" --input /tmp/spec_prompts.jsonl \
            --max-tokens 24 --ignore-eos "$@"; }
  # Lines come in finishing order: compare them sorted by id. With --batch-invariant a row's
  # bits do not depend on how many tokens its step verifies, so the tokens must be equal;
  # without, bf16 rounding differs between decode and verification kernels (near-ties may flip).
  for mode in "" --batch-invariant; do
    gen tests/data/models/llama $mode | sort > "$OUT/spec_plain$mode.jsonl"
    gen tests/data/models/llama $mode --speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}' \
      2> "$OUT/spec_ngram$mode.err" | sort > "$OUT/spec_ngram$mode.jsonl"
    gen tests/data/models/llama $mode --speculative-config '{"method": "eagle3", "model": "tests/data/eagle3/llama_copy", "num_speculative_tokens": 3}' \
      2> "$OUT/spec_eagle3$mode.err" | sort > "$OUT/spec_eagle3$mode.jsonl"
    gen tests/data/mtp/gemma4_target $mode --speculative-config \
      '{"method": "mtp", "model": "tests/data/mtp/gemma4_assistant_copy", "num_speculative_tokens": 4}' \
      2> "$OUT/spec_mtp$mode.err" | sort > "$OUT/spec_mtp$mode.jsonl"
    gen tests/data/mtp/gemma4_target $mode | sort > "$OUT/spec_mtp_plain$mode.jsonl"
    cmp -s "$OUT/spec_mtp_plain$mode.jsonl" "$OUT/spec_mtp$mode.jsonl" && same=same || same=DIFFERENT
    echo "mtp ${mode:-default}: $same tokens as plain decode; $(tail -1 "$OUT/spec_mtp$mode.err")"
    for m in ngram eagle3; do
      if cmp -s "$OUT/spec_plain$mode.jsonl" "$OUT/spec_$m$mode.jsonl"; then same=same; else same=DIFFERENT; fi
      echo "$m ${mode:-default}: $same tokens as plain decode; $(tail -1 "$OUT/spec_$m$mode.err")"
    done
  done
fi
if [ "$what" = fp8 ]; then  # --quantization fp8 against bf16, the Qwen3-8B extraction bench of `bench`
  { qwen3_8b_bench; qwen3_8b_bench --quantization fp8; } 2>"$OUT/fp8.err" | tee "$OUT/fp8.jsonl"
  tail -3 "$OUT/fp8.err"
fi
if [ "$what" = fp8states ]; then  # hs-connectors' FP8 files against bf16 files, alternating, twice; then
  # hs-connectors' own FP8Transfer reading hsx's FP8 files (its wheel carried in .whl, torch is here)
  fp8='{"kv_connector": "FP8HiddenStatesConnector"}'
  for round in 1 2; do qwen3_8b_bench; qwen3_8b_bench --kv-transfer-config "$fp8"; done 2>"$OUT/fp8states.err" |
    grep extract_tokens_per_s | tee "$OUT/fp8states.jsonl"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  HSX_BINARY="$here/.devbin/hsx" python3 -m pytest -q -p no:cacheprovider tests/python/test_fp8_states.py 2>&1 |
    tee "$OUT/fp8states_pytest.log" | tail -5
fi
if [ "$what" = mooncake ]; then  # the Mooncake sink against files on /dev/shm (issue 34)
  mc=/tmp/hsx-mooncake
  rm -rf "$mc" && mkdir -p "$mc" && tar xJf .mooncake.tar.xz -C "$mc"
  python3 -m pip install -q --no-index --no-deps --target "$mc/site" .whl/hs_connectors-*.whl
  export PYTHONPATH="$mc/site${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$mc/lib"
  export HSX_PYTHON=$(command -v python3) GLOG_minloglevel=1
  # What is missing fails here, in seconds, and says what: not an hour of benches later.
  if ! python3 -c 'import torch, safetensors.torch, mooncake.store, hs_connectors.transfer' 2>"$OUT/mooncake_import.err"; then
    tail -3 "$OUT/mooncake_import.err"
    ldd "$mc/site/mooncake/store.so" "$mc/site/mooncake/mooncake_master" | grep "not found"
  else
    python3 bench/mooncake_bench.py --hsx .devbin/hsx --rounds 2 --read-samples 64 --segment-gib 16 \
      --extract-args "--device cuda --model qwen3-8b --load-format dummy --layers 2,18,33,36 --max-num-batched-tokens 16384 --kv-cache-gib 40" \
      --bench-args "--num-prompts 256 --median-len 700 --min-len 32 --max-len 4096 --dir /dev/shm/hsx-bench" \
      2>"$OUT/mooncake.err" | tee "$OUT/mooncake.jsonl"
    tail -3 "$OUT/mooncake.err"
  fi
fi
if [ "$what" = regen ]; then  # one-pass regenerate-and-extract against generate then extract (issue 35)
  python3 bench/regenerate_bench.py .devbin/hsx "${REGEN_N:-256}" "${REGEN_MAX_TOKENS:-256}" 2>&1 | tee "$OUT/regen.jsonl"
fi
if [ "$what" = tp ]; then  # nvidia-h200-x2: tensor and data parallelism beside one GPU, one call
  HSX_TEST_DATA="$here/tests/data" .devbin/hsx_tests --gtest_filter='*TensorParallel*' 2>&1 | tee "$OUT/tp_tests.log" |
    grep -E "PASSED|FAILED|SKIPPED|Failure" | head -20
  for args in "" "--tensor-parallel-size 2" "--data-parallel-size 2"; do
    qwen3_8b_bench $args 2>>"$OUT/tp.err" | grep extract_tokens_per_s
  done | tee "$OUT/tp.jsonl"
  for args in "" "--tensor-parallel-size 2"; do
    .devbin/hsx bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 --new-tokens 128 \
      --kv-cache-gib 40 --batch-sizes 1,32 $args 2>>"$OUT/tp.err" | grep batch
  done | tee -a "$OUT/tp.jsonl"
fi
if [ "$what" = scale ]; then  # issue 14's runs on nvidia-h200-x4 / x8, one GPU's figures in the same call
  gpus=$(nvidia-smi -L | wc -l)
  llama70() {
    .devbin/hsx bench --device cuda --model llama-3.1-70b --load-format dummy --num-prompts 256 --median-len 700 \
      --min-len 32 --max-len 4096 --layers 2,40,77,80 --max-num-batched-tokens 16384 --kv-cache-gib 30 \
      --dir /dev/shm/hsx-scale "$@" 2>>"$OUT/scale.err" | grep extract_tokens_per_s
  }
  moe() {
    .devbin/hsx bench --device cuda --model qwen3-30b-a3b --load-format dummy --num-prompts 64 --median-len 700 \
      --min-len 32 --max-len 4096 --layers 2,24,45,48 --max-num-batched-tokens 16384 --kv-cache-gib 20 \
      --dir /dev/shm/hsx-scale "$@" 2>>"$OUT/scale.err" | grep extract_tokens_per_s
  }
  {
    qwen3_8b_bench 2>>"$OUT/scale.err" | grep extract_tokens_per_s
    qwen3_8b_bench --data-parallel-size "$gpus" 2>>"$OUT/scale.err" | grep extract_tokens_per_s
    llama70 --tensor-parallel-size 4
    [ "$gpus" -ge 8 ] && llama70 --tensor-parallel-size 8
    [ "$gpus" -ge 8 ] && .devbin/hsx bench --decode --device cuda --model llama-3.1-70b --load-format dummy \
      --prompt-len 512 --new-tokens 128 --kv-cache-gib 30 --batch-sizes 1 --tensor-parallel-size 8 2>>"$OUT/scale.err" | grep batch
    moe
    moe --tensor-parallel-size 4
  } | tee "$OUT/scale.jsonl"
  python3 -c 'import torch; a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); import time
for _ in range(3): a @ a
torch.cuda.synchronize(); t = time.time()
for _ in range(20): a @ a
torch.cuda.synchronize(); print({"metric": "bf16_matmul_peak_tflops_per_gpu", "value": 20 * 2 * 8192**3 / (time.time() - t) / 1e12})' \
    | tee -a "$OUT/scale.jsonl"
fi
if [ "$what" = specbench ] || [ "$what" = specab ]; then
  python3 bench/make_dummy_eagle3.py /dev/shm/eagle3-qwen3-8b
fi
if [ "$what" = specab ]; then  # batch 1: plain, EAGLE-3 K=3 zero and K=4 forced 0.745 acceptance, on AB_BINS, alternating
  spec_case() {  # $1 build, $2 K (0: plain), $3 forced acceptance rate
    local spec=()
    [ "$2" = 0 ] || spec=(--speculative-config "{\"method\": \"eagle3\", \"model\": \"/dev/shm/eagle3-qwen3-8b\", \"num_speculative_tokens\": $2}" --spec-bench-accept-rate "$3")
    ".devbin/$1" bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 --new-tokens 256 \
      --kv-cache-gib 40 --batch-sizes 1 "${spec[@]}" 2>>"$OUT/specab.err" | grep batch | sed "s/}\$/, \"bin\": \"$1\"}/"
  }
  for round in 1 2; do
    spec_case hsx 0
    for b in ${AB_BINS:-hsx}; do spec_case "$b" 3 0; done
    for b in ${AB_BINS:-hsx}; do spec_case "$b" 4 0.745; done
  done | tee "$OUT/specab.jsonl"
fi
if [ "$what" = specbench ]; then  # the speculation machinery at the Qwen3-8B shape, plain decode beside
  sb() { .devbin/hsx bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 \
           --new-tokens 256 --kv-cache-gib 40 --batch-sizes 1,32 "$@" 2>>"$OUT/specbench.err" | grep batch; }
  { sb; sb --speculative-config '{"method": "eagle3", "model": "/dev/shm/eagle3-qwen3-8b", "num_speculative_tokens": 3}'
    sb --speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    # Forced acceptance (output not the target's): 0 (the overhead), and a = 0.745 at K = 4,
    # i.e. a mean acceptance length of 1 + a + a^2 + a^3 + a^4 = 3.0 (the issue's goal).
    sb --speculative-config '{"method": "eagle3", "model": "/dev/shm/eagle3-qwen3-8b", "num_speculative_tokens": 3}' \
      --spec-bench-accept-rate 0
    sb --speculative-config '{"method": "eagle3", "model": "/dev/shm/eagle3-qwen3-8b", "num_speculative_tokens": 4}' \
      --spec-bench-accept-rate 0.745
    # The same with "draft_length": "adaptive" (K per request per step, num_speculative_tokens the most).
    sb --speculative-config '{"method": "eagle3", "model": "/dev/shm/eagle3-qwen3-8b", "num_speculative_tokens": 3, "draft_length": "adaptive"}' \
      --spec-bench-accept-rate 0
    sb --speculative-config '{"method": "eagle3", "model": "/dev/shm/eagle3-qwen3-8b", "num_speculative_tokens": 4, "draft_length": "adaptive"}' \
      --spec-bench-accept-rate 0.745; } \
    | tee "$OUT/specbench.jsonl"
fi
if [ "$what" = specadaptive ]; then  # issue 36's goals: adaptive K at batch 1..128, zero and forced 0.745 acceptance, plain beside
  python3 bench/make_dummy_eagle3.py /dev/shm/eagle3-qwen3-8b
  sa() { .devbin/hsx bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 \
           --new-tokens 256 --kv-cache-gib 40 --batch-sizes "${SA_BATCHES:-1,2,4,8,16,32,64,128}" "$@" 2>>"$OUT/specadaptive.err" | grep batch; }
  e3() { echo "{\"method\": \"eagle3\", \"model\": \"/dev/shm/eagle3-qwen3-8b\", \"num_speculative_tokens\": $1, \"draft_length\": \"adaptive\"}"; }
  # Plain decode first and last: the ratios are against their mean, and their difference is
  # the call's drift (later runs on the same GPU have measured a few percent slower).
  # SA_PROBE=N adds the zero-acceptance case with probes of at most N drafts (the default: K)
  { sa; sa --speculative-config "$(e3 3)" --spec-bench-accept-rate 0
    [ -n "${SA_PROBE:-}" ] && sa --speculative-config "$(e3 3)" --spec-bench-accept-rate 0 --spec-bench-probe-drafts "$SA_PROBE"
    sa --speculative-config "$(e3 4)" --spec-bench-accept-rate 0.745
    sa --speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "draft_length": "adaptive"}'; sa; } \
    | tee "$OUT/specadaptive.jsonl"
  python3 bench/speculative_ratios.py "$OUT/specadaptive.jsonl"
fi
if [ "$what" = treebench ]; then  # the cost of tree rounds: 9 verified rows a request, zero acceptance, plain beside
  python3 bench/make_dummy_eagle3.py /dev/shm/eagle3-qwen3-8b
  tb() { .devbin/hsx bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 \
           --new-tokens 256 --kv-cache-gib 40 --batch-sizes 1,32 "$@" 2>>"$OUT/treebench.err" | grep batch; }
  d=/dev/shm/eagle3-qwen3-8b
  { tb; tb --speculative-config "{\"method\": \"eagle3\", \"model\": \"$d\", \"num_speculative_tokens\": 8}" --spec-bench-accept-rate 0
    tb --speculative-config "{\"method\": \"eagle3\", \"model\": \"$d\", \"speculative_token_tree\": \"[(0,), (1,), (2,), (0, 0), (1, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0)]\"}" --spec-bench-accept-rate 0
    tb --speculative-config "{\"method\": \"eagle3\", \"model\": \"$d\", \"num_speculative_tokens\": 8, \"speculative_eagle_topk\": 4, \"speculative_num_steps\": 4}" --spec-bench-accept-rate 0
    tb; } | tee "$OUT/treebench.jsonl"
  tail -3 "$OUT/treebench.err"
fi
if [ "$what" = mtpbench ]; then  # Gemma 4 MTP at the gemma-4-31b shape (the assistant's shape estimated), plain beside
  python3 bench/make_dummy_mtp.py /dev/shm/mtp-gemma-4-31b | tee "$OUT/mtpbench.jsonl"
  mb() { timeout 180 .devbin/hsx bench --decode --device cuda --model gemma-4-31b --load-format dummy --prompt-len 512 \
           --new-tokens 256 --kv-cache-gib 40 --batch-sizes 1,32 "$@" 2>>"$OUT/mtpbench.err" | grep batch; }
  mtp() { echo "{\"method\": \"mtp\", \"model\": \"/dev/shm/mtp-gemma-4-31b\", \"num_speculative_tokens\": $1}"; }
  # A random assistant is (almost) never accepted: the overhead. Forced acceptance a = 0.745 at
  # K = 4 gives a mean acceptance length of 3.0, as in specbench (output not the target's).
  { mb; mb --speculative-config "$(mtp 3)"; mb --speculative-config "$(mtp 4)" --spec-bench-accept-rate 0.745; } \
    | tee -a "$OUT/mtpbench.jsonl"
  tail -3 "$OUT/mtpbench.err"
fi
if [ "$what" = mtpadaptive ]; then  # issue 36's goals for MTP: adaptive K at batch 1..128 on the gemma-4-31b shape, plain beside
  python3 bench/make_dummy_mtp.py /dev/shm/mtp-gemma-4-31b > /dev/null
  ma() { timeout 240 .devbin/hsx bench --decode --device cuda --model gemma-4-31b --load-format dummy --prompt-len 512 \
           --new-tokens 256 --kv-cache-gib 40 --batch-sizes "${MA_BATCHES:-1,8,32,128}" "$@" 2>>"$OUT/mtpadaptive.err" | grep batch; }
  mtp() { echo "{\"method\": \"mtp\", \"model\": \"/dev/shm/mtp-gemma-4-31b\", \"num_speculative_tokens\": $1, \"draft_length\": \"adaptive\"}"; }
  { ma; ma --speculative-config "$(mtp 3)"; ma --speculative-config "$(mtp 4)" --spec-bench-accept-rate 0.745; ma; } \
    | tee "$OUT/mtpadaptive.jsonl"
  python3 bench/speculative_ratios.py "$OUT/mtpadaptive.jsonl"
fi
if [ "$what" = devices ]; then  # nvidia-h200-x2: hsx serve --device cuda:1 beside cuda:0
  python3 tests/device/serve_on_devices.py .devbin/hsx cuda:0 cuda:1 2>&1 | tee "$OUT/devices.jsonl"
  python3 tests/device/data_parallel_on_devices.py .devbin/hsx "$(nvidia-smi -L | wc -l)" 2>&1 | tee -a "$OUT/devices.jsonl"
fi
decode_bench() {
  .devbin/hsx bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 --new-tokens 256 \
    --kv-cache-gib 40 "$@"
}
if [ "$what" = decodebins ]; then  # bench --decode at batch 1, 32, 128 on the builds AB_BINS names in .devbin/, alternating, twice
  for round in 1 2; do
    for b in ${AB_BINS:-hsx}; do
      ".devbin/$b" bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 --new-tokens 256 \
        --kv-cache-gib 40 --batch-sizes 1,32,128 2>>"$OUT/decodebins.err" | grep batch | sed "s/}\$/, \"bin\": \"$b\"}/"
    done
  done | tee "$OUT/decodebins.jsonl"
fi
if [ "$what" = gemv ]; then  # each projection's GEMV alone, then a step's layers
  for rows in 1 4; do .devbin/hsx_gemv_bench "$rows"; done | tee "$OUT/gemv.jsonl"
fi
if [ "$what" = attention ]; then  # the prefill attention kernel alone, clock and power beside it
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 200 \
    >"$OUT/smi.csv" &
  smi=$!
  .devbin/hsx_attention_bench 20 | tee "$OUT/attention.jsonl"
  kill "$smi"
fi
if [ "$what" = decodeprofile ]; then  # one decode step's kernels at PROFILE_BATCHES (bench/decode_step_profile.py)
  step_bench=(bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 --kv-cache-gib 40)
  for b in ${PROFILE_BATCHES:-1 32 128}; do
    # the graph replays as they run, idle gaps included (bench/kernel_trace.cpp): the last 20 steps
    CUDA_INJECTION64_PATH="$here/.devbin/libhsx_kernel_trace.so" HSX_KERNEL_TRACE="$OUT/trace_b$b.csv" \
      .devbin/hsx "${step_bench[@]}" --new-tokens 64 --batch-sizes "$b" 2>"$OUT/trace_b$b.err" | grep -o '"step_ms":[0-9.]*'
    python3 bench/decode_step_profile.py "$OUT/trace_b$b.csv" --steps 20 --layers 36 |
      sed "s/^{/{\"batch\": $b, \"tool\": \"cupti\", /"
    # each kernel of an eager step alone, with its DRAM bytes
    [ "${NCU:-1}" = 1 ] || continue
    HSX_GEMM_TUNE=0 timeout 240 ncu --clock-control none --csv --log-file "$OUT/ncu_b$b.csv" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      .devbin/hsx "${step_bench[@]}" --new-tokens 3 --batch-sizes "$b" --enforce-eager >/dev/null 2>"$OUT/ncu_b$b.err"
    python3 bench/decode_step_profile.py "$OUT/ncu_b$b.csv" --layers 36 | sed "s/^{/{\"batch\": $b, \"tool\": \"ncu\", /"
  done | tee "$OUT/decodeprofile.jsonl"
fi
if [ "$what" = spectrace ]; then  # decodeprofile's timeline for plain decode and adaptive EAGLE-3 at zero acceptance
  python3 bench/make_dummy_eagle3.py /dev/shm/eagle3-qwen3-8b > /dev/null
  e3='{"method": "eagle3", "model": "/dev/shm/eagle3-qwen3-8b", "num_speculative_tokens": 3, "draft_length": "adaptive"}'
  for b in ${PROFILE_BATCHES:-128}; do
    for run in plain eagle3; do
      args=(); [ $run = eagle3 ] && args=(--speculative-config "$e3" --spec-bench-accept-rate 0)
      CUDA_INJECTION64_PATH="$here/.devbin/libhsx_kernel_trace.so" HSX_KERNEL_TRACE="$OUT/trace_${run}_b$b.csv" \
        .devbin/hsx bench --decode --device cuda --model qwen3-8b --load-format dummy --prompt-len 512 --kv-cache-gib 40 \
        --new-tokens 128 --batch-sizes "$b" "${args[@]}" 2>"$OUT/trace_${run}_b$b.err" | grep -o '"step_ms":[0-9.]*'
      python3 bench/decode_step_profile.py "$OUT/trace_${run}_b$b.csv" --steps 20 |
        sed "s/^{/{\"batch\": $b, \"run\": \"$run\", /" | head -${PROFILE_LINES:-30}
      gzip -f "$OUT/trace_${run}_b$b.csv"
    done
  done | tee "$OUT/spectrace.jsonl"
fi
if [ "$what" = decodeab ]; then  # bench --decode under each of AB_ENVS (;-separated), alternating, twice
  IFS=';' read -ra envs <<< "${AB_ENVS:-HSX_NORM_ROPE_STORE=0 HSX_GATED_GEMV=0;default}"
  for round in 1 2; do
    for env in "${envs[@]}"; do
      ([ "$env" = default ] || export $env; decode_bench --batch-sizes "${DECODE_BATCHES:-1,32,128}" 2>>"$OUT/decodeab.err" | grep batch |
        sed "s/}\$/, \"env\": \"$env\"}/")
    done
  done | tee "$OUT/decodeab.jsonl"
fi
if [ "$what" = sampling ]; then  # issue 10: the sampling and verification CUDA tests, then greedy against
  # temperature 1 / top-p 0.9 at batch 1, 32, 128, alternating, twice; the sample op's time per call
  HSX_TEST_DATA="$here/tests/data" .devbin/hsx_tests --gtest_filter='CudaSampling.*:CudaVerification.*:*SpeculativeGraphs.*/cuda' 2>&1 |
    tee "$OUT/sampling_tests.log" | grep -E "^\[sampling\]|^\[verification\]|PASSED|FAILED|Failure|Expected|actual|error" | head -40
  for run in 1 2; do
    decode_bench --batch-sizes 1,32,128 | grep batch
    decode_bench --batch-sizes 1,32,128 --temperature 1 --top-p 0.9 | grep batch
  done 2>"$OUT/sampling.err" | tee "$OUT/sampling.jsonl"
  (export HSX_PROFILE=1; decode_bench --batch-sizes 32 --new-tokens 64 --temperature 1 --top-p 0.9 2>&1 >/dev/null) |
    grep "hsx profile" | grep -E " sample | verify "
fi
if [ "$what" = decode ]; then
  { decode_bench --batch-sizes 1,32,128; decode_bench --batch-sizes 32 --temperature 1 --top-p 0.9 | grep batch;
    decode_bench --batch-sizes 1,32 --enforce-eager | grep batch | sed 's/}$/, "eager": true}/'; } \
    2>"$OUT/decode.err" | tee "$OUT/decode.jsonl"
  (export HSX_PROFILE=1; decode_bench --batch-sizes 32 --new-tokens 64 2>&1 >/dev/null) | grep "hsx profile" | sort -t' ' -k4 -gr | head -24
  if [ "${HF:-1}" = 1 ]; then
    timeout 300 python3 bench/hf_decode.py 512 256 1,32,128 2>"$OUT/hf_decode.err" | tee -a "$OUT/decode.jsonl"
    tail -2 "$OUT/hf_decode.err"
  fi
fi
if [ "$what" = gptoss ]; then  # issue 33 item 5
  HSX_TEST_DATA="$here/tests/data" .devbin/hsx_tests \
    --gtest_filter='*AttentionSinks*:*MoeMlpMatchesCpu*:*FixtureModel*gpt_oss*:*CudaFixture*' 2>&1 |
    tee "$OUT/gptoss_tests.log" | grep -E "PASSED|FAILED|Failure|Expected|actual|error" | head -40
  python3 bench/matmul_peak.py > "$OUT/gptoss.jsonl"
  timeout 300 .devbin/hsx bench --device cuda --model gpt-oss-20b --load-format dummy --num-prompts 64 --median-len 700 \
    --min-len 32 --max-len 4096 --layers 2,12,21,24 --max-num-batched-tokens 16384 --kv-cache-gib 30 \
    --dir /dev/shm/hsx-gptoss 2>"$OUT/gptoss.err" >>"$OUT/gptoss.jsonl" || echo "gpt-oss bench exit $?"
  tail -2 "$OUT/gptoss.err"
  cat "$OUT/gptoss.jsonl" && python3 bench/report.py "$OUT/gptoss.jsonl"
  timeout 240 .devbin/hsx bench --decode --device cuda --model gpt-oss-20b --load-format dummy --prompt-len 512 \
    --new-tokens 256 --kv-cache-gib 30 --batch-sizes 1,32 2>"$OUT/gptoss_decode.err" | tee "$OUT/gptoss_decode.jsonl"
  tail -2 "$OUT/gptoss_decode.err"
fi
