// The CUDA backend, on a machine with a GPU (skipped elsewhere): each fixture model in
// bf16 against the f32 goldens, held to 1.5x the error of Hugging Face's own bf16 run; and
// what the op table (test_backend_ops.cpp: each op's values against the CPU reference) does
// not check: fused kernels giving the unfused path's bits, rows the same bits at every
// batch size, graph replays, launch plans, and compositions of several ops.
#ifdef HSX_HAS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "test_util.h"

namespace hsx {
namespace {

std::unique_ptr<CudaBackend> Gpu() {
  auto b = CudaBackend::Create(0);
  return b.ok() ? std::move(b).value() : nullptr;
}

// A backend made with the environment switch `var` set to `value` (a backend reads its
// switches when made), for comparing one path against another.
std::unique_ptr<CudaBackend> GpuWith(const char* var, const char* value) {
  setenv(var, value, 1);
  auto b = Gpu();
  unsetenv(var);
  return b;
}

#define REQUIRE_GPU(gpu) \
  if (!(gpu)) GTEST_SKIP() << "no CUDA device"

// Where a model's bf16 error exceeds HF's: per prompt and layer, hsx's and HF's largest
// error against the f32 golden (relative to the prompt's largest golden value) and the token
// it is at, so a jump at one layer and token (a routing flip) reads apart from an error
// that grows everywhere.
void PrintErrorByLayer(Model& model, const SafetensorsFile& golden, const test::GoldenPrefill& out) {
  const int64_t h = model.config().hidden_size, layers = model.config().num_layers + 1;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> gold = test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value());
    const std::vector<float> hf = test::AsFloats(golden.Get("hidden_bf16gpu_" + std::to_string(k)).value());
    const std::vector<float>& mine = out.hidden[k];
    double ref = 0;
    for (float g : gold) ref = std::max(ref, static_cast<double>(std::abs(g)));
    const int64_t tokens = static_cast<int64_t>(gold.size()) / (layers * h);
    for (int64_t l = 0; l < layers; ++l) {
      double worst_mine = 0, worst_hf = 0;
      int64_t at_mine = 0, at_hf = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < h; ++j) {
          const size_t i = static_cast<size_t>((t * layers + l) * h + j);
          const double dm = std::abs(static_cast<double>(mine[i]) - gold[i]), dh = std::abs(static_cast<double>(hf[i]) - gold[i]);
          if (dm > worst_mine) worst_mine = dm, at_mine = t;
          if (dh > worst_hf) worst_hf = dh, at_hf = t;
        }
      }
      std::printf("  prompt %d layer %2ld: hsx %.3e (token %ld)  hf %.3e (token %ld)\n", k, static_cast<long>(l),
                  worst_mine / ref, static_cast<long>(at_mine), worst_hf / ref, static_cast<long>(at_hf));
    }
  }
}

// Per token of a prompt: the largest error over layers and features against the f32 golden,
// relative to the prompt's largest golden value (the measure of test::RelativeMaxError).
std::vector<double> TokenErrors(const std::vector<float>& x, const std::vector<float>& gold, int64_t layers, int64_t h) {
  double ref = 0;
  for (float g : gold) ref = std::max(ref, static_cast<double>(std::abs(g)));
  std::vector<double> errors(gold.size() / static_cast<size_t>(layers * h), 0.0);
  for (size_t i = 0; i < gold.size(); ++i) {
    const double d = std::abs(static_cast<double>(x[i]) - gold[i]) / ref;
    double& e = errors[i / static_cast<size_t>(layers * h)];
    e = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(e, d);
  }
  return errors;
}

// TokenErrors of HF's own bf16 run (hidden_bf16gpu_k) over the three golden prompts.
std::vector<double> HfBf16TokenErrors(const SafetensorsFile& golden, const ModelConfig& config) {
  std::vector<double> errors;
  for (int k = 0; k < 3; ++k) {
    for (double e : TokenErrors(test::AsFloats(golden.Get("hidden_bf16gpu_" + std::to_string(k)).value()),
                                test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value()), config.num_layers + 1,
                                config.hidden_size))
      errors.push_back(e);
  }
  return errors;
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

class CudaFixtureTest : public ::testing::TestWithParam<std::string> {};

// Dense models: hsx's largest error over every token and layer within 1.5x HF's own bf16
// run's. MoE models: top-k routing is discontinuous, so a reduced-precision run flips experts
// that the f32 run keeps apart wherever two router logits are within its rounding noise; a
// flipped token's error is ten to fifty times a typical one and spreads through attention
// to the tokens after it. Which tokens flip is chance, so the largest error is no measure:
// HF's own gpt_oss in fp16 (more precise than bf16: median token error 2.0e-3 against 1.7e-2)
// has 2.6x its bf16 run's largest error. Measured on the H200 (docs/BENCHMARKS.md): hsx's
// pre-router error at layer 0 is below HF's (RMS 0.0066 against 0.0074), and the tokens
// flipped (error over 4x HF's median) were 25 / 20 / 9 against HF's 10 / 15 / 12 (gpt_oss,
// gpt_oss_mxfp4, qwen3_moe) and HF fp16's 4 on gpt_oss. So for MoE the test holds the
// typical token (the median) within 1.5x HF's, which a wrong op anywhere moves, and the
// flipped tokens within 3x HF's count plus 2, which a routing bug (a wrong tie-break, a
// bias in the wrong dtype) exceeds by far; the bound's factor was set after the figures above.
TEST_P(CudaFixtureTest, Bf16ErrorWithinOneAndAHalfTimesHuggingFaceBf16) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto model = Model::Load(test::ModelDir(GetParam()), *gpu);
  ASSERT_TRUE(model.ok()) << model.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  const test::GoldenPrefill out = test::RunGoldenPrefill(**model, golden);
  const int64_t layers = (*model)->config().num_layers + 1, h = (*model)->config().hidden_size;
  std::vector<double> mine;
  for (int k = 0; k < 3; ++k) {
    for (double e : TokenErrors(out.hidden[k], test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value()), layers, h))
      mine.push_back(e);
  }
  const std::vector<double> hf = HfBf16TokenErrors(golden, (*model)->config());
  const double mine_max = *std::max_element(mine.begin(), mine.end()), hf_max = *std::max_element(hf.begin(), hf.end());
  std::printf("[bf16] %-15s hsx %.3e  hf %.3e  ratio %.2f\n", GetParam().c_str(), mine_max, hf_max, mine_max / hf_max);
  RecordProperty("hsx_bf16_error", std::to_string(mine_max));
  RecordProperty("hf_bf16_error", std::to_string(hf_max));
  if ((*model)->config().num_experts == 0) {
    if (mine_max > 1.5 * hf_max) PrintErrorByLayer(**model, golden, out);
    EXPECT_LE(mine_max, 1.5 * hf_max);
    return;
  }
  const double mine_median = Median(mine), hf_median = Median(hf);
  const auto flipped = [&](const std::vector<double>& e) {
    return std::count_if(e.begin(), e.end(), [&](double v) { return v > 4 * hf_median; });
  };
  const long mine_flipped = flipped(mine), hf_flipped = flipped(hf);
  std::printf("[bf16] %-15s median token: hsx %.3e  hf %.3e  ratio %.2f; flipped tokens of %zu: hsx %ld  hf %ld\n",
              GetParam().c_str(), mine_median, hf_median, mine_median / hf_median, mine.size(), mine_flipped, hf_flipped);
  if (mine_median > 1.5 * hf_median || mine_flipped > 3 * hf_flipped + 2) PrintErrorByLayer(**model, golden, out);
  EXPECT_LE(mine_median, 1.5 * hf_median);
  EXPECT_LE(mine_flipped, 3 * hf_flipped + 2);
}

