#include "model/weights.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "model/mxfp4.h"
#include "util/json.h"
#include "util/text_file.h"

namespace hsx {
namespace {

enum class Init { kMatrix, kNorm, kScalar };

// gate_up_proj [E, H, 2I] (gate and up interleaved along 2I), its bias [E, 2I], and
// down_proj [E, I, H]: transposed against hsx's [out, in] weights.
enum class ExpertStack { kNone, kGateUp, kGateUpBias, kDown };

// One expected checkpoint tensor: its name, its shape as the config implies, and where
// it goes. Loading and dummy initialization both walk this one list.
// A tensor-parallel rank takes `count` rows (split_dim 0) or columns (1) from `begin`.
struct Slot {
  std::string name;
  Shape shape;  // the checkpoint's
  Tensor* dst;
  Init init;
  int split_dim = -1;  // -1: replicated
  int64_t begin = 0, count = 0;
  // A part of a fused tensor (PlaceRows): its rows start at part_row of the fused_rows of *dst.
  int64_t part_row = -1, fused_rows = 0;
  bool projection = false;  // a decoder projection, which an FP8 checkpoint may hold as E4M3
  // gpt-oss's stacked experts: one checkpoint tensor for every expert, split at placement
  // (PlaceExpertStack) into `experts`' per-expert matrices or bias rows.
  ExpertStack stack = ExpertStack::kNone;
  MoeWeights* experts = nullptr;

