#!/usr/bin/env bash
# Stages Mooncake for bench/device_run.sh's `mooncake` mode as .mooncake.tar.xz. The device
# has Python 3.12 and torch but no Mooncake, no network, and the device tool carries at most
# 64 MiB in all: the CPU wheel (mooncake-transfer-engine-non-cuda, cp312) is 46 MB, so only
# what the mode runs travels: the mooncake package's store module (store.so) and
# mooncake_master with the libraries the wheel bundles, stripped, plus the Debian libraries
# they link that the device image lacks (libibverbs, libnuma, libcurl and theirs). About
# 14 MB. hs-connectors' wheel goes to .whl/, where the fp8states mode finds it too.
set -euo pipefail
cd "$(dirname "$0")/.."
# The version CI tests (scripts/test.sh installs it here), else the one this was checked with.
version=$(python3 -m pip show mooncake-transfer-engine-non-cuda 2>/dev/null | sed -n 's/^Version: //p')
version=${version:-0.3.13.post1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$work/wheel" "mooncake-transfer-engine-non-cuda==$version"
python3 -m zipfile -e "$work"/wheel/*.whl "$work/wheel/x"
x="$work/wheel/x" site="$work/stage/site" lib="$work/stage/lib"
libs_dir=$(cd "$x" && ls -d mooncake_transfer_engine*.libs)
mkdir -p "$site/mooncake" "$site/$libs_dir" "$lib"
cp "$x"/mooncake/{__init__.py,buffer_pool.py,store.so,libasio.so,mooncake_master} "$site/mooncake/"
cp "$x/$libs_dir"/* "$site/$libs_dir/"
chmod +x "$site/mooncake/mooncake_master"  # zipfile drops the mode
# store.so wants libetcd_wrapper.so beside it; the master the hashed copy in the .libs dir:
# one file (22 MB) for both.
etcd=$(cd "$site/$libs_dir" && ls libetcd_wrapper-*.so)
ln -s "../$libs_dir/$etcd" "$site/mooncake/libetcd_wrapper.so"
strip --strip-unneeded "$site/mooncake/store.so" "$site/mooncake/mooncake_master" "$site/mooncake/libasio.so" \
  "$site/$libs_dir"/*
# Debian's libraries they link, and theirs, less what the device has (glibc, libstdc++,
# libssl3, zlib; brotli travels in .devbin).
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread|librt\.so|libresolv|ld-linux|/lib64/ld-linux|libstdc\+\+|libgcc_s|libssl\.so\.3|libcrypto\.so\.3|libz\.so\.1|libbrotli)'
for l in libibverbs.so.1 libnuma.so.1 libcurl.so.4; do
  echo "$l"
  ldd "/lib/x86_64-linux-gnu/$l" | awk '{print $1}'
done | sort -u | grep -Ev "$skip" | while read -r l; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$lib/"
done
strip --strip-unneeded "$lib"/*
# Nothing may be left unresolved: checked here, where the full set is known.
missing=$(LD_LIBRARY_PATH="$lib" ldd "$site/mooncake/store.so" "$site/mooncake/mooncake_master" | grep "not found" || true)
[ -z "$missing" ] || { echo "unresolved: $missing" >&2; exit 1; }
tar cJf .mooncake.tar.xz -C "$work/stage" site lib
mkdir -p .whl
python3 -m pip download --quiet --disable-pip-version-check --no-deps -d .whl "hs-connectors==0.9.0"
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
for path in /.mooncake.tar.xz /.whl/; do
  grep -qx "$path" "$exclude" 2>/dev/null || echo "$path" >> "$exclude"
done
ls -la .mooncake.tar.xz .whl/