// Greedy tokens against the goldens (HF's f32 greedy continuations), teacher-forced: the
// prompt and its 8 golden tokens run as one prefill on CUDA and on the f32 CPU backend (the
// goldens' own reference, within 1e-4 of HF), and each of the 8 next-token argmaxes on CUDA
// must be the golden token wherever that choice is decisive: its f32 margin over the
// runner-up exceeds twice the row's largest CUDA-vs-f32 logit difference. Nearer ties are
// bf16 chance (a free run would diverge there, as HF's bf16 run can) and are counted, not
// held; a broken path, whose logit error makes every step a "near tie", fails by the count
// of decisive steps: at least half of the 24 where HF's own bf16 hidden states are within
// 0.05 of the f32 goldens (the dense fixtures: 0.012-0.020), at least 4 where they are not
// (the fixtures' README: MoE routing flips and gemma4's deep residuals, 0.15-0.32). Measured
// on the H200 (docs/BENCHMARKS.md), the count bound set after: every decisive step held;
// dense fixtures 16-24 decisive, gemma4 10, gemma4_kvshare 5, qwen3_moe 14, gpt_oss 11.
TEST_P(CudaFixtureTest, GreedyTokensAreTheGoldensWhereverDecisive) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto model = Model::Load(test::ModelDir(GetParam()), *gpu);
  ASSERT_TRUE(model.ok()) << model.status().message();
  CpuBackend cpu;
  auto reference = Model::Load(test::ModelDir(GetParam()), cpu);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  SafetensorsFile golden = test::Golden(test::ModelDir(GetParam()) + "/golden.safetensors");
  std::vector<std::vector<int32_t>> sequences = test::GoldenPrompts(golden), greedy;
  for (int k = 0; k < 3; ++k) {
    greedy.push_back(test::AsIds(golden.Get("greedy_" + std::to_string(k)).value()));
    sequences[k].insert(sequences[k].end(), greedy.back().begin(), greedy.back().end());
  }
  const test::GoldenPrefill on_gpu = test::RunPrefill(**model, sequences), on_cpu = test::RunPrefill(**reference, sequences);
  const int64_t v = (*model)->config().vocab_size;
  int steps = 0, decisive = 0, wrong = 0, near_ties = 0;
  for (int k = 0; k < 3; ++k) {
    const int64_t prompt_len = static_cast<int64_t>(sequences[k].size() - greedy[k].size());
    for (size_t i = 0; i < greedy[k].size(); ++i) {
      const int64_t row = prompt_len - 1 + static_cast<int64_t>(i);
      const float* g = on_gpu.logits[k].data() + row * v;
      const float* c = on_cpu.logits[k].data() + row * v;
      const int32_t want = greedy[k][i];
      float runner_up = -std::numeric_limits<float>::infinity();
      double error = 0, scale = 0;
      for (int64_t j = 0; j < v; ++j) {
        if (j != want) runner_up = std::max(runner_up, c[j]);
        scale = std::max(scale, std::abs(static_cast<double>(c[j])));
        const double d = std::abs(static_cast<double>(g[j]) - c[j]);
        error = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(error, d);
      }
      const auto argmax = static_cast<int32_t>(std::max_element(g, g + v) - g);
      const double margin = static_cast<double>(c[want]) - runner_up;
      ++steps;
      ASSERT_GT(margin, -2e-4 * scale) << "the f32 CPU backend disagrees with the golden at prompt " << k << " token " << i;
      if (margin > 2 * error) {
        ++decisive;
        if (argmax != want) ++wrong;
        EXPECT_EQ(argmax, want) << "prompt " << k << " token " << i << ": f32 margin " << margin << ", logit error " << error;
      } else if (argmax != want) {
        ++near_ties;
      }
    }
  }
  const std::vector<double> hf_errors = HfBf16TokenErrors(golden, (*model)->config());
  const bool hf_bf16_close = *std::max_element(hf_errors.begin(), hf_errors.end()) < 0.05;
  std::printf("[greedy] %-15s %d of %d steps decisive, %d of them wrong; %d near ties went the other way\n",
              GetParam().c_str(), decisive, steps, wrong, near_ties);
  if (hf_bf16_close) {
    EXPECT_GE(2 * decisive, steps);
  } else {
    EXPECT_GE(decisive, 4);
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, CudaFixtureTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(GptOss, CudaFixtureTest, ::testing::ValuesIn(test::GptOssFixtureModels()),
                         [](const auto& info) { return info.param; });

// Random bf16-representable values, so both backends start from identical inputs.
Tensor RandomHost(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::Host(DType::kF32, std::move(shape));
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = BF16ToF32(F32ToBF16(dist(rng)));
  return t;
}

Tensor ToBf16(const Tensor& f32) {
  Tensor t = Tensor::Host(DType::kBF16, f32.shape());
  ConvertFromF32(f32.data<float>(), DType::kBF16, t.raw(), static_cast<size_t>(f32.numel()));
  return t;
}

// A device tensor of NaNs (all-ones bytes), so a kernel that skips part of its output
// cannot pass on what an earlier kernel (or an earlier use of the memory) left there.
Tensor Poisoned(CudaBackend& gpu, DType dtype, Shape shape) {
  Tensor host = Tensor::Host(dtype, std::move(shape));
  std::memset(host.raw(), 0xff, host.nbytes());
  return gpu.Upload(host);
}

double GpuVsCpu(CudaBackend& gpu, const Tensor& device_result, const Tensor& cpu_result) {
  return test::RelativeMaxError(test::AsFloats(gpu.Download(device_result)), test::AsFloats(cpu_result));
}

// The host RoPE table of a head dim at theta 1e6: full, or with partial Gemma 4's
// proportional variant (a quarter of the pairs rotate, the rest have zero frequencies).
RopeTable HostRopeTable(int64_t d, bool partial) {
  RopeSpec spec;
  if (partial) {
    spec.type = RopeSpec::Type::kProportional;
    spec.partial_rotary_factor = 0.25;
  }
  spec.theta = 1e6;
  RopeTable table;
  const std::vector<float> f = RopeInverseFrequencies(spec, static_cast<int>(d), &table.rotary_dims);
  table.inv_freq = Tensor::Host(DType::kF32, {static_cast<int64_t>(f.size())});
  std::copy(f.begin(), f.end(), table.inv_freq.data<float>());
  return table;
}

// Decode-sized Linear calls (m <= kGemvMaxRows) run on the weight-streaming kernel
// (gemv.cu). Weights are filled on the device (the LM head is 151936 x 4096) and given to
// the CPU reference in bf16; one reference over kGemvMaxRows + 1 rows serves every m,
// since a row's output depends on its own x row only.
struct GemvShape {
  int64_t n, k;
};

Tensor DeviceWeight(CudaBackend& gpu, int64_t n, int64_t k, uint64_t seed) {
  Tensor w = gpu.Empty(DType::kBF16, {n, k});
  gpu.FillUniform(w, seed, -0.1f, 0.1f);
  return w;
}

TEST(CudaKernelTest, GemvMatchesCpuOnDecodeShapes) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  std::mt19937 rng(11);
  const int64_t rows = cuda::kGemvMaxRows + 1;  // the last m falls back to cuBLASLt
  // Qwen3-8B's projections and LM head, then odd row counts and short rows.
  for (const GemvShape& s : std::vector<GemvShape>{{1024, 4096}, {4096, 4096}, {12288, 4096}, {4096, 12288},
                                                   {151936, 4096}, {1000, 4096}, {4097, 1024}, {3, 8},
                                                   {37, 200}, {1, 64}, {777, 2056}}) {
    const Tensor w = DeviceWeight(*gpu, s.n, s.k, 100 + s.n + s.k);
    const Tensor x = RandomHost({rows, s.k}, rng);
    Tensor expected = cpu.Empty(DType::kF32, {rows, s.n});
    cpu.Linear(x, gpu->Download(w), nullptr, expected);
    const Tensor xg = gpu->Upload(ToBf16(x));
    // Every m <= kGemvMaxRows sums each row in one fixed order, so its rows are the bits of
    // the widest call's (and no timing changes them).
    Tensor widest = Poisoned(*gpu, DType::kF32, {cuda::kGemvMaxRows, s.n});
    gpu->Linear(xg.Rows(0, cuda::kGemvMaxRows), w, nullptr, widest);
    const Tensor widest_host = gpu->Download(widest);
    for (int64_t m = 1; m <= rows; ++m) {
      const Tensor want = expected.Rows(0, m);
      for (DType out : {DType::kF32, DType::kBF16}) {
        Tensor y = Poisoned(*gpu, out, {m, s.n});
        gpu->Linear(xg.Rows(0, m), w, nullptr, y);
        EXPECT_LE(GpuVsCpu(*gpu, y, want), out == DType::kF32 ? 1e-3 : 1e-2)
            << "m=" << m << " n=" << s.n << " k=" << s.k << " " << DTypeName(out);
        if (out == DType::kF32 && m <= cuda::kGemvMaxRows) {
          const Tensor got = gpu->Download(y);
          EXPECT_EQ(std::memcmp(got.raw(), widest_host.raw(), got.nbytes()), 0)
              << "rows differ from the widest call's: m=" << m << " n=" << s.n << " k=" << s.k;
        }
      }
    }
  }
}

// Linear dispatches decode-sized calls to the kernel: its output is the kernel's, bit for bit.
TEST(CudaKernelTest, LinearRunsGemvForDecodeRows) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  std::mt19937 rng(15);
  const int64_t n = 4096, k = 4096;
  const Tensor w = DeviceWeight(*gpu, n, k, 400);
  for (int64_t m : {int64_t{1}, int64_t{5}, int64_t{cuda::kGemvMaxRows}}) {
    const Tensor x = gpu->Upload(ToBf16(RandomHost({m, k}, rng)));
    Tensor y = Poisoned(*gpu, DType::kF32, {m, n}), direct = Poisoned(*gpu, DType::kF32, {m, n});
    gpu->Linear(x, w, nullptr, y);
    gpu->Synchronize();
    ASSERT_TRUE(cuda::GemvSupports(x.raw(), w.raw(), m, k));
    cuda::Gemv(static_cast<const cuda::bf16*>(x.raw()), static_cast<const cuda::bf16*>(w.raw()), m, n, k,
               direct.raw(), true, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor a = gpu->Download(y), b = gpu->Download(direct);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "m=" << m;
  }
}

// The kernel takes 16-byte vector loads: k a multiple of 8, x and w 16-byte aligned.
TEST(CudaKernelTest, GemvSupportsOnlyVectorAlignedCalls) {
  alignas(16) static const cuda::bf16 buffer[16] = {};
  EXPECT_TRUE(cuda::GemvSupports(buffer, buffer, 1, 8));
  EXPECT_TRUE(cuda::GemvSupports(buffer, buffer + 8, cuda::kGemvMaxRows, 4096));
  EXPECT_FALSE(cuda::GemvSupports(buffer, buffer, 0, 8));
  EXPECT_FALSE(cuda::GemvSupports(buffer, buffer, cuda::kGemvMaxRows + 1, 8));
  EXPECT_FALSE(cuda::GemvSupports(buffer, buffer, 1, 4100));
  EXPECT_FALSE(cuda::GemvSupports(buffer + 1, buffer, 1, 8));
  EXPECT_FALSE(cuda::GemvSupports(buffer, buffer + 4, 1, 8));
}

// The kernel and cuBLASLt (HSX_GEMV=0) agree on every m the kernel takes.
TEST(CudaKernelTest, GemvAgreesWithCublasLt) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto gpu_old = GpuWith("HSX_GEMV", "0");
  std::mt19937 rng(13);
  for (const GemvShape& s : std::vector<GemvShape>{{1024, 4096}, {12288, 4096}, {4096, 12288}, {1000, 136}}) {
    const Tensor w_host = gpu->Download(DeviceWeight(*gpu, s.n, s.k, 200 + s.n));
    const Tensor w = gpu->Upload(w_host), w_old = gpu_old->Upload(w_host);
    const Tensor x = ToBf16(RandomHost({cuda::kGemvMaxRows, s.k}, rng));
    const Tensor xg = gpu->Upload(x), xg_old = gpu_old->Upload(x);
    for (int64_t m = 1; m <= cuda::kGemvMaxRows; ++m) {
      for (DType out : {DType::kF32, DType::kBF16}) {
        Tensor y = Poisoned(*gpu, out, {m, s.n}), y_old = Poisoned(*gpu_old, out, {m, s.n});
        gpu->Linear(xg.Rows(0, m), w, nullptr, y);
        gpu_old->Linear(xg_old.Rows(0, m), w_old, nullptr, y_old);
        EXPECT_LE(test::RelativeMaxError(test::AsFloats(gpu->Download(y)), test::AsFloats(gpu_old->Download(y_old))),
                  out == DType::kF32 ? 1e-4 : 1e-2)
            << "m=" << m << " n=" << s.n << " k=" << s.k << " " << DTypeName(out);
      }
    }
  }
}

// Graph-safe: recorded once, a replay computes on the x it finds then.
TEST(CudaKernelTest, GemvReplaysInCudaGraph) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  ASSERT_TRUE(gpu->can_record());
  CpuBackend cpu;
  std::mt19937 rng(14);
  const int64_t m = 4, n = 4096, k = 4096;
  const Tensor w = DeviceWeight(*gpu, n, k, 300);
  Tensor xg = gpu->Upload(ToBf16(RandomHost({m, k}, rng)));
  Tensor y = Poisoned(*gpu, DType::kF32, {m, n});
  auto graph = gpu->Record([&] { gpu->Linear(xg, w, nullptr, y); });
  ASSERT_NE(graph, nullptr);
  const Tensor x = RandomHost({m, k}, rng);
  gpu->UploadTo(ToBf16(x), xg);
  graph->Replay();
  Tensor expected = cpu.Empty(DType::kF32, {m, n});
  cpu.Linear(x, gpu->Download(w), nullptr, expected);
  EXPECT_LE(GpuVsCpu(*gpu, y, expected), 1e-3);
}