  Shape rank_shape() const {
    Shape s = shape;
    if (split_dim >= 0) s[split_dim] = count;
    return s;
  }
};

// Where a checkpoint keeps the decoder's tensors and the output projection.
struct Naming {
  std::string prefix = "model.";
  std::string lm_head = "lm_head.weight";
};

// Tensor-parallel ranks (model/tensor_parallel.h) take their slices of the same list.
std::vector<Slot> Schema(const ModelConfig& c, ModelWeights& w, Shard shard = {}, const Naming& naming = {}) {
  const std::string& prefix = naming.prefix;
  const ModelConfig rank = RankConfig(c, shard);
  std::vector<Slot> s;
  const int64_t h = c.hidden_size;
  auto add = [&](const std::string& name, Shape shape, Tensor* dst, Init init = Init::kMatrix) {
    s.push_back({prefix + name, std::move(shape), dst, init});
  };
  // Rows (dim 0) or columns (dim 1) [part * count, (part + 1) * count) of the last added.
  auto split = [&](int dim, int64_t part, int64_t count) {
    if (shard.size == 1) return;
    s.back().split_dim = dim;
    s.back().begin = part * count;
    s.back().count = count;
  };
  // The last added is rows [row, row + its rank rows) of the total_rows of its (fused) dst.
  auto part = [&](int64_t row, int64_t total_rows) {
    s.back().part_row = row;
    s.back().fused_rows = total_rows;
  };
  add("embed_tokens.weight", {c.vocab_size, h}, &w.embed_tokens);
  add("norm.weight", {h}, &w.final_norm, Init::kNorm);
  if (!c.tie_word_embeddings) {
    s.push_back({naming.lm_head, {c.vocab_size, h}, &w.lm_head, Init::kMatrix});
    if (VocabParallel(c, shard.size)) split(0, shard.rank, c.vocab_size / shard.size);
  }
  if (c.per_layer_input_size > 0) {
    const int64_t total = static_cast<int64_t>(c.num_layers) * c.per_layer_input_size;
    add("embed_tokens_per_layer.weight", {c.per_layer_vocab_size, total}, &w.embed_tokens_per_layer);
    add("per_layer_model_projection.weight", {total, h}, &w.per_layer_model_projection);
    add("per_layer_projection_norm.weight", {c.per_layer_input_size}, &w.per_layer_projection_norm, Init::kNorm);
  }
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerSpec& spec = c.layers[i];
    LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t q_out = static_cast<int64_t>(c.num_heads) * spec.head_dim;
    const int64_t kv_out = static_cast<int64_t>(spec.num_kv_heads) * spec.head_dim;
    const bool owns_kv = spec.kv_source == i;
    // This rank's query heads, KV heads and intermediate columns.
    const int64_t q_rows = static_cast<int64_t>(rank.num_heads) * spec.head_dim;
    const int64_t kv_rows = static_cast<int64_t>(rank.layers[i].num_kv_heads) * spec.head_dim;
    const int64_t kv_part = FirstKvHead(c, i, shard) / rank.layers[i].num_kv_heads;
    add(p + "input_layernorm.weight", {h}, &l.input_norm, Init::kNorm);
    add(p + "post_attention_layernorm.weight", {h}, &l.post_attention_norm, Init::kNorm);
    if (c.sandwich_norms) {
      add(p + "pre_feedforward_layernorm.weight", {h}, &l.pre_feedforward_norm, Init::kNorm);
      add(p + "post_feedforward_layernorm.weight", {h}, &l.post_feedforward_norm, Init::kNorm);
    }
    // q, k and v (as the layer has them) are the row blocks of one weight, and of one bias.
    const int64_t qkv_rows = q_rows + (owns_kv ? (spec.k_eq_v ? 1 : 2) * kv_rows : 0);
    auto add_qkv = [&](const std::string& kind, const Shape& shape_q, const Shape& shape_kv, Tensor* dst, Init init) {
      add(p + "self_attn.q_proj." + kind, shape_q, dst, init);
      split(0, shard.rank, q_rows);
      part(0, qkv_rows);
      s.back().projection = kind == "weight";
      if (!owns_kv) return;
      add(p + "self_attn.k_proj." + kind, shape_kv, dst, init);
      split(0, kv_part, kv_rows);
      part(q_rows, qkv_rows);
      s.back().projection = kind == "weight";
      if (spec.k_eq_v) return;
      add(p + "self_attn.v_proj." + kind, shape_kv, dst, init);
      split(0, kv_part, kv_rows);
      part(q_rows + kv_rows, qkv_rows);
      s.back().projection = kind == "weight";
    };
    add_qkv("weight", {q_out, h}, {kv_out, h}, &l.qkv_proj, Init::kMatrix);
    add(p + "self_attn.o_proj.weight", {h, q_out}, &l.o_proj);
    split(1, shard.rank, q_rows);
    s.back().projection = true;
    if (c.qkv_bias) add_qkv("bias", {q_out}, {kv_out}, &l.qkv_bias, Init::kScalar);
    if (c.o_bias) add(p + "self_attn.o_proj.bias", {h}, &l.o_bias, Init::kScalar);
    if (c.attention_sinks) add(p + "self_attn.sinks", {c.num_heads}, &l.sinks, Init::kScalar);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {spec.head_dim}, &l.q_norm, Init::kNorm);
      if (owns_kv) add(p + "self_attn.k_norm.weight", {spec.head_dim}, &l.k_norm, Init::kNorm);
    }
    if (spec.moe && c.moe_biases) {  // gpt-oss
      const int64_t inter = c.moe_intermediate_size, e = c.num_experts;
      add(p + "mlp.router.weight", {e, h}, &l.router);
      add(p + "mlp.router.bias", {e}, &l.router_bias, Init::kScalar);
      auto stack = [&](const std::string& name, Shape shape, ExpertStack kind, Init init) {
        add(p + "mlp.experts." + name, std::move(shape), nullptr, init);
        s.back().stack = kind;
        s.back().experts = &l.experts;
      };
      stack("gate_up_proj", {e, h, 2 * inter}, ExpertStack::kGateUp, Init::kMatrix);
      stack("gate_up_proj_bias", {e, 2 * inter}, ExpertStack::kGateUpBias, Init::kScalar);
      stack("down_proj", {e, inter, h}, ExpertStack::kDown, Init::kMatrix);
      add(p + "mlp.experts.down_proj_bias", {e, h}, &l.experts.down_bias, Init::kScalar);
    } else if (spec.moe) {
      const int64_t inter = c.moe_intermediate_size;
      add(p + "mlp.gate.weight", {c.num_experts, h}, &l.router);
      l.experts.gate.resize(c.num_experts);
      l.experts.up.resize(c.num_experts);
      l.experts.down.resize(c.num_experts);
      for (int e = 0; e < c.num_experts; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        add(ep + "gate_proj.weight", {inter, h}, &l.experts.gate[e]);
        split(0, shard.rank, rank.moe_intermediate_size);
        add(ep + "up_proj.weight", {inter, h}, &l.experts.up[e]);
        split(0, shard.rank, rank.moe_intermediate_size);
        add(ep + "down_proj.weight", {h, inter}, &l.experts.down[e]);
        split(1, shard.rank, rank.moe_intermediate_size);
      }
    } else {
      const int64_t inter = rank.intermediate_size;
      add(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, &l.gate_up_proj);
      split(0, shard.rank, inter);
      part(0, 2 * inter);
      s.back().projection = true;
      add(p + "mlp.up_proj.weight", {c.intermediate_size, h}, &l.gate_up_proj);
      split(0, shard.rank, inter);
      part(inter, 2 * inter);
      s.back().projection = true;
      add(p + "mlp.down_proj.weight", {h, c.intermediate_size}, &l.down_proj);
      split(1, shard.rank, rank.intermediate_size);
      s.back().projection = true;
    }
    if (c.layer_scalar) add(p + "layer_scalar", {1}, &l.layer_scalar, Init::kScalar);
    if (c.per_layer_input_size > 0) {
      add(p + "per_layer_input_gate.weight", {c.per_layer_input_size, h}, &l.per_layer_input_gate);
      add(p + "per_layer_projection.weight", {h, c.per_layer_input_size}, &l.per_layer_projection);
      add(p + "post_per_layer_input_norm.weight", {h}, &l.post_per_layer_input_norm, Init::kNorm);
    }
  }
  return s;
}

