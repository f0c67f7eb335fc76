#include "capture/hidden_states_file.h"

#include "tensor/safetensors.h"

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

Status WriteHiddenStatesTo(const std::string& path, const Sequence& seq) {
  const int64_t t = seq.hidden_states.size(0);  // the prompt, plus fed-back outputs with include_output_tokens
  Tensor ids = Tensor::Host(DType::kI64, {t});
  for (int64_t i = 0; i < t; ++i) ids.data<int64_t>()[i] = seq.tokens()[i];
  return WriteSafetensors(path, {{"hidden_states", seq.hidden_states}, {"token_ids", ids}})
      .with_context("request '" + seq.id() + "'");
}

Result<std::string> WriteHiddenStatesFile(const std::string& dir, const Sequence& seq) {
  HSX_RETURN_IF_ERROR(ValidateRequestId(seq.id()));
  const std::string path = dir + "/" + seq.id() + ".safetensors";
  HSX_RETURN_IF_ERROR(WriteHiddenStatesTo(path, seq));
  return path;
}

}  // namespace hsx