// HSX_PDL=1: the GEMVs start while the kernel before them still runs, loading weights, and
// wait for it before reading x. A layer's decode-sized MLP and projections, whose x each
// kernel before rewrites at every step, must give the ordinary launches' bits, step after
// step, eagerly and replayed from a graph.
TEST(CudaKernelTest, ProgrammaticGemvLaunchesWaitForTheirInput) {
  auto plain = Gpu();
  REQUIRE_GPU(plain);
  auto pdl = GpuWith("HSX_PDL", "1");
  ASSERT_NE(pdl, nullptr);
  ASSERT_TRUE(pdl->can_record());
  const int64_t m = 3, h = 4096, inter = 12288, kv = 1024;
  std::mt19937 rng(18);
  const Tensor norm_host = RandomHost({h}, rng, 0.2f);
  std::vector<Tensor> branch_steps;
  for (int step = 0; step < 6; ++step) branch_steps.push_back(ToBf16(RandomHost({m, h}, rng)));
  const Tensor residual0 = ToBf16(RandomHost({m, h}, rng));
  struct Layer {
    Tensor norm, wqkv, gate_up, down;
    Tensor residual, branch, normed, qkv, hidden, out;
  };
  const auto make = [&](CudaBackend& b) {
    Layer l;
    l.norm = b.UploadWeight(norm_host);
    l.wqkv = DeviceWeight(b, h + 2 * kv, h, 701);
    l.gate_up = DeviceWeight(b, 2 * inter, h, 704);
    l.down = DeviceWeight(b, h, inter, 706);
    l.residual = b.Upload(residual0);
    l.branch = b.Upload(branch_steps[0]);
    l.normed = Poisoned(b, DType::kBF16, {m, h});
    l.qkv = Poisoned(b, DType::kBF16, {m, h + 2 * kv});
    l.hidden = Poisoned(b, DType::kBF16, {m, inter});
    l.out = Poisoned(b, DType::kBF16, {m, h});
    return l;
  };
  const auto run = [](CudaBackend& b, Layer& l) {
    b.AddRmsNorm(l.residual, l.branch, &l.norm, 1e-6f, false, l.normed);
    b.Linear(l.normed, l.wqkv, nullptr, l.qkv);
    b.GatedLinear(l.normed, l.gate_up, Activation::kSilu, l.hidden);
    b.Linear(l.hidden, l.down, nullptr, l.out);
  };
  Layer a = make(*plain), b = make(*pdl);
  auto graph = pdl->Record([&] { run(*pdl, b); });
  ASSERT_NE(graph, nullptr);
  for (int step = 0; step < 6; ++step) {
    plain->UploadTo(branch_steps[step], a.branch);
    pdl->UploadTo(branch_steps[step], b.branch);
    run(*plain, a);
    if (step % 2 == 0) {
      run(*pdl, b);
    } else {
      graph->Replay();
    }
    for (auto [x, y, name] : {std::tuple<Tensor*, Tensor*, const char*>{&a.qkv, &b.qkv, "qkv"},
                              {&a.hidden, &b.hidden, "gated"}, {&a.out, &b.out, "down"}}) {
      const Tensor want = plain->Download(*x), got = pdl->Download(*y);
      EXPECT_EQ(std::memcmp(want.raw(), got.raw(), want.nbytes()), 0)
          << name << " differs from the ordinary launch at step " << step << (step % 2 ? " (graph)" : " (eager)");
    }
  }
}

// The gated MLP's first half on the fused gate/up weight [2n, k]: decode-sized calls
// (m <= kGemvMaxRows) run the gated GEMV, whose output must be the unfused path's bits (a
// GEMV into [m, 2n], then the strided activation kernel) and the CPU's values, for CPU
// values computed from gate and up as separate weights; m = kGemvMaxRows + 1 and a
// prefill-sized m take the GEMM and the strided activation.
TEST(CudaKernelTest, GatedLinearMatchesCpuAndTheUnfusedPath) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto unfused_gpu = GpuWith("HSX_GATED_GEMV", "0");
  CpuBackend cpu;
  std::mt19937 rng(15);
  const int64_t rows = cuda::kGemvMaxRows + 1;
  // Qwen3-8B's gate/up, then odd column counts (a block's second column past n) and short rows.
  for (const GemvShape& s : std::vector<GemvShape>{{12288, 4096}, {1001, 4096}, {3, 8}, {37, 200}, {777, 2056}}) {
    const Tensor gate_up = DeviceWeight(*gpu, 2 * s.n, s.k, 400 + s.n + s.k);
    const Tensor gate_up_host = gpu->Download(gate_up);
    const Tensor gate_up_off = unfused_gpu->Upload(gate_up_host);
    for (const int64_t big : {rows, int64_t{128}, int64_t{300}}) {
      const Tensor x = RandomHost({big, s.k}, rng);
      const Tensor xg = gpu->Upload(ToBf16(x));
      for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
        // The CPU reference from separate gate and up products.
        Tensor g = cpu.Empty(DType::kF32, {big, s.n}), u = cpu.Empty(DType::kF32, {big, s.n});
        cpu.Linear(x, gate_up_host.Rows(0, s.n), nullptr, g);
        cpu.Linear(x, gate_up_host.Rows(s.n, 2 * s.n), nullptr, u);
        Tensor expected = cpu.Empty(DType::kF32, {big, s.n});
        for (int64_t i = 0; i < expected.numel(); ++i) {
          const float a = g.data<float>()[i];
          const float gated = act == Activation::kSilu
                                  ? a / (1.0f + std::exp(-a))
                                  : 0.5f * a * (1.0f + std::tanh(0.7978845608f * (a + 0.044715f * a * a * a)));
          expected.data<float>()[i] = gated * u.data<float>()[i];
        }
        const std::vector<int64_t> ms = big == rows ? std::vector<int64_t>{1, 2, 3, 5, 8, 9} : std::vector<int64_t>{big};
        for (int64_t m : ms) {
          Tensor fused = Poisoned(*gpu, DType::kBF16, {m, s.n});
          gpu->GatedLinear(xg.Rows(0, m), gate_up, act, fused);
          EXPECT_LE(GpuVsCpu(*gpu, fused, expected.Rows(0, m)), 1e-2) << "m=" << m << " n=" << s.n << " k=" << s.k;
          Tensor unfused = Poisoned(*gpu, DType::kBF16, {m, s.n});
          gpu->Backend::GatedLinear(xg.Rows(0, m), gate_up, act, unfused);
          const Tensor a = gpu->Download(fused), b = gpu->Download(unfused);
          EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0)
              << "fused and unfused differ: m=" << m << " n=" << s.n << " k=" << s.k;
          // HSX_GATED_GEMV=0, the comparison runs' switch, takes the unfused path: the same bits.
          Tensor switched = Poisoned(*unfused_gpu, DType::kBF16, {m, s.n});
          unfused_gpu->GatedLinear(unfused_gpu->Upload(ToBf16(x)).Rows(0, m), gate_up_off, act, switched);
          const Tensor c = unfused_gpu->Download(switched);
          EXPECT_EQ(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0)
              << "HSX_GATED_GEMV=0 differs: m=" << m << " n=" << s.n << " k=" << s.k;
        }
      }
    }
  }
}

// Decode-sized steps (up to 256 rows) and larger ones run different norm kernels; a row's
// bits must not depend on which (batch invariance, and prefill against decode). Each
// kernel is also checked against the CPU reference, on rows of one warp (packed 8 to a
// block in the larger steps) and of 1-4 register chunks a thread.
TEST(CudaKernelTest, NormRowsAreTheSameBitsInSmallAndLargeSteps) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  std::mt19937 rng(5);
  const int64_t many = 301, few = 37;
  for (int64_t d : {64, 100, 256, 512, 1000, 4096, 5376, 12288}) {
    Tensor x = RandomHost({many, d}, rng), branch = RandomHost({many, d}, rng), w = RandomHost({d}, rng, 0.2f);
    const Tensor wg = gpu->UploadWeight(w);
    for (bool add : {false, true}) {
      Tensor x_cpu = cpu.Empty(DType::kF32, {many, d}), y_cpu = cpu.Empty(DType::kF32, {many, d});
      std::memcpy(x_cpu.raw(), x.raw(), x.nbytes());  // AddRmsNorm updates it; x stays the input
      if (add) {
        cpu.AddRmsNorm(x_cpu, branch, &w, 1e-6f, true, y_cpu);
      } else {
        cpu.RmsNorm(x_cpu, &w, 1e-6f, true, y_cpu);
      }
      Tensor normed[2], residual[2];  // the first `few` rows: [0] of the large step, [1] of the small
      for (int64_t rows : {many, few}) {
        Tensor xg = gpu->Upload(ToBf16(x)).Rows(0, rows);
        Tensor y = Poisoned(*gpu, DType::kBF16, {rows, d});
        if (add) {
          gpu->AddRmsNorm(xg, gpu->Upload(ToBf16(branch)).Rows(0, rows), &wg, 1e-6f, true, y);
          EXPECT_LE(GpuVsCpu(*gpu, xg, x_cpu.Rows(0, rows)), 1e-2) << "residual d=" << d << " rows=" << rows;
        } else {
          gpu->RmsNorm(xg, &wg, 1e-6f, true, y);
        }
        EXPECT_LE(GpuVsCpu(*gpu, y, y_cpu.Rows(0, rows)), 1e-2) << "d=" << d << " rows=" << rows << " add=" << add;
        normed[rows == few] = gpu->Download(y.Rows(0, few));
        residual[rows == few] = gpu->Download(xg.Rows(0, few));
      }
      EXPECT_EQ(std::memcmp(normed[0].raw(), normed[1].raw(), normed[0].nbytes()), 0)
          << "the first " << few << " normed rows differ between a " << many << "-row and a " << few
          << "-row step: d=" << d << " add=" << add;
      EXPECT_EQ(std::memcmp(residual[0].raw(), residual[1].raw(), residual[0].nbytes()), 0)
          << "residual rows differ between the steps: d=" << d << " add=" << add;
    }
  }
}

// A MoE layer on the device (gpt-oss's biases and clamped SwiGLU, or Qwen3-MoE's plain
// SiLU), its x and f32 router logits for `tokens` rows.
struct DeviceMoe {
  MoeWeights w;
  MoeSpec spec;
  Tensor x, logits;  // host f32
};

DeviceMoe MakeDeviceMoe(CudaBackend& gpu, int64_t tokens, int64_t hidden, int64_t inter, int experts, bool gpt_oss,
                        std::mt19937& rng) {
  DeviceMoe m;
  for (int e = 0; e < experts; ++e) {
    m.w.gate.push_back(gpu.UploadWeight(ToBf16(RandomHost({inter, hidden}, rng, 0.05f))));
    m.w.up.push_back(gpu.UploadWeight(ToBf16(RandomHost({inter, hidden}, rng, 0.05f))));
    m.w.down.push_back(gpu.UploadWeight(ToBf16(RandomHost({hidden, inter}, rng, 0.05f))));
  }
  m.spec.top_k = 4;
  m.spec.renormalize = true;
  if (gpt_oss) {
    m.spec.swiglu_limit = 7.0f;
    m.spec.swiglu_alpha = 1.702f;
    m.w.gate_bias = gpu.UploadWeight(ToBf16(RandomHost({experts, inter}, rng, 0.5f)));
    m.w.up_bias = gpu.UploadWeight(ToBf16(RandomHost({experts, inter}, rng, 0.5f)));
    m.w.down_bias = gpu.UploadWeight(ToBf16(RandomHost({experts, hidden}, rng, 0.5f)));
  }
  m.x = RandomHost({tokens, hidden}, rng, gpt_oss ? 4.0f : 1.0f);
  m.logits = RandomHost({tokens, experts}, rng);
  return m;
}