// The shard files model.safetensors.index.json names: plain file names in DIR (a path
// that leaves DIR is refused), each listed once.
Result<std::vector<std::string>> ShardFiles(const std::string& dir, const std::string& index_path) {
  HSX_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(index_path));
  HSX_ASSIGN_OR_RETURN(const nlohmann::json index, ParseJson(text, index_path));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return Error(index_path + ": expected a JSON object with a 'weight_map' object");
  }
  std::vector<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) return Error(index_path + ": weight_map['" + name + "'] is not a file name");
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\0') != std::string::npos ||
        shard == "." || shard == "..") {
      return Error(index_path + ": weight_map['" + name + "'] = '" + shard + "' is not a file name in the model directory");
    }
    const std::string path = dir + "/" + shard;
    if (std::find(files.begin(), files.end(), path) == files.end()) files.push_back(path);
  }
  if (files.empty()) return Error(index_path + ": 'weight_map' names no files");
  return files;
}

// Text-only checkpoints use model.*; multimodal ones nest the language model as
// model.language_model.* (transformers 5) or language_model.model.* with
// language_model.lm_head (transformers 4, e.g. Gemma 3 4B and up).
Naming FindNaming(const CheckpointTensors& tensors) {
  if (tensors.count("model.language_model.embed_tokens.weight")) return {"model.language_model.", "lm_head.weight"};
  if (tensors.count("language_model.model.embed_tokens.weight")) return {"language_model.model.", "language_model.lm_head.weight"};
  return {};
}

// safetensors promises no alignment; the backends read weights as typed arrays, so an
// unaligned tensor (never one the reference writer made) is copied to aligned memory.
Tensor Aligned(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw()) % DTypeSize(t.dtype()) == 0) return t;
  Tensor copy = Tensor::Host(t.dtype(), t.shape());
  std::memcpy(copy.raw(), t.raw(), t.nbytes());
  return copy;
}

// Tied checkpoints may still carry an lm_head copy; untied ones must have it. A
// vocabulary-parallel rank's tied head is its rows of the (replicated) embedding.
void FinishTied(const ModelConfig& c, Shard shard, ModelWeights& w) {
  if (!c.tie_word_embeddings) return;
  w.lm_head = w.embed_tokens;
  if (VocabParallel(c, shard.size)) {
    const int64_t rows = c.vocab_size / shard.size;
    w.lm_head = w.embed_tokens.Rows(shard.rank * rows, (shard.rank + 1) * rows);
  }
}

