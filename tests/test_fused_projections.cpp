// Projections that run as one GEMM: q/k/v and gate/up concatenated at load, and the ops
// that read the fused output with a row stride, against the unfused arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "model/decoder_layer.h"
#include "model/weights.h"
#include "test_util.h"

namespace hsx {
namespace {

Tensor Random(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::Host(DType::kF32, std::move(shape));
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

Tensor Poisoned(CpuBackend& cpu, Shape shape) {
  Tensor t = cpu.Empty(DType::kF32, std::move(shape));
  std::fill(t.data<float>(), t.data<float>() + t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

float Gated(Activation act, float g, float u) {
  const float a = act == Activation::kSilu ? g / (1.0f + std::exp(-g))
                                           : 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
  return a * u;
}

// GatedActivation reads gate's columns then up's from each row of [T, 2I].
TEST(FusedProjectionsTest, GatedActivationReadsBothHalvesOfEachRow) {
  CpuBackend cpu;
  std::mt19937 rng(1);
  const int64_t t = 5, inter = 37;
  const Tensor gate_up = Random({t, 2 * inter}, rng);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    Tensor out = Poisoned(cpu, {t, inter});
    cpu.GatedActivation(gate_up, act, out);
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < inter; ++c) {
        const float* row = gate_up.data<float>() + r * 2 * inter;
        EXPECT_FLOAT_EQ(out.data<float>()[r * inter + c], Gated(act, row[c], row[inter + c])) << r << "," << c;
      }
    }
  }
}

// GatedLinear on the fused [2I, K] weight gives the separate gate and up products' values.
TEST(FusedProjectionsTest, GatedLinearOnTheFusedWeightIsTheUnfusedMlp) {
  CpuBackend cpu;
  std::mt19937 rng(2);
  const int64_t k = 48, inter = 72;
  const Tensor gate = Random({inter, k}, rng, 0.2f), up = Random({inter, k}, rng, 0.2f);
  Tensor gate_up;
  ASSERT_TRUE(PlaceRows(cpu, gate, 0, 2 * inter, "gate", gate_up).ok());
  ASSERT_TRUE(PlaceRows(cpu, up, inter, 2 * inter, "up", gate_up).ok());
  for (int64_t t : {1, 3, 8, 9, 130}) {
    const Tensor x = Random({t, k}, rng);
    Tensor g = cpu.Empty(DType::kF32, {t, inter}), u = cpu.Empty(DType::kF32, {t, inter});
    cpu.Linear(x, gate, nullptr, g);
    cpu.Linear(x, up, nullptr, u);
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
      Tensor out = Poisoned(cpu, {t, inter});
      cpu.GatedLinear(x, gate_up, act, out);
      for (int64_t i = 0; i < t * inter; ++i) {
        const float want = Gated(act, g.data<float>()[i], u.data<float>()[i]);
        EXPECT_NEAR(out.data<float>()[i], want, 1e-5f * (1.0f + std::abs(want))) << "t=" << t << " i=" << i;
      }
    }
  }
}

// PlaceRows refuses parts of different dtypes rather than mixing them in one weight.
TEST(FusedProjectionsTest, PlaceRowsRefusesAPartOfAnotherDtype) {
  CpuBackend cpu;
  Tensor fused;
  ASSERT_TRUE(PlaceRows(cpu, Tensor::Host(DType::kF32, {2, 4}), 0, 4, "a", fused).ok());
  const Status s = PlaceRows(cpu, Tensor::Host(DType::kBF16, {2, 4}), 2, 4, "model.layers.0.mlp.up_proj.weight", fused);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor 'model.layers.0.mlp.up_proj.weight' has dtype"), std::string::npos) << s.message();
}

// A test model as loaded (projections fused) next to its checkpoint's tensors as stored.
struct LoadedAndStored {
  ModelConfig config;
  ModelWeights weights;
  CheckpointTensors tensors;
};

// Fails the calling test (wrap the call in ASSERT_NO_FATAL_FAILURE) when either read fails.
void LoadAndOpen(const std::string& model, LoadedAndStored& out) {
  const std::string dir = test::ModelDir(model);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().message();
  CpuBackend cpu;
  auto weights = LoadWeights(dir, *config, cpu);
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  auto tensors = OpenCheckpoint(dir);
  ASSERT_TRUE(tensors.ok()) << tensors.status().message();
  out = {std::move(*config), std::move(*weights), std::move(*tensors)};
}

// The checkpoint's gate_proj and up_proj, bit for bit, as the rows of one weight.
TEST(FusedProjectionsTest, LoadingConcatenatesGateAndUp) {
  LoadedAndStored m;
  ASSERT_NO_FATAL_FAILURE(LoadAndOpen("qwen3", m));
  const int64_t inter = m.config.intermediate_size;
  for (size_t l = 0; l < m.weights.layers.size(); ++l) {
    const Tensor& fused = m.weights.layers[l].gate_up_proj;
    ASSERT_EQ(fused.size(0), 2 * inter);
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    for (auto [name, begin] : {std::pair<const char*, int64_t>{"gate_proj.weight", 0}, {"up_proj.weight", inter}}) {
      const Tensor& want = m.tensors.at(p + name).first;
      const Tensor got = fused.Rows(begin, begin + inter);
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << p << name;
    }
  }
}

// A fused q/k/v row [T, W] built from separate q, k and v: the columns of each in turn.
Tensor Concat(const std::vector<const Tensor*>& parts, int64_t t) {
  int64_t width = 0;
  for (const Tensor* p : parts) width += p->numel() / t;
  Tensor out = Tensor::Host(DType::kF32, {t, width});
  int64_t col = 0;
  for (const Tensor* p : parts) {
    const int64_t w = p->numel() / t;
    for (int64_t r = 0; r < t; ++r) std::copy_n(p->data<float>() + r * w, w, out.data<float>() + r * width + col);
    col += w;
  }
  return out;
}

// NormRopeStoreKV reads q, k and v out of the fused GEMM's rows (v from k's columns when the
// values are the keys) and gives what the separate ops give on separate q, k and v: q in
// its own tensor, k and v in the caches at their slots, nothing at a padding row's or an
// unnamed slot, and qkv unchanged.
TEST(FusedProjectionsTest, NormRopeStoreKVReadsTheFusedRows) {
  CpuBackend cpu;
  std::mt19937 rng(3);
  const int64_t t = 6, heads = 4, kv_heads = 2, d = 16, num_slots = 20;
  const std::vector<int32_t> slot_list = {7, 0, -1, 19, 3, 12};
  const Tensor slots = HostInts(slot_list);
  std::vector<int32_t> pos_list;
  for (int64_t i = 0; i < t; ++i) pos_list.push_back(static_cast<int32_t>(i * 331 % 5000));
  const Tensor pos = HostInts(pos_list);
  RopeSpec spec;
  spec.theta = 1e4;
  RopeTable rope;
  const std::vector<float> f = RopeInverseFrequencies(spec, static_cast<int>(d), &rope.rotary_dims);
  rope.inv_freq = Tensor::Host(DType::kF32, {static_cast<int64_t>(f.size())});
  std::copy(f.begin(), f.end(), rope.inv_freq.data<float>());
  const Tensor qw = Random({d}, rng, 0.2f), kw = Random({d}, rng, 0.2f);
  for (bool values_are_keys : {false, true}) {
    for (bool qk_norm : {false, true}) {
      for (bool v_norm : {false, true}) {
        HeadNorms norms;
        if (qk_norm) {
          norms.q = &qw;
          norms.k = &kw;
        }
        norms.v = v_norm;
        norms.eps = 1e-6f;
        const Tensor q = Random({t, heads, d}, rng), k = Random({t, kv_heads, d}, rng);
        const Tensor v = values_are_keys ? k : Random({t, kv_heads, d}, rng);
        const Tensor qkv = values_are_keys ? Concat({&q, &k}, t) : Concat({&q, &k, &v}, t);
        const std::vector<float> qkv_before = test::AsFloats(qkv);

        // The separate ops on separate copies.
        Tensor q_want = cpu.Empty(DType::kF32, q.shape()), k_want = cpu.Empty(DType::kF32, k.shape());
        Tensor v_want = cpu.Empty(DType::kF32, v.shape());
        cpu.Copy(q, q_want);
        cpu.Copy(k, k_want);
        cpu.Copy(v, v_want);
        for (Tensor* x : {&q_want, &k_want}) {
          if (qk_norm) cpu.RmsNorm(*x, x == &q_want ? &qw : &kw, 1e-6f, false, *x);
          cpu.Rope(*x, pos, rope);
        }
        if (v_norm) cpu.RmsNorm(v_want, nullptr, 1e-6f, false, v_want);

        Tensor q_got = Poisoned(cpu, {t, heads, d});
        Tensor kc = Poisoned(cpu, {num_slots, kv_heads, d}), vc = Poisoned(cpu, {num_slots, kv_heads, d});
        cpu.NormRopeStoreKV(qkv, values_are_keys, norms, pos, rope, slots, kc, vc, q_got);

        std::ostringstream what;
        what << "values_are_keys=" << values_are_keys << " qk_norm=" << qk_norm << " v_norm=" << v_norm;
        EXPECT_EQ(test::AsFloats(qkv), qkv_before) << what.str();
        EXPECT_EQ(test::AsFloats(q_got), test::AsFloats(q_want)) << what.str();
        const int64_t row = kv_heads * d;
        for (int64_t slot = 0; slot < num_slots; ++slot) {
          const auto it = std::find(slot_list.begin(), slot_list.end(), slot);
          for (auto [cache, want] : {std::pair<const Tensor*, const Tensor*>{&kc, &k_want}, {&vc, &v_want}}) {
            const float* got = cache->data<float>() + slot * row;
            if (it == slot_list.end()) {
              EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[row - 1])) << "slot " << slot << " written " << what.str();
              continue;
            }
            const float* w = want->data<float>() + (it - slot_list.begin()) * row;
            EXPECT_TRUE(std::equal(got, got + row, w)) << "slot " << slot << " " << what.str();
          }
        }
      }
    }
  }
}