// Decode-sized MoE layers (up to kMoeGemvMaxTokens tokens) run on the grouped GEMVs, whose
// sums for a row involve only that row: a token's output is the same bits whichever other
// tokens share the step and however they route (batch invariant by construction), and
// within bf16 rounding of the host-sized grouped GEMMs (HSX_MOE_GEMV=0).
TEST(CudaKernelTest, MoeRowsAreTheSameBitsWhateverTheOtherTokens) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto gemm = GpuWith("HSX_MOE_GEMV", "0");
  std::mt19937 rng(33);
  const int64_t many = CudaBackend::kMoeGemvMaxTokens, hidden = 512, inter = 384;
  for (int experts : {32, 128}) {
    for (bool gpt_oss : {false, true}) {
      ASSERT_TRUE(gpu->MoeRecordable(many, experts, hidden, inter));
      ASSERT_FALSE(gemm->MoeRecordable(1, experts, hidden, inter));
      const DeviceMoe m = MakeDeviceMoe(*gpu, many, hidden, inter, experts, gpt_oss, rng);
      const Tensor x = gpu->Upload(ToBf16(m.x)), logits = gpu->Upload(m.logits);
      std::vector<Tensor> outs;  // the first row's of each step, host bf16 [hidden]
      Tensor all;
      for (int64_t rows : {many, int64_t{37}, int64_t{1}}) {
        Tensor out = Poisoned(*gpu, DType::kBF16, {rows, hidden});
        gpu->MoeMlp(x.Rows(0, rows), logits.Rows(0, rows), m.w, m.spec, out);
        outs.push_back(gpu->Download(out.Rows(0, 1)));
        if (rows == many) all = out;
      }
      for (size_t i = 1; i < outs.size(); ++i) {
        EXPECT_EQ(std::memcmp(outs[0].raw(), outs[i].raw(), outs[0].nbytes()), 0)
            << "token 0's output depends on the step's other tokens: experts=" << experts << " gpt_oss=" << gpt_oss;
      }
      Tensor reference = Poisoned(*gemm, DType::kBF16, {many, hidden});
      gemm->MoeMlp(gemm->Upload(ToBf16(m.x)), gemm->Upload(m.logits), m.w, m.spec, reference);
      EXPECT_LE(test::RelativeMaxError(test::AsFloats(gpu->Download(all)), test::AsFloats(gemm->Download(reference))),
                2e-2)
          << "experts=" << experts << " gpt_oss=" << gpt_oss;
    }
  }
}

// A row whose router logits are all NaN (a padding row over a never-written KV block, as
// the start-up recordings run) routes to experts in range on both paths: the other rows'
// outputs are the bits they get when that row is finite, and the device reports no fault.
TEST(CudaKernelTest, MoeRowOfNanLogitsRoutesInRange) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto gemm = GpuWith("HSX_MOE_GEMV", "0");
  std::mt19937 rng(35);
  const int64_t rows = 9, hidden = 256, inter = 128;
  const int experts = 32;
  for (CudaBackend* backend : {gpu.get(), gemm.get()}) {
    const DeviceMoe m = MakeDeviceMoe(*backend, rows, hidden, inter, experts, false, rng);
    Tensor nan_logits = Tensor::Host(DType::kF32, m.logits.shape());
    std::memcpy(nan_logits.raw(), m.logits.raw(), m.logits.nbytes());
    std::fill_n(nan_logits.data<float>(), experts, std::numeric_limits<float>::quiet_NaN());
    const Tensor x = backend->Upload(ToBf16(m.x));
    Tensor finite = Poisoned(*backend, DType::kBF16, {rows, hidden});
    Tensor with_nan = Poisoned(*backend, DType::kBF16, {rows, hidden});
    backend->MoeMlp(x, backend->Upload(m.logits), m.w, m.spec, finite);
    backend->MoeMlp(x, backend->Upload(nan_logits), m.w, m.spec, with_nan);
    const Tensor a = backend->Download(finite.Rows(1, rows)), b = backend->Download(with_nan.Rows(1, rows));
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << (backend == gpu.get() ? "gemv" : "gemm") << " path";
  }
}

// A decode-sized MoE layer records as a CUDA graph (nothing leaves the device: the expert
// offsets are computed there) and a replay routes anew: new x and router logits in the
// recorded inputs give the eager step's bits, though other experts are chosen.
TEST(CudaKernelTest, MoeMlpReplaysInCudaGraphWithNewRouting) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  ASSERT_TRUE(gpu->can_record());
  std::mt19937 rng(34);
  const int64_t tokens = 32, hidden = 256, inter = 128;
  const int experts = 32;
  for (bool gpt_oss : {false, true}) {
    const DeviceMoe first = MakeDeviceMoe(*gpu, tokens, hidden, inter, experts, gpt_oss, rng);
    Tensor x = gpu->Upload(ToBf16(first.x)), logits = gpu->Upload(first.logits);
    Tensor out = Poisoned(*gpu, DType::kBF16, {tokens, hidden});
    auto graph = gpu->Record([&] { gpu->MoeMlp(x, logits, first.w, first.spec, out); });
    ASSERT_NE(graph, nullptr) << "gpt_oss=" << gpt_oss;
    for (int step = 0; step < 3; ++step) {
      const Tensor new_x = ToBf16(RandomHost({tokens, hidden}, rng, gpt_oss ? 4.0f : 1.0f));
      const Tensor new_logits = RandomHost({tokens, experts}, rng);
      gpu->UploadTo(new_x, x);
      gpu->UploadTo(new_logits, logits);
      graph->Replay();
      const Tensor replayed = gpu->Download(out);
      Tensor eager = Poisoned(*gpu, DType::kBF16, {tokens, hidden});
      gpu->MoeMlp(gpu->Upload(new_x), gpu->Upload(new_logits), first.w, first.spec, eager);
      const Tensor expected = gpu->Download(eager);
      EXPECT_EQ(std::memcmp(replayed.raw(), expected.raw(), expected.nbytes()), 0)
          << "step " << step << " gpt_oss=" << gpt_oss;
    }
  }
}

// A layer's attention inputs read out of the fused q/k/v GEMM's rows (with v's columns, or
// the values as the raw keys), made ready and stored in one launch: one warp a head at
// decode sizes (norm_rope_store.cu), one block a token at prefill sizes (norm_rope.cu).
// Against the CPU's reference: q, every stored cache row, and no store for a padding row
// (slot -1) or any slot no token names; qkv left as it was. q and k must also be the bits
// of the CUDA backend's own op-by-op path (the same per-head arithmetic), and v too where
// it is not normed; and at decode sizes the per-token kernel (HSX_NORM_ROPE_STORE=0) must
// give the one-warp kernel's bits in q and both caches.
TEST(CudaKernelTest, NormRopeStoreKVMatchesCpu) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto gpu_rows = GpuWith("HSX_NORM_ROPE_STORE", "0");
  CpuBackend cpu;
  std::mt19937 rng(16);
  struct Shape3 {
    int64_t heads, kv_heads, d;
  };
  enum class Norms { kNone, kQk, kQkOnePlus, kQkv };
  for (const int64_t t : {int64_t{7}, int64_t{300}}) {
    const int64_t num_slots = 2 * t + 10;
    std::vector<int32_t> slot_list;  // distinct slots, row 2 pads
    for (int64_t i = 0; i < t; ++i) slot_list.push_back(i == 2 ? -1 : static_cast<int32_t>(num_slots - 1 - 2 * i));
    Tensor slots = Tensor::Host(DType::kI32, {t});
    std::copy(slot_list.begin(), slot_list.end(), slots.data<int32_t>());
    Tensor pos = Tensor::Host(DType::kI32, {t});
    for (int64_t i = 0; i < t; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(i * 1231 % 40000);
    for (const Shape3& sh : std::vector<Shape3>{{32, 8, 128}, {4, 2, 16}, {8, 1, 512}, {6, 3, 256}, {2, 2, 64}}) {
      for (Norms n : {Norms::kNone, Norms::kQk, Norms::kQkOnePlus, Norms::kQkv}) {
        for (bool values_are_keys : {false, true}) {
          for (bool partial : {false, true}) {  // full RoPE; Gemma 4's proportional (zero frequencies)
            const RopeTable table = HostRopeTable(sh.d, partial);
            const RopeTable gpu_table{gpu->Upload(table.inv_freq), table.rotary_dims};

            const int64_t width = (sh.heads + (values_are_keys ? 1 : 2) * sh.kv_heads) * sh.d;
            // bf16 values on both sides, so the CPU starts from what the GPU reads.
            const Tensor qkv_bf16 = ToBf16(RandomHost({t, width}, rng));
            const Tensor qkv = cpu.Empty(DType::kF32, {t, width});
            ConvertToF32(DType::kBF16, qkv_bf16.raw(), qkv.data<float>(), static_cast<size_t>(qkv.numel()));
            const Tensor qw = RandomHost({sh.d}, rng, 0.2f), kw = RandomHost({sh.d}, rng, 0.2f);
            const Tensor qwg = gpu->UploadWeight(qw), kwg = gpu->UploadWeight(kw);
            HeadNorms cpu_norms, gpu_norms;
            if (n != Norms::kNone) {
              cpu_norms.q = &qw;
              cpu_norms.k = &kw;
              gpu_norms.q = &qwg;
              gpu_norms.k = &kwg;
            }
            cpu_norms.v = gpu_norms.v = n == Norms::kQkv;
            cpu_norms.eps = gpu_norms.eps = 1e-6f;
            cpu_norms.one_plus_weight = gpu_norms.one_plus_weight = n == Norms::kQkOnePlus;

            const Shape q_shape{t, sh.heads, sh.d}, cache_shape{num_slots, sh.kv_heads, sh.d};
            Tensor q = cpu.Empty(DType::kF32, q_shape);
            Tensor kc = cpu.Empty(DType::kF32, cache_shape), vc = cpu.Empty(DType::kF32, cache_shape);
            const Tensor qkv_g = gpu->Upload(qkv_bf16);
            Tensor qg = Poisoned(*gpu, DType::kBF16, q_shape), qu = Poisoned(*gpu, DType::kBF16, q_shape);
            Tensor kcg = Poisoned(*gpu, DType::kBF16, cache_shape), vcg = Poisoned(*gpu, DType::kBF16, cache_shape);
            Tensor kcu = Poisoned(*gpu, DType::kBF16, cache_shape), vcu = Poisoned(*gpu, DType::kBF16, cache_shape);
            Tensor qr = Poisoned(*gpu, DType::kBF16, q_shape);
            Tensor kcr = Poisoned(*gpu, DType::kBF16, cache_shape), vcr = Poisoned(*gpu, DType::kBF16, cache_shape);
            const Tensor pos_g = gpu->Upload(pos), slots_g = gpu->Upload(slots);
            cpu.NormRopeStoreKV(qkv, values_are_keys, cpu_norms, pos, table, slots, kc, vc, q);
            gpu->NormRopeStoreKV(qkv_g, values_are_keys, gpu_norms, pos_g, gpu_table, slots_g, kcg, vcg, qg);
            gpu->Backend::NormRopeStoreKV(qkv_g, values_are_keys, gpu_norms, pos_g, gpu_table, slots_g, kcu, vcu, qu);
            gpu_rows->NormRopeStoreKV(qkv_g, values_are_keys, gpu_norms, pos_g, gpu_table, slots_g, kcr, vcr, qr);

            std::ostringstream what;
            what << "t=" << t << " heads " << sh.heads << "/" << sh.kv_heads << " d=" << sh.d << " norms "
                 << static_cast<int>(n) << (values_are_keys ? " k=v" : "") << (partial ? " partial rope" : "");
            EXPECT_LE(GpuVsCpu(*gpu, qg, q), 1e-2) << "q " << what.str();
            const auto same_bits = [&](const Tensor& a, const Tensor& b) {
              const Tensor ha = gpu->Download(a), hb = gpu->Download(b);
              return std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
            };
            EXPECT_TRUE(same_bits(qkv_g, gpu->Upload(qkv_bf16))) << "qkv was written: " << what.str();
            EXPECT_TRUE(same_bits(qg, qu)) << "q differs from the unfused path: " << what.str();
            EXPECT_TRUE(same_bits(kcg, kcu)) << "k cache differs from the unfused path: " << what.str();
            if (!cpu_norms.v) {
              EXPECT_TRUE(same_bits(vcg, vcu)) << "v cache differs from the unfused path: " << what.str();
            }
            EXPECT_TRUE(same_bits(qg, qr)) << "q differs between the two kernels: " << what.str();
            EXPECT_TRUE(same_bits(kcg, kcr)) << "k cache differs between the two kernels: " << what.str();
            EXPECT_TRUE(same_bits(vcg, vcr)) << "v cache differs between the two kernels: " << what.str();
            const int64_t row = sh.kv_heads * sh.d;
            const auto check_cache = [&](const Tensor& cache_gpu, const Tensor& cache_cpu, const char* name) {
              const Tensor got = gpu->Download(cache_gpu);
              for (int64_t slot = 0; slot < num_slots; ++slot) {
                const uint16_t* g = got.data<uint16_t>() + slot * row;
                if (std::count(slot_list.begin(), slot_list.end(), slot) == 0) {
                  for (int64_t i = 0; i < row; ++i)
                    ASSERT_EQ(g[i], 0xffff) << name << " cache slot " << slot << " was not to be written: " << what.str();
                  continue;
                }
                std::vector<float> g_f(row);
                for (int64_t i = 0; i < row; ++i) g_f[i] = BF16ToF32(g[i]);
                const std::vector<float> c_f(cache_cpu.data<float>() + slot * row,
                                             cache_cpu.data<float>() + (slot + 1) * row);
                EXPECT_LE(test::RelativeMaxError(g_f, c_f), 1e-2) << name << " cache slot " << slot << " " << what.str();
              }
            };
            check_cache(kcg, kc, "k");
            check_cache(vcg, vc, "v");
          }
        }
      }
    }
  }
}