// Attention sinks join the softmax in f32 (the kernels read them as floats): whatever the
// checkpoint's dtype, they are kept as f32 on the device.
void SinksToF32(ModelWeights& w, Backend& backend) {
  for (LayerWeights& l : w.layers) {
    if (!l.sinks.defined() || l.sinks.dtype() == DType::kF32) continue;
    const Tensor host = backend.Download(l.sinks);
    Tensor f = Tensor::Host(DType::kF32, host.shape());
    ConvertToF32(host.dtype(), host.raw(), f.data<float>(), static_cast<size_t>(host.numel()));
    l.sinks = backend.Upload(f);
  }
}

// This rank's rows or columns of a host tensor: rows are a view of the mapped file, columns
// a copy of just them, so a rank converts and uploads only its slice.
Tensor RankSlice(const Tensor& t, const Slot& slot) {
  if (slot.split_dim < 0) return t;
  if (slot.split_dim == 0) return t.Rows(slot.begin, slot.begin + slot.count);
  const int64_t rows = t.size(0), cols = t.size(1);
  const size_t elem = DTypeSize(t.dtype());
  Tensor out = Tensor::Host(t.dtype(), {rows, slot.count});
  const char* src = static_cast<const char*>(t.raw());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(out.raw()) + r * slot.count * elem, src + (r * cols + slot.begin) * elem,
                slot.count * elem);
  }
  return out;
}

// The index of the first NaN among n E4M3 codes (S.1111.111: 0x7f or 0xff; E4M3 has no
// infinities), or -1. Eight codes at a time: a byte of x & 0x7f.. plus 1 reaches 0x80
// only from 0x7f, and never carries into the next byte.
int64_t FirstE4M3NaN(const uint8_t* codes, int64_t n) {
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full, kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, codes + i, 8);
    if ((((word & kLow7) + kOnes) & kHigh) != 0) break;  // a NaN among these eight
  }
  for (; i < n; ++i) {
    if ((codes[i] & 0x7f) == 0x7f) return i;
  }
  return -1;
}

// An FP8 checkpoint's weight (compressed-tensors): E4M3 codes [rows, k] and
// `<module>.weight_scale` [rows, 1], one scale per output channel; this rank's rows or
// columns of the codes, and the scales of its rows, f32.
struct Fp8Weight {
  Tensor codes, row_scales;
};
Result<Fp8Weight> ReadFp8Weight(const CheckpointTensors& tensors, const std::string& model_dir, const Slot& slot) {
  if (slot.shape.size() != 2) {
    return Error(model_dir + ": tensor '" + slot.name + "' is F8_E4M3, but only matrices may be (expected shape " +
                 ShapeToString(slot.shape) + " in bf16 or f32)");
  }
  HSX_ASSIGN_OR_RETURN(const Tensor codes,
                       CheckpointTensor(tensors, model_dir, slot.name, slot.shape, {DType::kF8E4M3}, "F8_E4M3"));
  const std::string scale_name = slot.name + "_scale";
  const int64_t rows = slot.shape[0];
  HSX_ASSIGN_OR_RETURN(const Tensor scale, CheckpointFloatTensor(tensors, model_dir, scale_name, {rows, 1}));
  Tensor scales = Tensor::Host(DType::kF32, {rows});
  ConvertToF32(scale.dtype(), scale.raw(), scales.data<float>(), static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float v = scales.data<float>()[r];
    if (!std::isfinite(v) || v < 0.0f) {
      return Error(model_dir + ": tensor '" + scale_name + "' row " + std::to_string(r) + " is " + std::to_string(v) +
                   " (expected a finite scale >= 0)");
    }
  }
  // A NaN code would make every state its rows touch NaN: refused, as a corrupt file. Each
  // rank reads only its slice, which it reads to upload anyway.
  Fp8Weight w{RankSlice(codes, slot), slot.split_dim == 0 ? scales.Rows(slot.begin, slot.begin + slot.count) : scales};
  if (const int64_t bad = FirstE4M3NaN(w.codes.data<uint8_t>(), w.codes.numel()); bad >= 0) {
    const int64_t row = bad / w.codes.size(1) + (slot.split_dim == 0 ? slot.begin : 0);
    const int64_t col = bad % w.codes.size(1) + (slot.split_dim == 1 ? slot.begin : 0);
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", w.codes.data<uint8_t>()[bad]);
    return Error(model_dir + ": tensor '" + slot.name + "' row " + std::to_string(row) + " column " +
                 std::to_string(col) + " is " + code + ", an E4M3 NaN (a corrupt checkpoint?)");
  }
  return w;
}

