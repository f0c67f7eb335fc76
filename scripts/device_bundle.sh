#!/usr/bin/env bash
# Builds hsx with CUDA (Release, sm_90a) here and stages the binaries and the runtime
# libraries the device machine lacks (it has CUDA and cuBLASLt, but no Debian packages)
# in .devbin/, packed as .devbin.tgz, which bench/device_run.sh unpacks. Carry .devbin.tgz
# with the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DHSX_CUDA=ON >/dev/null
cmake --build build-device --target hsx hsx_tests hsx_kernel_trace hsx_gemv_bench hsx_attention_bench -j "$(nproc)"
rm -rf .devbin && mkdir -p .devbin
cp build-device/src/hsx build-device/tests/hsx_tests build-device/libhsx_kernel_trace.so build-device/hsx_gemv_bench build-device/hsx_attention_bench .devbin/
strip .devbin/hsx .devbin/hsx_tests .devbin/libhsx_kernel_trace.so .devbin/hsx_gemv_bench .devbin/hsx_attention_bench
# CUPTI for the kernel trace (bench/kernel_trace.cpp), from this toolkit.
cp -L "$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib/libcupti.so.13" .devbin/ 2>/dev/null ||
  cp -L /usr/local/cuda/lib64/libcupti.so.13 .devbin/
# libssl3 and zlib are on the device image; the rest travels.
for lib in libpcre2-8.so.0 libutf8proc.so.2 libdnnl.so.2 libOpenCL.so.1 libgomp.so.1 \
           libcpp-httplib.so.0.11 libbrotlicommon.so.1 libbrotlidec.so.1 libbrotlienc.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .devbin/
done
# Compressed: the device tool carries at most 64 MiB, which .devbin itself passes.
tar czf .devbin.tgz .devbin
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
for path in /.devbin/ /.devbin.tgz; do
  grep -qx "$path" "$exclude" 2>/dev/null || echo "$path" >> "$exclude"
done
du -sh .devbin .devbin.tgz
