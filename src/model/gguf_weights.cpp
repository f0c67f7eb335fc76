#include "model/gguf_weights.h"

#include <cstring>
#include <optional>
#include <set>

#include "model/gguf_dequant.h"

namespace hsx {
namespace {

// Where a Hugging Face tensor lives in a GGUF file; MoE experts are slices of one tensor.
struct GgufSource {
  std::string name;
  int expert = -1;
};

// sandwich: Gemma's four norms a layer, whose post-attention norm is llama.cpp's
// post_attention_norm (Llama's post_attention_layernorm feeds the MLP: ffn_norm).
std::optional<GgufSource> GgufName(const std::string& hf, bool sandwich) {
  if (hf == "model.embed_tokens.weight") return GgufSource{"token_embd.weight"};
  if (hf == "model.norm.weight") return GgufSource{"output_norm.weight"};
  if (hf == "lm_head.weight") return GgufSource{"output.weight"};
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string blk = "blk." + hf.substr(prefix.size(), dot - prefix.size()) + ".";
  const std::string rest = hf.substr(dot + 1);
  if (sandwich) {
    static const std::pair<const char*, const char*> kSandwich[] = {
        {"post_attention_layernorm.weight", "post_attention_norm.weight"},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    };
    for (const auto& [from, to] : kSandwich) {
      if (rest == from) return GgufSource{blk + to};
    }
  }
  static const std::pair<const char*, const char*> kNames[] = {
      {"input_layernorm.weight", "attn_norm.weight"},     {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},       {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},       {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},           {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},           {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},  {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},            {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
  };
  for (const auto& [from, to] : kNames) {
    if (rest == from) return GgufSource{blk + to};
  }
  // mlp.experts.E.{gate,up,down}_proj.weight: expert E of ffn_{gate,up,down}_exps.weight.
  const std::string experts = "mlp.experts.";
  if (rest.rfind(experts, 0) != 0) return std::nullopt;
  const size_t edot = rest.find('.', experts.size());
  if (edot == std::string::npos) return std::nullopt;
  const int expert = std::stoi(rest.substr(experts.size(), edot - experts.size()));
  const std::string proj = rest.substr(edot + 1);
  for (const char* which : {"gate", "up", "down"}) {
    if (proj == std::string(which) + "_proj.weight") return GgufSource{blk + "ffn_" + which + "_exps.weight", expert};
  }
  return std::nullopt;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void UnpermuteLlamaRows(Tensor& weight, int64_t head_dim) {
  const int64_t rows = weight.size(0), cols = weight.numel() / rows, half = head_dim / 2;
  const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(weight.dtype());
  Tensor out = Tensor::Host(weight.dtype(), weight.shape());
  const auto* src = static_cast<const char*>(weight.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t head = 0; head < rows / head_dim; ++head) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t h = 0; h < 2; ++h) {
        const int64_t from = head * head_dim + 2 * i + h, to = head * head_dim + h * half + i;
        std::memcpy(dst + to * row_bytes, src + from * row_bytes, row_bytes);
      }
    }
  }
  weight = out;
}

Result<ModelWeights> LoadGgufWeights(const GgufFile& file, const ModelConfig& config, Backend& backend, Shard shard) {
  std::set<std::string> used;
  const bool llama = config.arch == Arch::kLlama;
  auto fetch = [&](const std::string& hf, const Shape& shape) -> Result<Tensor> {
    const std::optional<GgufSource> source = GgufName(hf, config.sandwich_norms);
    if (!source) return Error(file.path() + ": hsx has no GGUF name for tensor '" + hf + "'");
    const GgufTensorInfo* info = file.FindTensor(source->name);
    if (!info) return Error(file.path() + ": missing tensor '" + source->name + "' (expected shape " + ShapeToString(shape) + ")");
    // GGUF lists dims fastest first; an expert tensor has the experts as its last (slowest) dim.
    Shape expected(shape.rbegin(), shape.rend());
    if (source->expert >= 0) expected.push_back(config.num_experts);
    if (Shape(info->dims.begin(), info->dims.end()) != expected) {
      return Error(file.path() + ": tensor '" + source->name + "' has GGUF dims " +
                   ShapeToString(Shape(info->dims.begin(), info->dims.end())) + ", but the metadata implies " +
                   ShapeToString(expected));
    }
    used.insert(source->name);
    Tensor t = Tensor::Host(DType::kF32, shape);
    const uint64_t slice_bytes = source->expert >= 0 ? info->nbytes / config.num_experts : info->nbytes;
    const char* data = info->data + (source->expert >= 0 ? slice_bytes * source->expert : 0);
    DequantizeToF32(info->type, data, t.numel(), t.data<float>());
    if (config.norm_one_plus_weight && source->name.find("norm.weight") != std::string::npos) {
      // llama.cpp stores Gemma 3's norms as 1 + w; transformers' GGUF conversion subtracts 1
      // in f32 from every tensor named *norm.weight, and so does hsx (same bits).
      float* v = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) v[i] -= 1.0f;
    }
    if (llama && (EndsWith(hf, "q_proj.weight") || EndsWith(hf, "k_proj.weight") || EndsWith(hf, "q_proj.bias") ||
                  EndsWith(hf, "k_proj.bias"))) {
      const int layer = std::stoi(hf.substr(std::string("model.layers.").size()));
      UnpermuteLlamaRows(t, config.layers[layer].head_dim);
    }
    return t;
  };
  HSX_ASSIGN_OR_RETURN(ModelWeights w, LoadWeightsFrom(fetch, config, backend, shard));
  for (const GgufTensorInfo& t : file.tensors()) {
    if (!used.count(t.name)) return Error(file.path() + ": tensor '" + t.name + "' is not used by hsx's " + config.architecture);
  }
  return w;
}

}  // namespace hsx
