#!/usr/bin/env bash
# The loop's device side, run through the device tool from the checkout's root with .loop
# carried (bench/loop/prepare.sh stages it; see docs/BENCHMARKS.md, "The loop on real
# weights"). Every step leaves a marker in $W, so a call that finds the machine warm goes on
# where the last one stopped; a fresh machine is told which parts it lacks.
#
#   bash .loop/scripts/device.sh part N    copy the model's part N to /tmp (a call for each part but the last)
#   bash .loop/scripts/device.sh main      (with the last part) reassemble + sha256, install the
#                                          wheels, convert, regenerate, prepare, the states (hsx
#                                          bf16, hsx FP8, HF), train the three drafts side by side,
#                                          serve: plain, n-gram, the three EAGLE-3 drafts
#                                          (call it again until it says "loop done": each call
#                                          stops before a step that would pass BUDGET)
#   bash .loop/scripts/device.sh sweep     a draft trained on SWEEP rows of hsx's states, served
#   bash .loop/scripts/device.sh trees     (after the parts) hsx's states and one draft on them, served
#                                          as a chain of 3, chains of 8 and 16, trees of 8 and 16 nodes and
#                                          dynamic (EAGLE-2) trees of 8 and 16
#   Settings: EPOCHS (2), MAX_TOKENS (256), SWEEP (2500 rows), BUDGET (550 s a call)
set -uo pipefail
stage=.loop
W=/tmp/hsx-loop
mkdir -p "$W"
R=$W/results  # logs and figures, kept across calls on a warm machine; packed into $OUT at exit
mkdir -p "$R"
EPOCHS=${EPOCHS:-2}
MAX_TOKENS=${MAX_TOKENS:-256}
SWEEP=${SWEEP:-2500}
BUDGET=${BUDGET:-550}  # seconds this call may spend (the tool stops a call at 600 s)
# What a step needs at least, in seconds: one that would not fit in what is left of this
# call's budget waits for the next call rather than being stopped half done.
declare -A NEED=([train]=$((60 + 120 * EPOCHS)) [train_hsx]=$((60 + 120 * EPOCHS)) [hf_states]=60 [generate]=60 [convert]=45)
LAYERS=2,15,27,30  # speculators' default [2, N//2, N-3] for N = 30, plus the last layer
K=3
log() { echo "[$(date +%T) +$((SECONDS))s] $*" | tee -a "$R/loop.log"; }

if [ "${1:-}" = part ]; then
  cp "$stage/model.part$2" "$W/" && log "part $2 in $W: $(ls "$W" | grep -c model.part) parts there"
  exit 0
fi

# ---- the model: parts -> one file, checked
model=$W/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
  parts=$(seq -f %02g 0 $(($(cat "$stage/model.nparts") - 1)))
  for p in $parts; do
    [ -f "$W/model.part$p" ] || cp "$stage/model.part$p" "$W/" 2>/dev/null || {
      echo "model part $p is missing on this machine (a fresh one?): run 'part NN' for each part but the last, then this again, back to back"
      exit 3; }
  done
  (cd "$W" && cat $(printf 'model.part%s ' $parts)) > "$model.partial"
  echo "$(cat "$stage/model.sha256")  $model.partial" | sha256sum -c --quiet ||
    { log "sha256 mismatch: parts corrupt, removed; start again from part 00"; rm -f "$W"/model.part* "$model.partial"; exit 4; }
  mv "$model.partial" "$model"
  rm -f "$W"/model.part*
  log "model reassembled, sha256 $(cat "$stage/model.sha256") ok"
fi