// A dense decoder projection runs on its codes: the codes with f32 row scales, the form
// --quantization fp8 gives.
Result<Tensor> LoadFp8Projection(const CheckpointTensors& tensors, const std::string& model_dir, const Slot& slot,
                                 Backend& backend) {
  if (slot.shape[1] % 16 != 0) {  // FP8 GEMMs read 16-byte rows (cuBLASLt's requirement on Hopper)
    return Error(model_dir + ": tensor '" + slot.name + "' has " + std::to_string(slot.shape[1]) +
                 " input features, which FP8 GEMMs need as a multiple of 16");
  }
  HSX_ASSIGN_OR_RETURN(const Fp8Weight w, ReadFp8Weight(tensors, model_dir, slot));
  return backend.Upload(w.codes).WithRowScales(backend.Upload(w.row_scales));
}

// Any other E4M3 matrix (MoE experts, which run on bf16 grouped GEMMs, as --quantization
// fp8 leaves them) is dequantized at load: code times its row's scale, the value the
// checkpoint means, then the backend's weight dtype (bf16 rounds it on CUDA).
Result<Tensor> LoadDequantizedFp8(const CheckpointTensors& tensors, const std::string& model_dir, const Slot& slot,
                                  Backend& backend) {
  HSX_ASSIGN_OR_RETURN(const Fp8Weight w, ReadFp8Weight(tensors, model_dir, slot));
  const int64_t rows = w.codes.size(0), cols = w.codes.size(1);
  Tensor values = Tensor::Host(DType::kF32, {rows, cols});
  ConvertToF32(DType::kF8E4M3, w.codes.raw(), values.data<float>(), static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = w.row_scales.data<float>()[r];
    float* row = values.data<float>() + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] *= scale;
  }
  return backend.UploadWeight(values);
}

// Expert e's matrix of a stacked tensor as hsx multiplies it, [out, in] in f32: the
// transpose of the checkpoint's [in, out] slice.
Tensor ExpertMatrix(const Tensor& stack, int64_t e) {
  const int64_t in = stack.size(1), out = stack.size(2);
  std::vector<float> src(static_cast<size_t>(in * out));
  ConvertToF32(stack.dtype(), stack.data<char>() + e * in * out * DTypeSize(stack.dtype()), src.data(), src.size());
  Tensor m = Tensor::Host(DType::kF32, {out, in});
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) m.data<float>()[o * in + i] = src[i * out + o];
  return m;
}

// Rows `parity`, parity + 2, ... of m [2n, k]: gate_up's gate (0) or up (1) half.
Tensor EveryOtherRow(const Tensor& m, int parity) {
  const int64_t rows = m.size(0) / 2, k = m.size(1);
  Tensor out = Tensor::Host(DType::kF32, {rows, k});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * k, m.data<float>() + (2 * r + parity) * k, k * sizeof(float));
  return out;
}

// Places one expert's [2I, H] gate_up rows (interleaved) or [H, I] down matrix.
void PlaceExpert(ExpertStack kind, int64_t e, const Tensor& m, MoeWeights& experts, Backend& backend) {
  if (kind == ExpertStack::kDown) {
    experts.down[e] = backend.UploadWeight(m);
    return;
  }
  experts.gate[e] = backend.UploadWeight(EveryOtherRow(m, 0));
  experts.up[e] = backend.UploadWeight(EveryOtherRow(m, 1));
}

