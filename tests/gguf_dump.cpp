// hsx_gguf_dump FILE.gguf OUT.safetensors: what hsx reads from a GGUF file, for the python
// tests to compare with the `gguf` package: the metadata as JSON on stdout (arrays as lists,
// with each value's type name), and every tensor dequantized to f32, in row-major shape,
// in OUT. Exits 1 with the error on stderr.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "model/gguf_dequant.h"
#include "model/gguf_file.h"
#include "tensor/safetensors.h"

namespace {

using hsx::GgufType;
using hsx::GgufValue;

nlohmann::json ToJson(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64: return v.u;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64: return v.i;
    case GgufType::kF32: case GgufType::kF64: return v.f;
    case GgufType::kBool: return v.b;
    // Strings as byte lists: GGUF does not promise UTF-8.
    case GgufType::kString: return std::vector<uint8_t>(v.s.begin(), v.s.end());
    case GgufType::kArray: {
      nlohmann::json a = nlohmann::json::array();
      for (const GgufValue& e : v.array) a.push_back(ToJson(e));
      return a;
    }
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FILE.gguf OUT.safetensors\n", argv[0]);
    return 2;
  }
  auto file = hsx::GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().message().c_str());
    return 1;
  }
  nlohmann::json metadata = nlohmann::json::object();
  for (const auto& [key, value] : file->metadata()) {
    metadata[key] = {{"type", static_cast<uint32_t>(value.type)}, {"value", ToJson(value)}};
  }
  std::vector<hsx::NamedTensor> tensors;
  for (const hsx::GgufTensorInfo& info : file->tensors()) {
    hsx::Shape shape(info.dims.rbegin(), info.dims.rend());
    hsx::Tensor t = hsx::Tensor::Host(hsx::DType::kF32, shape);
    hsx::DequantizeToF32(info.type, info.data, t.numel(), t.data<float>());
    tensors.emplace_back(info.name, t);
  }
  if (hsx::Status s = hsx::WriteSafetensors(argv[2], tensors); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::printf("%s\n", metadata.dump().c_str());
  return 0;
}
