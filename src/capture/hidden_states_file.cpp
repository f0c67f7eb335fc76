#include "capture/hidden_states_file.h"

#include "capture/fp8_states.h"

namespace hsx {

Status ValidateRequestId(const std::string& id) {
  if (id.empty()) return Error("request id is empty");
  if (id.size() > 200) return Error("request id '" + id.substr(0, 40) + "...' is longer than 200 bytes");
  if (id[0] == '.') return Error("request id '" + id + "' starts with '.' (ids name files in the output directory)");
  for (unsigned char c : id) {
    if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) {
      return Error("request id '" + id + "' contains '/', '\\' or a control character (ids name files in the output directory)");
    }
  }
  return {};
}

std::vector<NamedTensor> HiddenStatesFileTensors(const CaptureRecord& record, StatesFormat format) {
  const int64_t t = static_cast<int64_t>(record.token_ids.size());
  Tensor ids = Tensor::Host(DType::kI64, {t});
  for (int64_t i = 0; i < t; ++i) ids.data<int64_t>()[i] = record.token_ids[static_cast<size_t>(i)];
  std::vector<NamedTensor> tensors;
  if (format == StatesFormat::kFp8) {
    Fp8States fp8 = QuantizeStatesFp8(record.hidden_states);
    tensors = {{"hidden_states", std::move(fp8.values)}, {"hidden_states_scales", std::move(fp8.scales)}};
  } else {
    tensors = {{"hidden_states", record.hidden_states}};
  }
  tensors.emplace_back("token_ids", std::move(ids));
  for (const auto& extra : record.extras) tensors.push_back(extra);
  return tensors;
}

}  // namespace hsx