// The fused q/k/v GEMM (with its bias, as Qwen2 has one) and the step after it, at decode
// sizes (the GEMV, m <= kGemvMaxRows), just past them and at prefill size, against the CPU
// computing q, k and v with separate weights and the separate ops.
TEST(CudaKernelTest, FusedQkvProjectionMatchesSeparateProjectionsOnCpu) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  std::mt19937 rng(19);
  const int64_t h = 4096, heads = 32, kv_heads = 8, d = 128, q_cols = heads * d, kv_cols = kv_heads * d;
  const int64_t width = q_cols + 2 * kv_cols;
  const Tensor w = DeviceWeight(*gpu, width, h, 801);
  const Tensor w_host = gpu->Download(w);  // bf16 [width, h]
  const Tensor bias_host = RandomHost({width}, rng, 0.5f);
  const Tensor bias = gpu->UploadWeight(bias_host);
  const Tensor kw = RandomHost({d}, rng, 0.2f), qw = RandomHost({d}, rng, 0.2f);
  const Tensor kwg = gpu->UploadWeight(kw), qwg = gpu->UploadWeight(qw);
  RopeSpec spec;
  spec.theta = 1e6;
  RopeTable table;
  const std::vector<float> f = RopeInverseFrequencies(spec, static_cast<int>(d), &table.rotary_dims);
  table.inv_freq = Tensor::Host(DType::kF32, {static_cast<int64_t>(f.size())});
  std::copy(f.begin(), f.end(), table.inv_freq.data<float>());
  const RopeTable gpu_table{gpu->Upload(table.inv_freq), table.rotary_dims};
  for (int64_t m : {1, 3, 8, 9, 64, 300}) {
    const Tensor x = ToBf16(RandomHost({m, h}, rng));
    Tensor pos = Tensor::Host(DType::kI32, {m}), slots = Tensor::Host(DType::kI32, {m});
    for (int64_t i = 0; i < m; ++i) {
      pos.data<int32_t>()[i] = static_cast<int32_t>(100 + i);
      slots.data<int32_t>()[i] = static_cast<int32_t>(i);
    }
    // CPU: separate q, k and v products, then the separate ops.
    Tensor q = cpu.Empty(DType::kF32, {m, heads, d}), k = cpu.Empty(DType::kF32, {m, kv_heads, d});
    Tensor v = cpu.Empty(DType::kF32, {m, kv_heads, d});
    const Tensor xf = cpu.Empty(DType::kF32, {m, h});
    ConvertToF32(DType::kBF16, x.raw(), xf.data<float>(), static_cast<size_t>(xf.numel()));
    int64_t row = 0;
    for (Tensor* y : {&q, &k, &v}) {
      const int64_t n = y->numel() / m;
      const Tensor b = bias_host.Rows(row, row + n);
      Tensor y2 = y->View({m, n});
      cpu.Linear(xf, w_host.Rows(row, row + n), &b, y2);
      row += n;
    }
    cpu.RmsNormRope(q, qw, 1e-6f, false, pos, table);
    cpu.RmsNormRope(k, kw, 1e-6f, false, pos, table);
    Tensor kc = cpu.Empty(DType::kF32, {m, kv_heads, d}), vc = cpu.Empty(DType::kF32, {m, kv_heads, d});
    cpu.StoreKV(k, v, slots, kc, vc);
    // CUDA: one Linear, then NormRopeStoreKV on its rows.
    Tensor qkv = Poisoned(*gpu, DType::kBF16, {m, width});
    gpu->Linear(gpu->Upload(x), w, &bias, qkv);
    HeadNorms norms;
    norms.q = &qwg;
    norms.k = &kwg;
    norms.eps = 1e-6f;
    Tensor qg = Poisoned(*gpu, DType::kBF16, {m, heads, d});
    Tensor kcg = Poisoned(*gpu, DType::kBF16, {m, kv_heads, d}), vcg = Poisoned(*gpu, DType::kBF16, {m, kv_heads, d});
    gpu->NormRopeStoreKV(qkv, false, norms, gpu->Upload(pos), gpu_table, gpu->Upload(slots), kcg, vcg, qg);
    EXPECT_LE(GpuVsCpu(*gpu, qg, q), 2e-2) << "q m=" << m;
    EXPECT_LE(GpuVsCpu(*gpu, kcg, kc), 2e-2) << "k m=" << m;
    EXPECT_LE(GpuVsCpu(*gpu, vcg, vc), 2e-2) << "v m=" << m;
  }
}

// An EAGLE-3 draft layer's input in one kernel: the bits of the unfused Embed, RmsNorm,
// WriteColumns and Copy (the base Backend's composition on the same device), at every norm
// width's thread count (32, 128, 512) and a width the kernel leaves to that composition
// (1000: not a multiple of 8); and near the CPU's f32 values.
TEST(CudaKernelTest, DraftLayerInputGivesTheBitsOfTheUnfusedOps) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  std::mt19937 rng(31);
  const int64_t rows = 7, vocab = 50;
  for (int64_t h : {16, 1000, 1024, 4096, 5120}) {
    const Tensor table = RandomHost({vocab, h}, rng, 2.0f), hidden = RandomHost({rows, h}, rng, 3.0f);
    const Tensor embed_norm = RandomHost({h}, rng, 0.5f), hidden_norm = RandomHost({h}, rng, 0.5f);
    Tensor ids = Tensor::Host(DType::kI32, {rows});
    for (int64_t i = 0; i < rows; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    const Tensor table_gpu = gpu->Upload(ToBf16(table)), hidden_gpu = gpu->Upload(ToBf16(hidden));
    const Tensor embed_norm_gpu = gpu->Upload(ToBf16(embed_norm)), hidden_norm_gpu = gpu->Upload(ToBf16(hidden_norm));
    const Tensor ids_gpu = gpu->Upload(ids);
    for (bool normed_residual : {false, true}) {
      const std::string what = "h=" + std::to_string(h) + " normed_residual=" + std::to_string(normed_residual);
      Tensor out = Poisoned(*gpu, DType::kBF16, {rows, 2 * h}), residual = Poisoned(*gpu, DType::kBF16, {rows, h});
      gpu->DraftLayerInput(table_gpu, ids_gpu, hidden_gpu, embed_norm_gpu, hidden_norm_gpu, 1e-6f, normed_residual, out,
                           residual);
      Tensor out_unfused = Poisoned(*gpu, DType::kBF16, {rows, 2 * h});
      Tensor residual_unfused = Poisoned(*gpu, DType::kBF16, {rows, h});
      gpu->Backend::DraftLayerInput(table_gpu, ids_gpu, hidden_gpu, embed_norm_gpu, hidden_norm_gpu, 1e-6f,
                                    normed_residual, out_unfused, residual_unfused);
      const Tensor got = gpu->Download(out), want = gpu->Download(out_unfused);
      const Tensor got_residual = gpu->Download(residual), want_residual = gpu->Download(residual_unfused);
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << what;
      EXPECT_EQ(std::memcmp(got_residual.raw(), want_residual.raw(), got_residual.nbytes()), 0) << what;
      Tensor out_cpu = cpu.Empty(DType::kF32, {rows, 2 * h}), residual_cpu = cpu.Empty(DType::kF32, {rows, h});
      cpu.DraftLayerInput(table, ids, hidden, embed_norm, hidden_norm, 1e-6f, normed_residual, out_cpu, residual_cpu);
      EXPECT_LE(GpuVsCpu(*gpu, out, out_cpu), 1e-2) << what;
      EXPECT_LE(GpuVsCpu(*gpu, residual, residual_cpu), 1e-2) << what;
    }
  }
}