// Splits a stacked expert tensor (host, the checkpoint's layout) into the experts' weights.
void PlaceExpertStack(const Slot& slot, const Tensor& t, Backend& backend) {
  MoeWeights& ex = *slot.experts;
  const int64_t num = slot.shape[0];
  ex.gate.resize(num);
  ex.up.resize(num);
  ex.down.resize(num);
  if (slot.stack == ExpertStack::kGateUpBias) {  // [E, 2I] -> gate [E, I], up [E, I]
    const int64_t inter = slot.shape[1] / 2;
    std::vector<float> all(static_cast<size_t>(t.numel()));
    ConvertToF32(t.dtype(), t.raw(), all.data(), all.size());
    Tensor gate = Tensor::Host(DType::kF32, {num, inter}), up = Tensor::Host(DType::kF32, {num, inter});
    for (int64_t i = 0; i < num * inter; ++i) {
      gate.data<float>()[i] = all[2 * i];
      up.data<float>()[i] = all[2 * i + 1];
    }
    ex.gate_bias = backend.UploadWeight(gate);
    ex.up_bias = backend.UploadWeight(up);
    return;
  }
  for (int64_t e = 0; e < num; ++e) PlaceExpert(slot.stack, e, ExpertMatrix(t, e), ex, backend);
}

// An MXFP4 checkpoint's stacked expert matrices (model/mxfp4.h): `<name>_blocks` [E, out,
// in/32, 16] and `<name>_scales` [E, out, in/32], rows already [out, in] as hsx multiplies
// them, dequantized one expert at a time.
Status LoadMxfp4Experts(const CheckpointTensors& tensors, const std::string& model_dir, const Slot& slot,
                        Backend& backend) {
  const int64_t num = slot.shape[0];
  const int64_t in = slot.shape[1], out = slot.shape[2];  // the bf16 tensor's [E, in, out]
  if (in % kMxfp4BlockSize != 0) {
    return Error(model_dir + ": tensor '" + slot.name + "_blocks': MXFP4 needs the input width (" + std::to_string(in) +
                 ") to be a multiple of 32");
  }
  const int64_t groups = in / kMxfp4BlockSize;
  HSX_ASSIGN_OR_RETURN(const Tensor blocks, CheckpointTensor(tensors, model_dir, slot.name + "_blocks",
                                                             {num, out, groups, kMxfp4BlockSize / 2}, {DType::kU8}, "U8"));
  HSX_ASSIGN_OR_RETURN(const Tensor scales,
                       CheckpointTensor(tensors, model_dir, slot.name + "_scales", {num, out, groups}, {DType::kU8}, "U8"));
  MoeWeights& ex = *slot.experts;
  ex.gate.resize(num);
  ex.up.resize(num);
  ex.down.resize(num);
  for (int64_t e = 0; e < num; ++e) {
    Tensor m = Tensor::Host(DType::kF32, {out, in});
    DequantizeMxfp4(blocks.data<uint8_t>() + e * out * in / 2, scales.data<uint8_t>() + e * out * groups, out, in,
                    m.data<float>());
    PlaceExpert(slot.stack, e, m, ex, backend);
  }
  return {};
}

// Puts a loaded (or drawn) tensor where its slot says: the whole of its destination, or its
// rows of a fused one.
Status Place(const Slot& slot, const Tensor& t, Backend& backend) {
  if (slot.stack != ExpertStack::kNone) {
    PlaceExpertStack(slot, t, backend);
    return {};
  }
  if (slot.part_row < 0) {
    *slot.dst = t;
    return {};
  }
  return PlaceRows(backend, t, slot.part_row, slot.fused_rows, slot.name, *slot.dst);
}

}  // namespace

