#include "engine/drafter.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/draft_runner.h"

namespace hsx {

int Drafter::DraftRoom(const Sequence& seq, int k) {
  if (!seq.wants_more_tokens() || seq.num_tokens() - seq.num_computed != 1) return 0;
  return std::max(0, std::min(k, seq.request().max_new_tokens - seq.num_generated() - 1));
}

void NgramDrafter::Propose(const DraftStep& step) {
  for (const auto& [seq, n] : step.chunks) {
    const int room = DraftRoom(*seq, num_speculative_tokens());
    if (room == 0) continue;
    seq->drafts = proposer_.Propose(seq->tokens());
    if (static_cast<int>(seq->drafts.size()) > room) seq->drafts.resize(room);
  }
}

std::unique_ptr<Drafter> MakeDrafter(const NgramConfig& ngram, Eagle3Draft* eagle3, int eagle3_k, MtpDrafter* mtp,
                                     int mtp_k, const DrafterContext& context) {
  if (eagle3 != nullptr) return std::make_unique<Eagle3Drafter>(*eagle3, eagle3_k, context);
  if (mtp != nullptr) return std::make_unique<MtpAssistantDrafter>(*mtp, mtp_k, context);
  if (ngram.num_speculative_tokens <= 0) return nullptr;
  auto proposer = NgramProposer::Create(ngram, context.max_model_len);
  if (!proposer.ok()) {  // the CLI checked the config: this is a caller's bug
    std::fprintf(stderr, "hsx: %s\n", proposer.status().message().c_str());
    std::abort();
  }
  return std::make_unique<NgramDrafter>(std::move(*proposer), ngram.num_speculative_tokens);
}

}  // namespace hsx