# ---- tools: speculators and the rest as wheels, hsx's CUDA build, the data
if [ ! -f "$W/done.wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$stage"/whl/*.whl &&
    touch "$W/done.wheels" || { log "wheel install failed"; exit 5; }
fi
# datasets 4.4.1 imports torchvision.io.VideoReader, which the device's torchvision 0.26 no
# longer has, whenever torchvision is loaded: skip that video passthrough (text only here).
sed -i 's/if config.TORCHVISION_AVAILABLE and "torchvision" in sys.modules:/if False:  # hsx loop: no VideoReader in torchvision 0.26/' \
  /tmp/site/datasets/formatting/torch_formatter.py
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
[ -x "$W/.devbin/hsx" ] || tar xJf "$stage/hsx.txz" -C "$W"
export LD_LIBRARY_PATH="$W/.devbin:${LD_LIBRARY_PATH:-}"
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
hsx=$W/.devbin/hsx
[ -f "$W/data/train.prompts.jsonl" ] || tar xJf "$stage/data.tar.xz" -C "$W"
scripts=$stage/scripts
# The states (about 15 GB a set) go to memory when it has room.
S=$W/big
[ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1)" -gt 80 ] 2>/dev/null && S=/dev/shm/hsx-loop
mkdir -p "$S"

step() {  # step NAME COMMAND...: once per machine, timed, its output in $R/NAME.log
  local name=$1; shift
  if [ -f "$W/done.$name" ]; then log "$name: done before"; return 0; fi
  local t0=$SECONDS left=$((BUDGET - SECONDS))
  if [ "$left" -lt "${NEED[$name]:-30}" ]; then log "$name: not started, $left s of this call's budget left (call again)"; exit 0; fi
  log "$name: start"
  if timeout --signal=INT --kill-after=15 "$left" bash -c '"$@"' _ "$@" > "$R/$name.log" 2>&1; then
    touch "$W/done.$name"
    log "$name: ok in $((SECONDS - t0)) s; $(tail -1 "$R/$name.log" | cut -c1-300)"
  else
    log "$name: FAILED (exit $?) in $((SECONDS - t0)) s"; tail -25 "$R/$name.log"
    return 1
  fi
}
latest() { echo "$1/$(ls "$1" | grep -E '^[0-9]+$' | sort -n | tail -1)"; }  # the last epoch's checkpoint

train() {  # train STATES_DIR DATASET_DIR SAVE_DIR [ARGS]: speculators' own training code, EAGLE-3, defaults
  local states=$1 data=$2 save=$3; shift 3
  python3 -m speculators.train --speculator-type eagle3 --verifier-name-or-path "$W/hf" \
    --data-path "$data" --hidden-states-path "$states" --target-layer-ids 2 15 27 \
    --draft-vocab-size 32000 --epochs "$EPOCHS" --total-seq-len 8192 --train-data-ratio 0.98 \
    --num-workers "${WORKERS:-8}" --save-path "$save" --log-dir "$save.logs" --seed 0 --loss-implementation eager "$@"
}
# The three drafts side by side on the one GPU (each is small; alone, one leaves the GPU
# mostly idle), each with its own log in $R/train_NAME.log.
train_all() {
  local pids=() rc=0
  WORKERS=5 train "$S/hsx_states" "$S/prepared" "$W/ckpt_hsx" > "$R/train_hsx.log" 2>&1 & pids+=($!)
  WORKERS=5 train "$S/hf_states" "$S/prepared" "$W/ckpt_hf" > "$R/train_hf.log" 2>&1 & pids+=($!)
  WORKERS=5 train "$S/hsx_fp8_states" "$S/prepared" "$W/ckpt_fp8" --hidden-states-backend fp8 > "$R/train_fp8.log" 2>&1 & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for n in hsx hf fp8; do echo "train_$n: $(tr '\r' '\n' < "$R/train_$n.log" | grep -o 'val/loss_epoch=[0-9.]*' | tail -1)"; done
  return $rc
}
serve() {  # serve LABEL [SPEC JSON] [RUNS]
  python3 "$scripts/serve_bench.py" --hsx "$hsx" --model "$model" --prompts "$W/data/heldout.prompts.jsonl" \
    --label "$1" --spec "${2:-}" --runs "${3:-32:500,1:64}" --max-tokens "$MAX_TOKENS" --outputs "$R/outputs" \
    --log "$R/serve.log" -- --kv-cache-gib 20 | tee -a "$R/serve.jsonl"
}
export W S R hsx model scripts EPOCHS MAX_TOKENS K
export -f train train_all serve
eagle() { echo "{\"method\": \"eagle3\", \"model\": \"$1\", \"num_speculative_tokens\": $K}"; }

finish() {  # what comes back: the summary, the log and one archive of everything (the tool takes 8 files)
  python3 "$scripts/summarize.py" "$R" > "$R/summary.txt" 2>&1; cat "$R/summary.txt"
  if [ -n "${OUT:-}" ]; then
    cp "$R/summary.txt" "$R/loop.log" "$OUT/" 2>/dev/null
    tar czf "$OUT/results.tgz" -C "$W" results
  fi
}
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$R/loop.log"
what=${1:-main}
hsx_states() {  # what main and trees share: the model converted, answers regenerated, rows prepared, hsx's bf16 states
  step convert python3 "$scripts/hf_tools.py" convert "$model" "$W/hf" || return 1
  # hsx regenerates every training conversation's answer with the target (greedy)
  step generate bash -c "'$hsx' generate --device cuda --model '$model' --input '$W/data/train.prompts.jsonl' \
    --max-tokens $MAX_TOKENS --kv-cache-gib 40 > '$W/generated.jsonl' && wc -l < '$W/generated.jsonl'" || return 1
  step pretok python3 "$scripts/build_sets.py" pretok "$W/data/train.prompts.jsonl" "$W/generated.jsonl" "$W/train.pretok.jsonl" || return 1
  step prepare python3 -m speculators prepare-data --model "$W/hf" --data "$W/train.pretok.jsonl" --output "$S/prepared" \
    --seq-length 8192 --no-skip-token-freq --num-preprocessing-workers 8 || return 1
  step extract_input python3 "$scripts/build_sets.py" extract-input "$S/prepared" "$W/extract.jsonl" || return 1
  # hsx writes the states: one file per prepared row, hs_<row>.safetensors; in bf16, and in
  # hs-connectors' FP8 format (speculators reads those through --hidden-states-backend fp8)
  step extract "$hsx" extract --device cuda --model "$model" --layers $LAYERS --dtype bfloat16 \
    --input "$W/extract.jsonl" --output "$S/hsx_states" --kv-cache-gib 40 || return 1
}
if [ "$what" = main ]; then
  hsx_states || exit 1
  step extract_fp8 "$hsx" extract --device cuda --model "$model" --layers $LAYERS --dtype bfloat16 \
    --input "$W/extract.jsonl" --output "$S/hsx_fp8_states" --kv-cache-gib 40 \
    --kv-transfer-config '{"kv_connector": "FP8HiddenStatesConnector"}' || exit 1
  # the control: transformers' states of the same rows, trained and served the same way
  step hf_states python3 "$scripts/hf_tools.py" states "$W/hf" "$S/prepared" "$S/hf_states" $LAYERS || exit 1
  step compare python3 "$scripts/hf_tools.py" compare "$S/hsx_states" "$S/hf_states" 200
  step train train_all || exit 1
  for n in hsx hf fp8; do log "$n-state draft: $(latest "$W/ckpt_$n")"; done
  step serve_plain serve plain
  step serve_eagle3_hsx serve eagle3_hsx "$(eagle "$(latest "$W/ckpt_hsx")")"
  step serve_eagle3_hf serve eagle3_hf "$(eagle "$(latest "$W/ckpt_hf")")"
  step serve_eagle3_fp8 serve eagle3_fp8 "$(eagle "$(latest "$W/ckpt_fp8")")"
  step serve_ngram serve ngram "{\"method\": \"ngram\", \"num_speculative_tokens\": $K, \"prompt_lookup_max\": 4}"
  # lossless check: greedy tokens with the draft against plain decode, bit-exact mode, 32 prompts
  head -32 "$W/data/heldout.prompts.jsonl" > "$W/exact.jsonl"
  draft=$(latest "$W/ckpt_hsx")
  step exact bash -c "'$hsx' generate --device cuda --batch-invariant --model '$model' --input '$W/exact.jsonl' --max-tokens $MAX_TOKENS | sort > '$R/exact_plain.jsonl' &&
    '$hsx' generate --device cuda --batch-invariant --model '$model' --input '$W/exact.jsonl' --max-tokens $MAX_TOKENS --speculative-config '$(eagle "$draft")' | sort > '$R/exact_eagle3.jsonl' &&
    cmp '$R/exact_plain.jsonl' '$R/exact_eagle3.jsonl' && echo identical"
  log "loop done"
fi
# Issue 36: tree drafts against chains on the loop's draft (hsx's bf16 states, trained alone),
# served at batch 1 and 32: the chain of K=3 (the loop's), a chain and a tree of 8 nodes
# (the same verification budget: 9 rows a request).
if [ "$what" = trees ]; then
  hsx_states || exit 1
  step train_hsx train "$S/hsx_states" "$S/prepared" "$W/ckpt_hsx" || exit 1
  draft=$(latest "$W/ckpt_hsx")
  log "hsx-state draft: $draft"
  step serve_plain serve plain
  step serve_chain3 serve chain3 "$(eagle "$draft")"
  step serve_chain8 serve chain8 "{\"method\": \"eagle3\", \"model\": \"$draft\", \"num_speculative_tokens\": 8}"
  step serve_tree8 serve tree8 "{\"method\": \"eagle3\", \"model\": \"$draft\", \"speculative_token_tree\": \"[(0,), (1,), (2,), (0, 0), (1, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0)]\"}"
  # 17 rows a request: a tree of depth 6 (the second and third choices near the root) and
  # the chain of 16
  step serve_chain16 serve chain16 "{\"method\": \"eagle3\", \"model\": \"$draft\", \"num_speculative_tokens\": 16}"
  step serve_tree16 serve tree16 "{\"method\": \"eagle3\", \"model\": \"$draft\", \"speculative_token_tree\": \"[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 0, 0)]\"}"
  # EAGLE-2's dynamic trees at the same rows (8 and 16 candidates verified): top 4 over 4
  # and 6 depths
  step serve_dyn8 serve dyn8 "{\"method\": \"eagle3\", \"model\": \"$draft\", \"num_speculative_tokens\": 8, \"speculative_eagle_topk\": 4, \"speculative_num_steps\": 4}"
  step serve_dyn16 serve dyn16 "{\"method\": \"eagle3\", \"model\": \"$draft\", \"num_speculative_tokens\": 16, \"speculative_eagle_topk\": 4, \"speculative_num_steps\": 6}"
  log "trees done"
fi
if [ "$what" = sweep ] && [ "$SWEEP" != 0 ]; then  # a smaller training set, same settings
  step prepare_small python3 -m speculators prepare-data --model "$W/hf" --data "$W/train.pretok.jsonl" \
    --output "$S/prepared_small" --seq-length 8192 --no-skip-token-freq --max-samples "$SWEEP" --num-preprocessing-workers 8 || exit 1
  step link_small python3 "$scripts/build_sets.py" subset "$S/prepared" "$S/prepared_small" "$S/hsx_states" "$S/hsx_states_small" || exit 1
  step train_small train "$S/hsx_states_small" "$S/prepared_small" "$W/ckpt_small" || exit 1
  step serve_eagle3_small serve eagle3_hsx_small "$(eagle "$(latest "$W/ckpt_small")")" 32:500
fi