// Slots past a context in its last block may hold anything (a freed sequence's states,
// never-written memory): fills them with NaN, which must not reach any output.
void PoisonSlotsPastContexts(const std::vector<SequenceSlice>& seqs, int64_t block, int64_t slot_elems, Tensor& k_cache,
                             Tensor& v_cache) {
  for (const SequenceSlice& s : seqs) {
    const int64_t first_unused = s.ctx_len % block;
    if (s.block_table.empty() || first_unused == 0) continue;
    const int64_t slot0 = int64_t(s.block_table.back()) * block;
    for (int64_t slot = slot0 + first_unused; slot < slot0 + block; ++slot) {
      std::fill_n(k_cache.data<float>() + slot * slot_elems, slot_elems, std::numeric_limits<float>::quiet_NaN());
      std::fill_n(v_cache.data<float>() + slot * slot_elems, slot_elems, std::numeric_limits<float>::quiet_NaN());
    }
  }
}

// A decode step: one query per sequence (or, for a verification step, the last q_lens[i]
// positions of sequence i) over a paged cache whose blocks are shuffled; a context of 0 is
// a padding row (q_len 1, no keys), as a CUDA graph's padded batch has.
struct DecodeStep {
  std::vector<SequenceSlice> seqs;
  Tensor q, k_cache, v_cache;  // f32, on the host
};

DecodeStep MakeDecodeStep(const std::vector<int>& contexts, int64_t heads, int64_t kv_heads, int64_t d, int block,
                          std::mt19937& rng, const std::vector<int>& q_lens = {}) {
  int64_t num_blocks = 0;
  for (int ctx : contexts) num_blocks += (ctx + block - 1) / block;
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  DecodeStep step;
  size_t next = 0;
  int64_t t = 0;
  for (size_t i = 0; i < contexts.size(); ++i) {
    const int ctx = contexts[i];
    SequenceSlice s;
    s.q_start = static_cast<int32_t>(t);
    s.q_len = ctx == 0 || q_lens.empty() ? 1 : std::min(ctx, q_lens[i % q_lens.size()]);
    s.ctx_len = ctx;
    for (int b = 0; b < (ctx + block - 1) / block; ++b) s.block_table.push_back(free_blocks[next++]);
    step.seqs.push_back(s);
    t += s.q_len;
  }
  step.q = RandomHost({t, heads, d}, rng);
  step.k_cache = RandomHost({std::max<int64_t>(num_blocks, 1) * block, kv_heads, d}, rng);
  step.v_cache = RandomHost({std::max<int64_t>(num_blocks, 1) * block, kv_heads, d}, rng);
  PoisonSlotsPastContexts(step.seqs, block, kv_heads * d, step.k_cache, step.v_cache);
  return step;
}

// The CPU's attention over the step's live rows; padding rows stay zero.
Tensor CpuDecodeReference(const DecodeStep& step, const AttentionParams& params) {
  CpuBackend cpu;
  std::vector<SequenceSlice> live;
  for (const SequenceSlice& s : step.seqs)
    if (s.ctx_len > 0) live.push_back(s);
  Tensor out = Tensor::Host(DType::kF32, step.q.shape());  // zero-filled
  cpu.Attention(step.q, step.k_cache, step.v_cache, MakeAttentionBatch(cpu, live), params, out);
  return out;
}

AttentionParams DecodeParams(int64_t d, int window, float softcap, int block) {
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(d));
  params.sliding_window = window;
  params.softcap = softcap;
  params.block_size = block;
  return params;
}

// The largest error of any head's output row against that row's own largest value: a
// long context's output is small beside a short one's, and one scale for the whole
// batch would hide its errors.
double WorstHeadError(const std::vector<float>& got, const std::vector<float>& want, int64_t head_dim) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); i += static_cast<size_t>(head_dim)) {
    const std::vector<float> a(got.begin() + i, got.begin() + i + head_dim),
        b(want.begin() + i, want.begin() + i + head_dim);
    worst = std::max(worst, test::RelativeMaxError(a, b));
  }
  return worst;
}

// Every padding row of a decode output is exactly zero.
void ExpectPaddingRowsZero(CudaBackend& gpu, const DecodeStep& step, const Tensor& out, const std::string& what) {
  const std::vector<float> got = test::AsFloats(gpu.Download(out));
  const int64_t row = out.numel() / out.size(0);
  for (const SequenceSlice& s : step.seqs) {
    if (s.ctx_len != 0) continue;
    for (int64_t i = 0; i < row; ++i)
      ASSERT_EQ(got[s.q_start * row + i], 0.0f) << what << ": padding row " << s.q_start << " element " << i;
  }
}

// Decode and verification steps through QkvAttention: the split-KV kernel making its own
// inputs from the fused q/k/v rows gives the bits of NormRopeStoreKV then Attention
// (HSX_FUSE_ATTENTION_INPUTS=0), in the output and both caches, and matches the CPU.
// Head dims 16-512, GQA groups 1-8, each set of head norms, values that are the keys,
// partial RoPE, windows, softcap; 1-8 queries a sequence, so the step's keys land in tiles
// fetched before the kernel's wait and in later ones, and across a chunk boundary; one
// chunk and up to 16 (merged in a cluster or by the merge kernel); a padding sequence, and
// verification rows padded at their front as a recorded step pads them (slot -1: their
// keys are the cache's). The step's slots start as NaN, so reading them early fails.
TEST(CudaKernelTest, QkvAttentionGivesTheBitsOfTheUnfusedOps) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  auto unfused = GpuWith("HSX_FUSE_ATTENTION_INPUTS", "0");
  CpuBackend cpu;
  std::mt19937 rng(21);
  constexpr int kBlock = 16;
  enum class Norms { kNone, kQk, kQkOnePlus, kQkv };
  struct Case {
    int64_t d, heads, kv_heads;
    Norms norms;
    bool values_are_keys, partial;
    int window;
    float softcap;
    std::vector<int> contexts, q_lens;
  };
  const std::vector<Case> cases = {
      {128, 32, 8, Norms::kQk, false, false, 0, 0, {512}, {1}},  // Qwen3-8B at batch 1: clusters of 16
      {128, 32, 8, Norms::kQk, false, false, 0, 0, {259}, {8}},  // its queries across a chunk boundary
      {128, 32, 8, Norms::kQk, false, false, 0, 0, {1, 0, 33, 4099, 100, 17, 2000, 64}, {1, 1, 3, 8, 2, 5, 8, 7}},
      {64, 8, 8, Norms::kNone, false, false, 0, 0, {5, 300, 1000}, {1, 8, 2}},
      {16, 4, 2, Norms::kQk, false, true, 0, 0, {9, 40}, {2, 1}},
      {256, 8, 2, Norms::kQkOnePlus, true, true, 1000, 30, {3000, 20, 1}, {1, 6, 1}},
      {512, 4, 1, Norms::kQkv, true, true, 300, 20, {32768, 9, 600}, {1, 3, 8}},
      {256, 16, 16, Norms::kQkv, false, false, 0, 0, {128, 129}, {8, 8}},
  };
  for (const Case& c : cases) {
    std::ostringstream what;
    what << "d=" << c.d << " heads=" << c.heads << "/" << c.kv_heads << " norms " << static_cast<int>(c.norms)
         << (c.values_are_keys ? " k=v" : "") << (c.partial ? " partial rope" : "") << " window=" << c.window
         << " softcap=" << c.softcap << " seqs=" << c.contexts.size();
    // The step: each sequence's last q_len positions; the first sequence of several queries
    // has its first row padded (no slot).
    int64_t num_blocks = 0;
    for (int ctx : c.contexts) num_blocks += (ctx + kBlock - 1) / kBlock;
    std::vector<int32_t> free_blocks(num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    std::vector<SequenceSlice> seqs, live;
    std::vector<int32_t> slot_list, position_list;
    size_t next = 0;
    bool padded_one = false;
    for (size_t i = 0; i < c.contexts.size(); ++i) {
      SequenceSlice sl;
      sl.q_start = static_cast<int32_t>(slot_list.size());
      sl.ctx_len = c.contexts[i];
      sl.q_len = sl.ctx_len == 0 ? 1 : std::min(sl.ctx_len, c.q_lens[i]);
      for (int b = 0; b < (sl.ctx_len + kBlock - 1) / kBlock; ++b) sl.block_table.push_back(free_blocks[next++]);
      for (int j = 0; j < sl.q_len; ++j) {
        const int pos = sl.ctx_len == 0 ? 0 : sl.ctx_len - sl.q_len + j;
        int32_t slot = sl.ctx_len == 0 ? -1 : sl.block_table[pos / kBlock] * kBlock + pos % kBlock;
        if (j == 0 && sl.q_len > 1 && !padded_one) {
          slot = -1;
          padded_one = true;
        }
        slot_list.push_back(slot);
        position_list.push_back(pos);
      }
      seqs.push_back(sl);
      if (sl.ctx_len > 0) live.push_back(sl);
    }
    const auto t = static_cast<int64_t>(slot_list.size());
    const int64_t num_slots = std::max<int64_t>(num_blocks, 1) * kBlock;
    Tensor slots = Tensor::Host(DType::kI32, {t}), pos = Tensor::Host(DType::kI32, {t});
    std::copy(slot_list.begin(), slot_list.end(), slots.data<int32_t>());
    std::copy(position_list.begin(), position_list.end(), pos.data<int32_t>());

    const int64_t width = (c.heads + (c.values_are_keys ? 1 : 2) * c.kv_heads) * c.d;
    const Tensor qkv = RandomHost({t, width}, rng);
    const Shape cache_shape{num_slots, c.kv_heads, c.d}, out_shape{t, c.heads, c.d};
    const Tensor k_cache = RandomHost(cache_shape, rng), v_cache = RandomHost(cache_shape, rng);
    // The device caches: the step's slots NaN.
    Tensor k_bf16 = ToBf16(k_cache), v_bf16 = ToBf16(v_cache);
    const int64_t row = c.kv_heads * c.d;
    for (int32_t slot : slot_list) {
      if (slot < 0) continue;
      std::fill_n(k_bf16.data<uint16_t>() + slot * row, row, 0xffff);
      std::fill_n(v_bf16.data<uint16_t>() + slot * row, row, 0xffff);
    }
    const Tensor qw = RandomHost({c.d}, rng, 0.2f), kw = RandomHost({c.d}, rng, 0.2f);
    const RopeTable table = HostRopeTable(c.d, c.partial);
    const AttentionParams params = DecodeParams(c.d, c.window, c.softcap, kBlock);
    const auto norms_of = [&](const Tensor& q_weight, const Tensor& k_weight) {
      HeadNorms n;
      if (c.norms != Norms::kNone) {
        n.q = &q_weight;
        n.k = &k_weight;
      }
      n.v = c.norms == Norms::kQkv;
      n.eps = 1e-6f;
      n.one_plus_weight = c.norms == Norms::kQkOnePlus;
      return n;
    };

    // The CPU (f32) over the live sequences; padding rows stay zero.
    Tensor cpu_k = cpu.Empty(DType::kF32, cache_shape), cpu_v = cpu.Empty(DType::kF32, cache_shape);
    std::memcpy(cpu_k.raw(), k_cache.raw(), k_cache.nbytes());
    std::memcpy(cpu_v.raw(), v_cache.raw(), v_cache.nbytes());
    Tensor expected = Tensor::Host(DType::kF32, out_shape);  // zero-filled
    cpu.QkvAttention(qkv, c.values_are_keys, norms_of(qw, kw), pos, table, slots, cpu_k, cpu_v,
                     MakeAttentionBatch(cpu, live), params, expected);

    // Each GPU path into poison; the output and the caches come back to the host.
    struct Result {
      Tensor out, k, v;
    };
    const auto run = [&](CudaBackend& b, bool fused) {
      const Tensor qwg = b.UploadWeight(qw), kwg = b.UploadWeight(kw);
      const RopeTable device_table{b.Upload(table.inv_freq), table.rotary_dims};
      const Tensor qkv_g = b.Upload(ToBf16(qkv));
      Tensor kc = b.Upload(k_bf16), vc = b.Upload(v_bf16), out = Poisoned(b, DType::kBF16, out_shape);
      const AttentionBatch batch = MakeAttentionBatch(b, seqs);
      EXPECT_EQ(b.FusesAttentionInputs(qkv_g, kc, device_table, batch, out), fused) << what.str();
      b.QkvAttention(qkv_g, c.values_are_keys, norms_of(qwg, kwg), b.Upload(pos), device_table, b.Upload(slots), kc,
                     vc, batch, params, out);
      return Result{b.Download(out), b.Download(kc), b.Download(vc)};
    };
    const Result one = run(*gpu, true), two = run(*unfused, false);
    const auto same_bits = [](const Tensor& a, const Tensor& b) {
      return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    };
    EXPECT_TRUE(same_bits(one.out, two.out)) << "output differs from the unfused ops: " << what.str();
    EXPECT_TRUE(same_bits(one.k, two.k)) << "k cache differs from the unfused ops: " << what.str();
    EXPECT_TRUE(same_bits(one.v, two.v)) << "v cache differs from the unfused ops: " << what.str();
    EXPECT_LE(WorstHeadError(test::AsFloats(one.out), test::AsFloats(expected), c.d), 2e-2) << what.str();
    const std::vector<float> got = test::AsFloats(one.out);
    for (const SequenceSlice& sl : seqs) {
      if (sl.ctx_len != 0) continue;
      for (int64_t i = 0; i < c.heads * c.d; ++i)
        ASSERT_EQ(got[sl.q_start * c.heads * c.d + i], 0.0f) << "padding row " << sl.q_start << ": " << what.str();
    }
  }
}

