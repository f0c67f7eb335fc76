// The loss mask of a whole conversation by speculators' render-boundary rule (its
// prepare-data, speculators #794): for assistant turn j (j >= 1), the tokens by which the
// render of messages[:j+1] extends the render of messages[:j] with the generation prompt
// are supervised (1); everything else is context (0). Where the generation prompt itself
// differs from what the turn records (a pre-filled <think> scaffold), the boundary falls
// back to the common prefix, valid only if the history renders alike.
//
// speculators makes one row per turn; one file holds the whole conversation, so a turn is
// supervised here only where its render is also a prefix of the whole render. A template
// that rewrites history (Qwen3 strips earlier turns' reasoning) leaves those earlier turns
// as context, as speculators' row for the last turn has them; the last turn always counts.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace hsx {

// full_ids: the whole conversation rendered without a generation prompt, as the file
// holds it. An error names the turn whose boundary cannot be derived.
Result<std::vector<uint8_t>> RenderBoundaryLossMask(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                                    const nlohmann::ordered_json& messages, const ChatOptions& options,
                                                    const std::vector<int32_t>& full_ids);

}  // namespace hsx
