// A request that regenerates a conversation in one sequence: extract --regenerate's lines
// and serve's chat completions with "regenerate" are both this request, so they run the
// same turns and store the same file.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/sequence.h"
#include "template/conversation_regeneration.h"

namespace hsx {

// Makes `request` (its prompt: regeneration->prompt()) regenerate the conversation: every
// token's row captured, each answer at most `max_tokens` (cut to fit max_model_len), its
// turns driven by `regeneration` on the engine thread, an answer ended by one of the
// request's stop_token_ids. A conversation whose next turn cannot fit max_model_len ends
// at the answer before. Sampling and stop tokens stay the caller's.
void MakeRegenerationRequest(Request& request, std::shared_ptr<ConversationRegeneration> regeneration, int max_tokens,
                             int max_model_len);

// A finished regeneration's loss_mask [rows] (I64): 1 on the tokens the target generated,
// 0 on the template's. `rows`: the record's (a conversation cut short lacks its last token's).
Tensor RegenerationLossMask(const ConversationRegeneration& regeneration, int64_t rows);

}  // namespace hsx
