#include "template/render_boundary_mask.h"

#include <algorithm>

namespace hsx {
namespace {

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool StartsWith(const std::vector<int32_t>& ids, const std::vector<int32_t>& prefix) {
  return prefix.size() <= ids.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}

}  // namespace

Result<std::vector<uint8_t>> RenderBoundaryLossMask(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                                    const nlohmann::ordered_json& messages, const ChatOptions& options,
                                                    const std::vector<int32_t>& full_ids) {
  auto encode = [&](size_t turns, bool add_generation_prompt) -> Result<std::vector<int32_t>> {
    nlohmann::ordered_json prefix = nlohmann::ordered_json::array();
    for (size_t i = 0; i < turns; ++i) prefix.push_back(messages[i]);
    ChatOptions o = options;
    o.add_generation_prompt = add_generation_prompt;
    HSX_ASSIGN_OR_RETURN(const std::string text, chat.Render(prefix, o));
    return tokenizer.Encode(text, /*add_special_tokens=*/false);
  };
  std::vector<uint8_t> mask(full_ids.size(), 0);
  for (size_t j = 1; j < messages.size(); ++j) {
    if (!messages[j].is_object() || messages[j].value("role", "") != "assistant") continue;
    const std::string turn = "messages[" + std::to_string(j) + "]";
    HSX_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, encode(j, true));
    HSX_ASSIGN_OR_RETURN(const std::vector<int32_t> full, encode(j + 1, false));
    size_t boundary = prompt.size();
    if (!StartsWith(full, prompt)) {
      boundary = CommonPrefix(prompt, full);
      HSX_ASSIGN_OR_RETURN(const std::vector<int32_t> history, encode(j, false));
      if (!StartsWith(full, history) || boundary < history.size()) {
        return Error(turn + ": the renders with and without this assistant turn differ inside the history before "
                            "it, so no loss-mask boundary can be derived (speculators' BoundaryUnstableError)");
      }
    }
    if (!StartsWith(full_ids, full)) continue;  // the template rewrites this turn once later turns follow
    std::fill(mask.begin() + static_cast<std::ptrdiff_t>(boundary), mask.begin() + static_cast<std::ptrdiff_t>(full.size()), 1);
  }
  return mask;
}

}  // namespace hsx