Status PlaceRows(Backend& backend, const Tensor& part, int64_t row, int64_t total_rows, const std::string& name,
                 Tensor& fused) {
  if (!fused.defined()) {
    Shape shape = part.shape();
    shape[0] = total_rows;
    fused = backend.Empty(part.dtype(), shape);
    if (part.row_scales() != nullptr) fused = fused.WithRowScales(backend.Empty(DType::kF32, {total_rows}));
  }
  if (fused.dtype() != part.dtype()) {
    return Error("tensor '" + name + "' has dtype " + std::string(DTypeName(part.dtype())) + ", but the tensors " +
                 "it is fused with (one GEMM) have " + std::string(DTypeName(fused.dtype())));
  }
  Tensor rows = fused.Rows(row, row + part.size(0));
  backend.Copy(part, rows);
  if (part.row_scales() != nullptr) {  // an FP8 part: its scales too
    Tensor scales = fused.row_scales()->Rows(row, row + part.size(0));
    backend.Copy(*part.row_scales(), scales);
  }
  return {};
}

Result<CheckpointTensors> OpenCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path)) {
    HSX_ASSIGN_OR_RETURN(files, ShardFiles(dir, index_path));
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.push_back(dir + "/model.safetensors");
  } else {
    return Error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  CheckpointTensors all;
  for (const auto& path : files) {
    HSX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
    for (const auto& [name, t] : file.tensors()) {
      auto [it, inserted] = all.emplace(name, std::make_pair(t, path));
      if (!inserted) return Error(path + ": tensor '" + name + "' is also in " + it->second.second);
    }
  }
  return all;
}

Result<Tensor> CheckpointTensor(const CheckpointTensors& tensors, const std::string& model_dir, const std::string& name,
                                const Shape& shape, std::initializer_list<DType> dtypes, const char* expected) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return Error(model_dir + ": missing tensor '" + name + "' (expected shape " + ShapeToString(shape) + ")");
  }
  const Tensor& t = it->second.first;
  if (t.shape() != shape) {
    return Error(it->second.second + ": tensor '" + name + "' has shape " + ShapeToString(t.shape()) +
                 ", but config.json implies " + ShapeToString(shape));
  }
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end()) {
    return Error(it->second.second + ": tensor '" + name + "' has dtype " + std::string(DTypeName(t.dtype())) +
                 ", expected " + expected);
  }
  return Aligned(t);
}

Result<Tensor> CheckpointFloatTensor(const CheckpointTensors& tensors, const std::string& model_dir,
                                     const std::string& name, const Shape& shape) {
  return CheckpointTensor(tensors, model_dir, name, shape, {DType::kF32, DType::kBF16, DType::kF16},
                          "a float type (BF16, F16 or F32)");
}

Result<Tensor> UploadCheckpointWeight(const CheckpointTensors& tensors, const std::string& model_dir,
                                      const std::string& name, const Shape& shape, Backend& backend) {
  HSX_ASSIGN_OR_RETURN(const Tensor t, CheckpointFloatTensor(tensors, model_dir, name, shape));
  return backend.UploadWeight(t);
}

Result<ModelWeights> LoadWeightsFrom(const WeightSource& fetch, const ModelConfig& config, Backend& backend,
                                     Shard shard) {
  ModelWeights w;
  for (const Slot& slot : Schema(config, w, shard)) {
    HSX_ASSIGN_OR_RETURN(const Tensor host, fetch(slot.name, slot.shape));
    HSX_RETURN_IF_ERROR(Place(slot, slot.stack != ExpertStack::kNone ? host : backend.UploadWeight(RankSlice(host, slot)), backend));
  }
  FinishTied(config, shard, w);
  SinksToF32(w, backend);
  return w;
}

