#include "capture/states_check.h"

#include <cmath>
#include <cstring>

#include "tensor/safetensors.h"

namespace hsx {
namespace {

std::string ShapeText(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string IdsText(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

// The index of the first value that is inf or NaN, or -1. Reads unaligned data by memcpy.
int64_t FirstNonFinite(const Tensor& t) {
  const char* data = t.data<char>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::kF32: {
        float v;
        std::memcpy(&v, data + i * 4, 4);
        if (!std::isfinite(v)) return i;
        break;
      }
      case DType::kBF16:
      case DType::kF16: {
        uint16_t bits;
        std::memcpy(&bits, data + i * 2, 2);
        const uint16_t exponent = t.dtype() == DType::kBF16 ? 0x7f80 : 0x7c00;
        if ((bits & exponent) == exponent) return i;
        break;
      }
      case DType::kF8E4M3:
        if ((static_cast<uint8_t>(data[i]) & 0x7f) == 0x7f) return i;  // E4M3's only NaN codes
        break;
      default:
        return -1;
    }
  }
  return -1;
}

}  // namespace

StatesCheck CheckStatesFile(const std::string& path, const StatesExpectation& e) {
  StatesCheck out;
  auto problem = [&](const std::string& what) { out.problems.push_back(path + ": " + what); };
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    out.problems.push_back(file.status().message());
    return out;
  }
  const auto& tensors = file->tensors();
  auto hs_it = tensors.find("hidden_states");
  auto ids_it = tensors.find("token_ids");
  if (hs_it == tensors.end()) problem("no hidden_states tensor");
  if (ids_it == tensors.end()) problem("no token_ids tensor");
  if (!out.problems.empty()) return out;
  const Tensor& hs = hs_it->second;
  const Tensor& ids = ids_it->second;
  const bool fp8 = hs.dtype() == DType::kF8E4M3;
  if (hs.dtype() != DType::kBF16 && hs.dtype() != DType::kF32 && hs.dtype() != DType::kF16 && !fp8) {
    problem("hidden_states is " + std::string(DTypeName(hs.dtype())) + ", expected BF16, F32, F16 or F8_E4M3");
  }
  if (hs.dim() != 3) {
    problem("hidden_states has shape " + ShapeText(hs.shape()) + ", expected [tokens, layers, hidden]");
    return out;
  }
  const int64_t t = hs.size(0);
  out.num_tokens = t;
  if (hs.size(2) != e.hidden_size) {
    problem("hidden_states rows are " + std::to_string(hs.size(2)) + " wide; the model's hidden_size is " +
            std::to_string(e.hidden_size));
  }
  if (ids.dtype() != DType::kI64 || ids.dim() != 1 || ids.size(0) != t) {
    problem("token_ids is " + std::string(DTypeName(ids.dtype())) + " " + ShapeText(ids.shape()) + ", expected I64 [" +
            std::to_string(t) + "]");
  }
  if (fp8) {
    auto scales = tensors.find("hidden_states_scales");
    if (scales == tensors.end()) {
      problem("FP8 hidden_states without hidden_states_scales");
    } else if (scales->second.dtype() != DType::kF32 || scales->second.shape() != Shape{t, 1, 1}) {
      problem("hidden_states_scales is " + std::string(DTypeName(scales->second.dtype())) + " " +
              ShapeText(scales->second.shape()) + ", expected F32 [" + std::to_string(t) + ", 1, 1]");
    } else if (int64_t bad = FirstNonFinite(scales->second); bad >= 0) {
      problem("hidden_states_scales of token " + std::to_string(bad) + " is not finite");
    }
  }
  if (int64_t bad = FirstNonFinite(hs); bad >= 0) {
    const int64_t row = hs.size(1) * hs.size(2);
    problem("hidden_states at token " + std::to_string(bad / row) + ", layer index " +
            std::to_string(bad % row / hs.size(2)) + " is not finite");
  }
  if (auto mask = tensors.find("loss_mask"); mask != tensors.end()) {
    if (mask->second.dim() != 1 || mask->second.size(0) != t) {
      problem("loss_mask has shape " + ShapeText(mask->second.shape()) + ", expected [" + std::to_string(t) + "]");
    }
  }
  if (ids.dtype() == DType::kI64 && ids.dim() == 1 && ids.size(0) == t) {
    std::vector<int64_t> tokens(static_cast<size_t>(t));
    std::memcpy(tokens.data(), ids.raw(), tokens.size() * sizeof(int64_t));
    for (int64_t i = 0; i < t; ++i) {
      if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= e.vocab_size) {
        problem("token_ids[" + std::to_string(i) + "] = " + std::to_string(tokens[static_cast<size_t>(i)]) +
                " is outside the model's vocabulary of " + std::to_string(e.vocab_size));
        break;
      }
    }
    if (e.prompt_ids) {
      const auto& p = *e.prompt_ids;
      size_t same = 0;
      while (same < p.size() && same < tokens.size() && tokens[same] == p[same]) ++same;
      if (same < p.size()) {
        problem(p.size() > tokens.size() && same == tokens.size()
                    ? "holds " + std::to_string(t) + " tokens; its prompt tokenizes to " + std::to_string(p.size())
                    : "token_ids[" + std::to_string(same) + "] is " + std::to_string(tokens[same]) +
                          "; the prompt, tokenized again, has " + std::to_string(p[same]) + " there");
      }
    }
  }
  auto contract = LayerContract::FromMetadata(file->metadata(), path);
  if (!contract.ok()) {
    out.problems.push_back(contract.status().message());
    return out;
  }
  const LayerContract& c = *contract;
  if (static_cast<int64_t>(c.layer_ids.size()) != hs.size(1)) {
    problem("the contract names " + std::to_string(c.layer_ids.size()) + " layers " + IdsText(c.layer_ids) +
            "; hidden_states holds " + std::to_string(hs.size(1)));
  }
  for (int id : c.layer_ids) {
    if (id > e.num_layers) {
      problem("layer id " + std::to_string(id) + " is past the model's " + std::to_string(e.num_layers) + " layers");
      break;
    }
  }
  if (!e.layer_ids.empty() && c.layer_ids != e.layer_ids) {
    problem("holds layers " + IdsText(c.layer_ids) + ", expected " + IdsText(e.layer_ids));
  }
  if (c.model_config_hash != e.model_config_hash) {
    problem("was made by a model whose config hash is " + c.model_config_hash + "; --model's is " + e.model_config_hash);
  }
  if (!e.tokenizer_hash.empty() && c.tokenizer_hash != e.tokenizer_hash) {
    problem("was tokenized by a tokenizer whose hash is " + (c.tokenizer_hash.empty() ? "(none)" : c.tokenizer_hash) +
            "; --model's is " + e.tokenizer_hash);
  }
  if (!fp8 && c.dtype != DTypeName(hs.dtype())) {
    problem("the contract says " + c.dtype + "; hidden_states is " + std::string(DTypeName(hs.dtype())));
  }
  out.contract = c;
  return out;
}

}  // namespace hsx
