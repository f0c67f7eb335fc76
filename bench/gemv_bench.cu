// The decode GEMVs (backend/cuda/gemv.cu, gated_gemv.cu) alone, on each Qwen3-8B
// projection, timed as a decode step runs them (launched programmatically, one after
// another, on a recorded graph) and launched the ordinary way; o_proj also from L2; the
// floor of such a chain (a GEMV of next to no bytes); and a step's 36 layers of q/k/v,
// o_proj, gated gate/up and down, without and with a stand-in for the attention's kernels
// between q/k/v and o_proj (one small kernel that spins 8 us). Each launch reads a
// different copy of its weight, so no weight is in L2 when its kernel starts, as in a
// step. Prints JSON lines: microseconds per launch and the weight bytes' rate, against
// which the LM head's (many waves, little ramp) is the pace a GEMV can reach.
// Usage: hsx_gemv_bench [rows, default 1].
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/programmatic_launch.cuh"

namespace {

using hsx::cuda::bf16;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gemv_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Projection {
  const char* name;
  int64_t n, k;  // the weight's rows and columns; gated: gate_up's, n = 2 * the outputs
  bool gated;
};

// Microseconds per launch of `launches` calls of launch(i), recorded on a graph, replayed.
double TimeLaunches(cudaStream_t stream, int launches, const std::function<void(int)>& launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
  for (int i = 0; i < launches; ++i) launch(i);
  Check(cudaStreamEndCapture(stream, &graph), "end capture");
  Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 3; ++i) Check(cudaGraphLaunch(exec, stream), "warm-up replay");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  constexpr int kReplays = 10;
  cudaEventRecord(start, stream);
  for (int i = 0; i < kReplays; ++i) Check(cudaGraphLaunch(exec, stream), "replay");
  cudaEventRecord(stop, stream);
  Check(cudaEventSynchronize(stop), "replays");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / (kReplays * launches);
}

// A stand-in for the small kernels between q/k/v and o_proj: one block that waits for the
// kernel before, lets the next one launch, and spins for `ns`.
__global__ void SpinKernel(int64_t ns) {
  hsx::cuda::WaitForPriorGrid();
  hsx::cuda::AllowDependentLaunch();
  int64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

void Spin(int64_t ns, cudaStream_t stream) {
  hsx::cuda::LaunchMaybeProgrammatic(SpinKernel, dim3(1), dim3(32), 0, true, stream, ns);
}

}  // namespace

int main(int argc, char** argv) {
  const int m = argc > 1 ? std::atoi(argv[1]) : 1;
  if (m < 1 || m > hsx::cuda::kGemvMaxRows) {
    std::fprintf(stderr, "usage: hsx_gemv_bench [rows, 1 to %d]\n", hsx::cuda::kGemvMaxRows);
    return 2;
  }
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const std::vector<Projection> projections = {
      {"qkv", 6144, 4096, false}, {"o_proj", 4096, 4096, false}, {"gate_up", 24576, 4096, true},
      {"down", 4096, 12288, false}, {"lm_head", 151936, 4096, false}};
  constexpr int kLayers = 36;
  // Per layer one copy of each projection but the LM head (two, for the step's).
  std::vector<std::vector<bf16*>> weights(projections.size());
  for (size_t p = 0; p < projections.size(); ++p) {
    const int copies = p + 1 == projections.size() ? 2 : kLayers;
    for (int c = 0; c < copies; ++c) {
      bf16* w = nullptr;
      const size_t bytes = size_t(projections[p].n) * projections[p].k * sizeof(bf16);
      Check(cudaMalloc(&w, bytes), "weights");
      Check(cudaMemset(w, 0x3c, bytes), "weights");  // bf16 0x3c3c: 0.0115, finite
      weights[p].push_back(w);
    }
  }
  bf16 *x = nullptr, *y_bf16 = nullptr;
  float* y = nullptr;
  Check(cudaMalloc(&x, size_t(m) * 12288 * sizeof(bf16)), "x");
  Check(cudaMemset(x, 0x3c, size_t(m) * 12288 * sizeof(bf16)), "x");
  Check(cudaMalloc(&y, size_t(m) * 151936 * sizeof(float)), "y");
  Check(cudaMalloc(&y_bf16, size_t(m) * 12288 * sizeof(bf16)), "y");
  auto run = [&](const Projection& p, const bf16* w, bool programmatic = true) {
    if (p.gated)
      hsx::cuda::GatedGemv(x, w, m, p.n / 2, p.k, 0, y_bf16, stream, programmatic);
    else
      hsx::cuda::Gemv(x, w, m, p.n, p.k, y, true, stream, programmatic);
  };
  auto rate = [&](double us, double bytes) { return bytes / (us * 1e-6) / 1e12; };
  // Each projection from HBM (a new copy each launch), launched programmatically and not,
  // and from L2 (one copy) where it fits (o_proj).
  for (size_t p = 0; p < projections.size(); ++p) {
    const Projection& proj = projections[p];
    const std::vector<bf16*>& copies = weights[p];
    const int launches = copies.size() < 4 ? 8 : kLayers;
    for (bool hot : {false, true}) {
      for (bool programmatic : {true, false}) {
        if (hot && (!programmatic || double(proj.n) * proj.k * sizeof(bf16) > 40e6)) continue;  // fits L2
        const double us = TimeLaunches(stream, launches, [&](int i) {
          run(proj, copies[hot ? 0 : i % copies.size()], programmatic);
        });
        std::printf("{\"metric\":\"gemv_us\",\"projection\":\"%s\",\"rows\":%d,\"n\":%lld,\"k\":%lld,"
                    "\"weights\":\"%s\",\"programmatic\":%s,\"value\":%.2f,\"tb_per_s\":%.3f}\n",
                    proj.name, m, static_cast<long long>(proj.n), static_cast<long long>(proj.k), hot ? "L2" : "HBM",
                    programmatic ? "true" : "false", us, rate(us, double(proj.n) * proj.k * sizeof(bf16)));
        std::fflush(stdout);
      }
    }
  }
  // The floor: a chain of GEMVs over 16 rows per SM of 64 columns (next to no bytes).
  {
    const Projection tiny{"tiny", 16 * 132, 64, false};
    for (bool programmatic : {true, false}) {
      const double us = TimeLaunches(stream, kLayers, [&](int) { run(tiny, weights[0][0], programmatic); });
      std::printf("{\"metric\":\"gemv_us\",\"projection\":\"tiny\",\"rows\":%d,\"n\":%lld,\"k\":%lld,"
                  "\"programmatic\":%s,\"value\":%.2f}\n",
                  m, static_cast<long long>(tiny.n), static_cast<long long>(tiny.k), programmatic ? "true" : "false", us);
    }
  }
  // A step's layers, without and with the attention's stand-in.
  double layer_bytes = 0;
  for (size_t p = 0; p + 1 < projections.size(); ++p) layer_bytes += double(projections[p].n) * projections[p].k * 2;
  for (int64_t spin_ns : {0, 8000}) {
    const double us = TimeLaunches(stream, kLayers, [&](int layer) {
      run(projections[0], weights[0][layer]);
      if (spin_ns > 0) Spin(spin_ns, stream);
      for (int p = 1; p < 4; ++p) run(projections[p], weights[p][layer]);
    });
    std::printf("{\"metric\":\"gemv_layer_us\",\"rows\":%d,\"attention_stand_in_us\":%.1f,\"value\":%.2f,"
                "\"gemv_tb_per_s\":%.3f}\n",
                m, spin_ns / 1000.0, us, rate(us - spin_ns / 1000.0, layer_bytes));
  }
  return 0;
}