Result<ModelWeights> LoadWeights(const std::string& model_dir, const ModelConfig& config, Backend& backend,
                                 Shard shard) {
  HSX_ASSIGN_OR_RETURN(auto tensors, OpenCheckpoint(model_dir));
  ModelWeights w;
  for (const Slot& slot : Schema(config, w, shard, FindNaming(tensors))) {
    // An FP8 checkpoint keeps the projections its quantization_config does not ignore as E4M3.
    const auto found = tensors.find(slot.name);
    if (config.fp8_checkpoint && found != tensors.end() && found->second.first.dtype() == DType::kF8E4M3) {
      HSX_ASSIGN_OR_RETURN(const Tensor fp8, slot.projection ? LoadFp8Projection(tensors, model_dir, slot, backend)
                                                             : LoadDequantizedFp8(tensors, model_dir, slot, backend));
      HSX_RETURN_IF_ERROR(Place(slot, fp8, backend));
      continue;
    }
    const bool matrices = slot.stack == ExpertStack::kGateUp || slot.stack == ExpertStack::kDown;
    if (config.mxfp4_experts && matrices && found == tensors.end()) {
      HSX_RETURN_IF_ERROR(LoadMxfp4Experts(tensors, model_dir, slot, backend));
      continue;
    }
    HSX_ASSIGN_OR_RETURN(const Tensor t, CheckpointFloatTensor(tensors, model_dir, slot.name, slot.shape));
    HSX_RETURN_IF_ERROR(Place(slot, slot.stack != ExpertStack::kNone ? t : backend.UploadWeight(RankSlice(t, slot)), backend));
  }
  FinishTied(config, shard, w);
  SinksToF32(w, backend);
  return w;
}

// Draws a stacked expert slot's per-expert tensors: matrices uniform with std 1/sqrt(fan_in),
// biases small.
void DummyExpertStack(const Slot& slot, DType dtype, Backend& backend, uint64_t seed) {
  MoeWeights& ex = *slot.experts;
  const int64_t num = slot.shape[0];
  ex.gate.resize(num);
  ex.up.resize(num);
  ex.down.resize(num);
  auto draw = [&](Shape shape, uint64_t s, float half_width) {
    Tensor t = backend.Empty(dtype, std::move(shape));
    backend.FillUniform(t, s, -half_width, half_width);
    return t;
  };
  if (slot.stack == ExpertStack::kGateUpBias) {
    ex.gate_bias = draw({num, slot.shape[1] / 2}, seed * 3, 0.0866f);
    ex.up_bias = draw({num, slot.shape[1] / 2}, seed * 3 + 1, 0.0866f);
    return;
  }
  const int64_t in = slot.shape[1], out = slot.shape[2];
  const float half_width = 1.7320508f / std::sqrt(static_cast<float>(in));
  for (int64_t e = 0; e < num; ++e) {
    if (slot.stack == ExpertStack::kDown) {
      ex.down[e] = draw({out, in}, seed * 1009 + e, half_width);
    } else {
      ex.gate[e] = draw({out / 2, in}, seed * 1009 + 2 * e, half_width);
      ex.up[e] = draw({out / 2, in}, seed * 1009 + 2 * e + 1, half_width);
    }
  }
}

ModelWeights DummyWeights(const ModelConfig& config, Backend& backend, uint64_t seed, Shard shard) {
  ModelWeights w;
  uint64_t index = 0;
  const DType dtype = backend.device() == Device::kCPU ? config.dtype : backend.compute_dtype();
  for (const Slot& slot : Schema(config, w, shard)) {
    if (slot.stack != ExpertStack::kNone) {  // gpt-oss: each expert's matrices or bias rows drawn in place
      DummyExpertStack(slot, dtype, backend, seed * 1000003u + index++);
      continue;
    }
    // Uniform with std 1/sqrt(fan_in) for matrices; norms near 1 (or near 0 for 1+w norms).
    const float half_width = 1.7320508f * (slot.init == Init::kMatrix ? 1.0f / std::sqrt(static_cast<float>(slot.shape.back())) : 0.05f);
    const float base = slot.init == Init::kNorm && !config.norm_one_plus_weight ? 1.0f : 0.0f;
    Tensor t = backend.Empty(dtype, slot.rank_shape());
    backend.FillUniform(t, seed * 1000003u + index++, base - half_width, base + half_width);
    const Status placed = Place(slot, t, backend);  // parts share one dtype here
    assert(placed.ok());
    (void)placed;
  }
  FinishTied(config, shard, w);
  SinksToF32(w, backend);
  return w;
}

int64_t CountParameters(const ModelConfig& config) {
  ModelWeights unused;
  int64_t n = 0;
  for (const Slot& slot : Schema(config, unused)) n += ShapeNumel(slot.shape);
  return n;
}

}  // namespace hsx