// The split plan (host only): chunks fill two blocks per SM; a cluster merges them only
// while its blocks stay at most one per SM and the device holds every cluster at once, and
// never past its size (16; 8 at head dim 512); the kernel makes its inputs in one wave.
TEST(CudaKernelTest, DecodeSplitPlanMergesInClustersOnlyWhereMeasuredFaster) {
  const auto plan = [](int seqs, int q_len, int heads, int kv_heads, int d, int capacity) {
    const cuda::DecodeSplits p = cuda::PlanDecodeSplits(seqs, q_len, heads, kv_heads, d, 132, capacity);
    return std::make_pair(p.count, p.cluster_merge);
  };
  EXPECT_EQ(plan(1, 1, 32, 8, 128, 16), std::make_pair(16, true));   // Qwen3-8B, batch 1: 128 blocks
  EXPECT_EQ(plan(1, 4, 32, 8, 128, 16), std::make_pair(16, true));   // its verification of 3 drafts
  EXPECT_EQ(plan(1, 1, 32, 8, 128, 0), std::make_pair(33, false));   // no clusters (HSX_DECODE_CLUSTER=0)
  EXPECT_EQ(plan(1, 1, 32, 8, 128, 7), std::make_pair(33, false));   // 8 clusters, 7 fit at once
  EXPECT_EQ(plan(4, 1, 32, 8, 128, 64), std::make_pair(8, false));   // 256 blocks: the merge kernel
  EXPECT_EQ(plan(1, 1, 32, 8, 512, 16), std::make_pair(8, true));    // clusters of 8 at head dim 512
  EXPECT_EQ(plan(1, 1, 16, 16, 128, 16), std::make_pair(16, false)); // 16 KV heads: 256 blocks
  EXPECT_EQ(plan(32, 1, 32, 8, 128, 16), std::make_pair(1, false));  // batch 32: one chunk, no merge
  EXPECT_EQ(plan(0, 1, 32, 8, 128, 16), std::make_pair(1, false));
  // The kernel makes its own inputs while its blocks fit one wave of two per SM.
  const auto fused = [](int seqs, int q_len) {
    return cuda::PlanDecodeSplits(seqs, q_len, 32, 8, 128, 132, 16).fused_inputs;
  };
  EXPECT_TRUE(fused(1, 1));
  EXPECT_TRUE(fused(33, 1));    // 264 blocks
  EXPECT_FALSE(fused(34, 1));   // 272
  EXPECT_FALSE(fused(128, 1));  // Qwen3-8B at batch 128: four waves
  EXPECT_FALSE(fused(32, 8));   // two row tiles a KV head: 512 blocks
}

// The device holds batch 1's clusters of every head dim at once (8 KV heads' worth).
TEST(CudaKernelTest, DecodeClustersFitTheDevice) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  for (int d : {16, 32, 64, 128, 256, 512}) EXPECT_GE(cuda::DecodeClusterCapacity(d), 8) << "head dim " << d;
  EXPECT_EQ(cuda::DecodeClusterCapacity(96), 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Graph-safe: a decode step captured in a CUDA graph with one set of contexts and
// replayed after the device's seq_info changed (longer, shorter, padding) gives the
// attention of the new contexts, so no launch parameter came from per-sequence data.
TEST(CudaKernelTest, DecodeAttentionReplaysInCudaGraphWithNewContexts) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  std::mt19937 rng(8);
  constexpr int kBlock = 16;
  const int64_t heads = 16, kv_heads = 2, d = 128;
  // The caches and block tables hold the longest contexts; the captured step sees less.
  const std::vector<int> full = {30000, 513, 2000, 1, 9000};
  const DecodeStep step = MakeDecodeStep(full, heads, kv_heads, d, kBlock, rng);
  DecodeStep captured = step;
  for (SequenceSlice& s : captured.seqs) s.ctx_len = std::max(1, s.ctx_len / 7);
  const AttentionParams params = DecodeParams(d, 0, 0, kBlock);

  const Tensor q = gpu->Upload(ToBf16(step.q)), kc = gpu->Upload(ToBf16(step.k_cache));
  const Tensor vc = gpu->Upload(ToBf16(step.v_cache));
  const AttentionBatch batch = MakeAttentionBatch(*gpu, captured.seqs);
  Tensor out = Poisoned(*gpu, DType::kBF16, step.q.shape());
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  // Both merges of the chunks, in a cluster and by the merge kernel, with a cluster's
  // most chunks (a size only Hopper allows), so that their outputs must be the same bits.
  const int splits = cuda::PlanDecodeSplits(1, 1, 32, 8, static_cast<int>(d), 132, 16).count;
  ASSERT_EQ(splits, 16);
  std::map<bool, std::vector<uint16_t>> longer_bits;
  for (const bool cluster_merge : {true, false}) {
    cuda::AttentionArgs a{};
    a.q = static_cast<const cuda::bf16*>(q.raw());
    a.k_cache = static_cast<const cuda::bf16*>(kc.raw());
    a.v_cache = static_cast<const cuda::bf16*>(vc.raw());
    a.out = static_cast<cuda::bf16*>(out.raw());
    a.seq_info = batch.seq_info.data<int32_t>();
    a.block_tables = batch.block_tables.data<int32_t>();
    a.num_seqs = static_cast<int>(full.size());
    a.max_q_len = 1;
    a.num_heads = static_cast<int>(heads);
    a.kv_heads = static_cast<int>(kv_heads);
    a.head_dim = static_cast<int>(d);
    a.block_size = kBlock;
    a.scale = params.scale;
    a.decode_cluster_merge = cluster_merge;
    a.decode_splits = splits;
    const size_t workspace_bytes = cuda::DecodeAttentionWorkspaceBytes(a.num_seqs, 1, a.num_heads, a.head_dim,
                                                                       a.decode_splits, cluster_merge);
    ASSERT_EQ(workspace_bytes == 0, cluster_merge);
    const Tensor workspace = gpu->Empty(DType::kF32, {static_cast<int64_t>(workspace_bytes / sizeof(float)) + 1});
    a.decode_workspace = cluster_merge ? nullptr : workspace.data<float>();
    gpu->Synchronize();  // uploads done before another stream reads them

    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(cuda::Attention(a, stream));  // first use (kernel attributes) outside the capture, as a warm-up
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_TRUE(cuda::Attention(a, stream));
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

    auto replay_with = [&](const DecodeStep& now, const std::string& what) {
      std::vector<int32_t> info;
      for (size_t i = 0; i < now.seqs.size(); ++i)
        info.insert(info.end(), {now.seqs[i].q_start, 1, now.seqs[i].ctx_len, batch.seq_info_host[i * 4 + 3]});
      ASSERT_EQ(cudaMemcpyAsync(batch.seq_info.data<int32_t>(), info.data(), info.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(out.raw(), 0xff, out.nbytes(), stream), cudaSuccess);  // poison again
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_LE(WorstHeadError(test::AsFloats(gpu->Download(out)), test::AsFloats(CpuDecodeReference(now, params)), d),
                2e-2)
          << what << (cluster_merge ? " (merged in a cluster)" : " (merge kernel)");
      ExpectPaddingRowsZero(*gpu, now, out, what);
    };
    replay_with(captured, "as captured");
    replay_with(step, "longer contexts");
    const Tensor longer = gpu->Download(out);
    longer_bits[cluster_merge].assign(longer.data<uint16_t>(), longer.data<uint16_t>() + longer.numel());
    DecodeStep padded = step;
    padded.seqs[1].ctx_len = 0;
    padded.seqs[3].ctx_len = 0;
    replay_with(padded, "padding rows");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  EXPECT_EQ(longer_bits[true], longer_bits[false]);
}

TEST(CudaFp8Test, LinearMatchesCpuFp8) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  std::mt19937 rng(22);
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 64, 64}, {7, 1024, 4096}, {33, 96, 208}, {300, 4096, 4096}, {2048, 12288, 4096}}) {
    const Tensor x = RandomHost({m, k}, rng), w = RandomHost({n, k}, rng, 0.05f), b = RandomHost({n}, rng);
    Tensor y_cpu = cpu.Empty(DType::kF32, {m, n});
    cpu.Linear(x, cpu.QuantizeRowsFp8(w), &b, y_cpu);
    Tensor y_gpu = Poisoned(*gpu, DType::kBF16, {m, n});
    const Tensor wq = gpu->QuantizeRowsFp8(gpu->UploadWeight(w)), bb = gpu->UploadWeight(b);
    const Tensor xg = gpu->Upload(ToBf16(x));
    gpu->Linear(xg, wq, &bb, y_gpu);
    // Identical codes and scales; the sums differ only in f32 order (fast accumulation)
    // and y's bf16 rounding.
    EXPECT_LE(GpuVsCpu(*gpu, y_gpu, y_cpu), 1e-2) << m << "x" << n << "x" << k;
    // x quantized beforehand gives the same bits.
    Tensor y_pre = Poisoned(*gpu, DType::kBF16, {m, n});
    gpu->Linear(gpu->QuantizeRowsFp8(xg), wq, &bb, y_pre);
    const Tensor a = gpu->Download(y_gpu), b2 = gpu->Download(y_pre);
    EXPECT_EQ(std::memcmp(a.raw(), b2.raw(), a.nbytes()), 0) << m << "x" << n << "x" << k;
  }
}

