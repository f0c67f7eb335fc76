#include "capture/hidden_states_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tensor/safetensors.h"
#include "util/atomic_file.h"

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

Status WriteNewHiddenStatesTo(const std::string& path, const Sequence& seq) {
  // Named as WriteFileAtomic's temp files are, so a dead writer's leftover is removed as stale.
  const std::string tmp = TempFileName(path);
  HSX_RETURN_IF_ERROR(WriteHiddenStatesTo(tmp, seq));
  // link(2), unlike rename(2), fails with EEXIST rather than replace what is there.
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (linked != 0) {
    return Error(path + ": " + (err == EEXIST ? "another writer created this file first" : std::strerror(err)))
        .with_context("request '" + seq.id() + "'");
  }
  return {};
}

Result<std::string> WriteHiddenStatesFile(const std::string& dir, const Sequence& seq) {
  HSX_RETURN_IF_ERROR(ValidateRequestId(seq.id()));
  const std::string path = dir + "/" + seq.id() + ".safetensors";
  HSX_RETURN_IF_ERROR(WriteHiddenStatesTo(path, seq));
  return path;
}

}  // namespace hsx