// The checkpoint's q_proj, k_proj and v_proj (and biases: Qwen2) as the row blocks of one
// weight; a KV-sharing layer's (Gemma 4) holds q's rows alone, a k_eq_v layer's no v.
TEST(FusedProjectionsTest, LoadingConcatenatesQkv) {
  for (const std::string model : {"qwen2", "gemma4", "gemma4_kvshare"}) {
    LoadedAndStored m;
    ASSERT_NO_FATAL_FAILURE(LoadAndOpen(model, m)) << model;
    std::string prefix = "model.";
    if (m.tensors.count("model.language_model.embed_tokens.weight")) prefix = "model.language_model.";
    for (size_t l = 0; l < m.weights.layers.size(); ++l) {
      const LayerSpec& spec = m.config.layers[l];
      const std::string p = prefix + "layers." + std::to_string(l) + ".self_attn.";
      std::vector<std::string> parts = {"q_proj"};
      if (spec.kv_source == static_cast<int>(l)) parts.push_back("k_proj");
      if (spec.kv_source == static_cast<int>(l) && !spec.k_eq_v) parts.push_back("v_proj");
      for (const std::string kind : {"weight", "bias"}) {
        const Tensor& fused = kind == "weight" ? m.weights.layers[l].qkv_proj : m.weights.layers[l].qkv_bias;
        if (kind == "bias" && !m.config.qkv_bias) {
          EXPECT_FALSE(fused.defined());
          continue;
        }
        int64_t row = 0;
        for (const std::string& part : parts) {
          const Tensor& want = m.tensors.at(p + part + "." + kind).first;
          const Tensor got = fused.Rows(row, row + want.size(0));
          EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << model << " " << p << part << "." << kind;
          row += want.size(0);
        }
        EXPECT_EQ(row, fused.size(0)) << model << " layer " << l << " " << kind;
      }
    }
  }
}

}  // namespace
}  // namespace hsx