// Codes and row scales of two FP8 tensors, byte for byte.
bool SameFp8(CudaBackend& gpu, const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::kF8E4M3 || b.dtype() != DType::kF8E4M3 || a.shape() != b.shape()) return false;
  const Tensor ca = gpu.Download(a), cb = gpu.Download(b);
  const Tensor sa = gpu.Download(*a.row_scales()), sb = gpu.Download(*b.row_scales());
  return std::memcmp(ca.raw(), cb.raw(), ca.nbytes()) == 0 && sa.nbytes() == sb.nbytes() &&
         std::memcmp(sa.raw(), sb.raw(), sa.nbytes()) == 0;
}

// Frees a poisoned tensor of the output's size just before the op under test, so that the
// caching allocator is likely to hand the op NaN codes (0xff) wherever it writes nothing.
void PoisonNextAllocation(CudaBackend& gpu, int64_t rows, int64_t cols) {
  (void)Poisoned(gpu, DType::kF8E4M3, {rows, cols});
  (void)Poisoned(gpu, DType::kF32, {rows});
}

// The norms before FP8 projections write their codes and scales directly: the bits of
// AddRmsNorm / RmsNorm into bf16, then QuantizeRowsFp8 (the base Backend's composition on
// the same device), and the same updated residual; at every norm width's thread count
// (32, 128, 512) and register chunk count, with and without a weight.
TEST(CudaFp8Test, FusedNormGivesTheBitsOfNormThenQuantize) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  std::mt19937 rng(23);
  for (int64_t dim : {16, 64, 1008, 1024, 2560, 4096, 5120, 8192, 16384, 32768, 65536}) {
    const int64_t rows = 37;
    const Tensor x_host = ToBf16(RandomHost({rows, dim}, rng, 3.0f));
    const Tensor branch = gpu->Upload(ToBf16(RandomHost({rows, dim}, rng)));
    const Tensor w = gpu->Upload(ToBf16(RandomHost({dim}, rng, 0.5f)));
    for (bool add : {false, true}) {
      for (bool weighted : {false, true}) {
        for (bool one_plus : {false, true}) {
          if (!weighted && one_plus) continue;
          std::ostringstream what;
          what << "dim=" << dim << " add=" << add << " weight=" << weighted << " one_plus=" << one_plus;
          Tensor x_fused = gpu->Upload(x_host), x_unfused = gpu->Upload(x_host);
          PoisonNextAllocation(*gpu, rows, dim);
          const Tensor* b = add ? &branch : nullptr;
          const Tensor* weight = weighted ? &w : nullptr;
          const Tensor fused = gpu->RmsNormFp8(x_fused, b, weight, 1e-6f, one_plus);
          const Tensor unfused = gpu->Backend::RmsNormFp8(x_unfused, b, weight, 1e-6f, one_plus);
          EXPECT_TRUE(SameFp8(*gpu, fused, unfused)) << what.str();
          const Tensor residual = gpu->Download(x_fused), residual_unfused = gpu->Download(x_unfused);
          EXPECT_EQ(std::memcmp(residual.raw(), residual_unfused.raw(), residual.nbytes()), 0)
              << "residual: " << what.str();
          if (!add) {
            EXPECT_EQ(std::memcmp(residual.raw(), x_host.raw(), residual.nbytes()), 0)
                << "x was written: " << what.str();
          }
        }
      }
    }
  }
}

// The gated activation before an FP8 down projection writes its codes and scales directly:
// the bits of GatedActivation into bf16, then QuantizeRowsFp8, for SiLU and GELU, from 1 to
// 16 register chunks a thread (Qwen3-8B's 12288, Llama-3.1-70B's 28672).
TEST(CudaFp8Test, FusedGatedActivationGivesTheBitsOfActivationThenQuantize) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  std::mt19937 rng(24);
  for (int64_t cols : {16, 208, 2048, 3072, 6144, 12288, 28672}) {
    const int64_t rows = 37;
    const Tensor gate_up = gpu->Upload(ToBf16(RandomHost({rows, 2 * cols}, rng, 2.0f)));
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
      PoisonNextAllocation(*gpu, rows, cols);
      const Tensor fused = gpu->GatedActivationFp8(gate_up, act);
      const Tensor unfused = gpu->Backend::GatedActivationFp8(gate_up, act);
      EXPECT_TRUE(SameFp8(*gpu, fused, unfused)) << "cols=" << cols << " act=" << static_cast<int>(act);
    }
  }
}

class CudaFp8FixtureTest : public ::testing::TestWithParam<std::string> {};

// The worst relative errors over a fixture's golden prompts of an FP8 model on the device
// and on the CPU, and of Hugging Face's bf16 run.
struct Fp8Errors {
  double gpu = 0, cpu = 0, hf_bf16 = 0;
};
Fp8Errors Fp8ErrorsOnGoldens(Model& on_gpu, Model& on_cpu, const SafetensorsFile& golden) {
  const test::GoldenPrefill gpu_out = test::RunGoldenPrefill(on_gpu, golden);
  const test::GoldenPrefill cpu_out = test::RunGoldenPrefill(on_cpu, golden);
  Fp8Errors e;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> gold = test::AsFloats(golden.Get("hidden_" + std::to_string(k)).value());
    e.gpu = std::max(e.gpu, test::RelativeMaxError(gpu_out.hidden[k], gold));
    e.cpu = std::max(e.cpu, test::RelativeMaxError(cpu_out.hidden[k], gold));
    e.hf_bf16 = std::max(e.hf_bf16, test::RelativeMaxError(
                                        test::AsFloats(golden.Get("hidden_bf16gpu_" + std::to_string(k)).value()), gold));
  }
  return e;
}

// The error --quantization fp8 adds on the device, next to the CPU's FP8 reference and
// Hugging Face's bf16 on the same goldens: the device's bf16 activations add about HF's
// bf16 error on top of the FP8 rounding both share.
TEST_P(CudaFp8FixtureTest, ErrorNearTheCpuFp8Reference) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  const std::string dir = test::ModelDir(GetParam());
  auto on_gpu = Model::Load(dir, *gpu);
  auto on_cpu = Model::Load(dir, cpu);
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok());
  ASSERT_TRUE((*on_gpu)->QuantizeWeightsFp8().ok());
  ASSERT_TRUE((*on_cpu)->QuantizeWeightsFp8().ok());
  const Fp8Errors e = Fp8ErrorsOnGoldens(**on_gpu, **on_cpu, test::Golden(dir + "/golden.safetensors"));
  std::printf("[fp8] %-15s hsx cuda fp8 %.3e  cpu fp8 %.3e  hf bf16 %.3e  cuda fp8 / hf bf16 %.2f\n",
              GetParam().c_str(), e.gpu, e.cpu, e.hf_bf16, e.gpu / e.hf_bf16);
  RecordProperty("hsx_fp8_error", std::to_string(e.gpu));
  EXPECT_LE(e.gpu, 1.5 * e.cpu + e.hf_bf16);
}

// An FP8 checkpoint (compressed-tensors, made by llm-compressor from the qwen3 fixture:
// tests/test_fp8_checkpoint.cpp) runs its own codes and scales on the device as on the CPU.
TEST(CudaFp8Test, Fp8CheckpointNearTheCpuReference) {
  auto gpu = Gpu();
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  const std::string dir = test::DataPath("fp8/qwen3_fp8_dynamic");
  auto on_gpu = Model::Load(dir, *gpu);
  auto on_cpu = Model::Load(dir, cpu);
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok());
  ASSERT_EQ((*on_gpu)->weights().layers[0].down_proj.dtype(), DType::kF8E4M3);
  const Fp8Errors e =
      Fp8ErrorsOnGoldens(**on_gpu, **on_cpu, test::Golden(test::ModelDir("qwen3") + "/golden.safetensors"));
  std::printf("[fp8] checkpoint hsx cuda %.3e  cpu %.3e  hf bf16 %.3e\n", e.gpu, e.cpu, e.hf_bf16);
  EXPECT_LE(e.gpu, 1.5 * e.cpu + e.hf_bf16);
}

// The fused FP8 inputs change no bit of a model's states or logits: each fixture's prefill
// with them and without (HSX_FP8_FUSED_INPUTS=0). Both backends run the heuristic's GEMM
// algorithms (HSX_GEMM_TUNE=0), so that timing cannot pick different ones.
TEST_P(CudaFp8FixtureTest, FusedInputsKeepTheUnfusedBits) {
  setenv("HSX_GEMM_TUNE", "0", 1);
  auto gpu = Gpu();
  auto unfused_gpu = GpuWith("HSX_FP8_FUSED_INPUTS", "0");
  unsetenv("HSX_GEMM_TUNE");
  REQUIRE_GPU(gpu);
  const std::string dir = test::ModelDir(GetParam());
  auto fused = Model::Load(dir, *gpu);
  auto unfused = Model::Load(dir, *unfused_gpu);
  ASSERT_TRUE(fused.ok() && unfused.ok());
  ASSERT_TRUE((*fused)->QuantizeWeightsFp8().ok());
  ASSERT_TRUE((*unfused)->QuantizeWeightsFp8().ok());
  SafetensorsFile golden = test::Golden(dir + "/golden.safetensors");
  const test::GoldenPrefill a = test::RunGoldenPrefill(**fused, golden);
  const test::GoldenPrefill b = test::RunGoldenPrefill(**unfused, golden);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(a.hidden[k] == b.hidden[k]) << "hidden states of prompt " << k;
    EXPECT_TRUE(a.logits[k] == b.logits[k]) << "logits of prompt " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, CudaFp8FixtureTest, ::testing::ValuesIn(test::FixtureModels()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace hsx
#endif  // HSX_HAS_CUDA
