#include "engine/regeneration_request.h"

#include <algorithm>

namespace hsx {

void MakeRegenerationRequest(Request& request, std::shared_ptr<ConversationRegeneration> regeneration, int max_tokens,
                             int max_model_len) {
  request.max_new_tokens = std::max(0, std::min(max_tokens, max_model_len - static_cast<int>(request.prompt.size())));
  request.capture = true;
  request.include_output_tokens = true;
  request.next_turn = [regeneration = std::move(regeneration), max_tokens,
                       max_model_len](const Sequence& seq) -> std::optional<Request::Turn> {
    auto next = regeneration->TurnEnded(seq.tokens(), seq.turn_start(), seq.request().stop_token_ids);
    if (!next) return std::nullopt;
    const int room = max_model_len - seq.num_tokens() - static_cast<int>(next->known.size());
    if (room < (next->generate ? 1 : 0)) return std::nullopt;  // no room for what follows: it ends here
    return Request::Turn{std::move(next->known), next->generate ? std::min(max_tokens, room) : 0};
  };
}

Tensor RegenerationLossMask(const ConversationRegeneration& regeneration, int64_t rows) {
  Tensor mask = Tensor::Host(DType::kI64, {rows});
  int64_t* m = mask.data<int64_t>();
  std::fill(m, m + rows, 0);
  for (const auto& [begin, end] : regeneration.generated_spans()) {
    std::fill(m + std::min<int64_t>(begin, rows), m + std::min<int64_t>(end, rows), 1);
  }
  return mask;
}

}  // namespace hsx
