// The prefill attention kernel for Hopper (backend/cuda/attention_hopper.cu) alone, on the
// Qwen3-8B attention shape (32 query heads, 8 KV heads, head dim 128, 16-slot cache
// blocks), causal, as extraction's steps run it: one 16k-token prompt, 4 of 4,096, 16 of
// 1,024. Inputs are random, caches laid out block after block. Prints a JSON line a case:
// milliseconds a call, TFLOP/s of causal attention (4 D heads per visible query-key pair,
// FlashAttention's count) and a checksum of the output, so that variants of the kernel can
// be checked against each other before they are timed.
// Usage: hsx_attention_bench [calls per case, default 20].
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"

namespace {

using hsx::cuda::bf16;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "attention_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T* Upload(const std::vector<T>& host) {
  T* dev = nullptr;
  Check(cudaMalloc(&dev, host.size() * sizeof(T)), "malloc");
  Check(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return dev;
}

std::vector<bf16> Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(u(rng));
  return v;
}

void RunCase(const char* name, int seqs, int len, int calls) {
  constexpr int kHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;
  const int64_t tokens = int64_t(seqs) * len, blocks_per_seq = (len + kBlock - 1) / kBlock;
  const int64_t slots = seqs * blocks_per_seq * kBlock;
  std::mt19937 rng(1234);
  bf16* q = Upload(Random(tokens * kHeads * kDim, rng));
  bf16* k = Upload(Random(slots * kKvHeads * kDim, rng));
  bf16* v = Upload(Random(slots * kKvHeads * kDim, rng));
  bf16* out = nullptr;
  Check(cudaMalloc(&out, tokens * kHeads * kDim * sizeof(bf16)), "malloc");
  std::vector<int32_t> info, table;
  double pairs = 0;
  for (int s = 0; s < seqs; ++s) {
    info.insert(info.end(), {int32_t(s * len), len, len, int32_t(s * blocks_per_seq)});
    for (int64_t b = 0; b < blocks_per_seq; ++b) table.push_back(int32_t(s * blocks_per_seq + b));
    pairs += double(len) * (len + 1) / 2;
  }
  int32_t* dev_info = Upload(info);
  int32_t* dev_table = Upload(table);

  hsx::cuda::AttentionArgs a{};
  a.q = q;
  a.k_cache = k;
  a.v_cache = v;
  a.cache_slots = slots;
  a.out = out;
  a.seq_info = dev_info;
  a.host_seq_info = info.data();
  a.block_tables = dev_table;
  a.num_seqs = seqs;
  a.max_q_len = len;
  a.num_heads = kHeads;
  a.kv_heads = kKvHeads;
  a.head_dim = kDim;
  a.block_size = kBlock;
  a.scale = 1.0f / std::sqrt(float(kDim));
  a.hopper = true;

  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "stream");
  Check(cudaMemsetAsync(out, 0xff, tokens * kHeads * kDim * sizeof(bf16), stream), "poison");
  if (!hsx::cuda::AttentionHopper(a, stream)) {
    std::fprintf(stderr, "attention_bench: AttentionHopper declined the %s case\n", name);
    std::exit(1);
  }
  Check(cudaStreamSynchronize(stream), "first call");
  std::vector<bf16> host(tokens * kHeads * kDim);
  Check(cudaMemcpy(host.data(), out, host.size() * sizeof(bf16), cudaMemcpyDeviceToHost), "download");
  double checksum = 0;
  for (size_t i = 0; i < host.size(); ++i) checksum += double(__bfloat162float(host[i])) * double(i % 7 + 1);

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 2; ++i) hsx::cuda::AttentionHopper(a, stream);
  cudaEventRecord(start, stream);
  for (int i = 0; i < calls; ++i) hsx::cuda::AttentionHopper(a, stream);
  cudaEventRecord(stop, stream);
  Check(cudaEventSynchronize(stop), "calls");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  ms /= calls;
  const double flops = 4.0 * kDim * kHeads * pairs;
  std::printf(
      "{\"case\": \"%s\", \"seqs\": %d, \"len\": %d, \"ms\": %.4f, \"tflops\": %.1f, \"checksum\": %.6e}\n", name,
      seqs, len, ms, flops / (ms * 1e-3) / 1e12, checksum);
  std::fflush(stdout);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(out),
                  static_cast<void*>(dev_info), static_cast<void*>(dev_table)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20;
  if (calls < 1) {
    std::fprintf(stderr, "usage: hsx_attention_bench [calls per case >= 1]\n");
    return 2;
  }
  RunCase("1x16384", 1, 16384, calls);
  RunCase("4x4096", 4, 4096, calls);
  RunCase("16x1024", 16, 1024, calls);
  return 0;
}
