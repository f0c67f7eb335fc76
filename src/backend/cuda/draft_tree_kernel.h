// Launchers of EAGLE-2's dynamic-tree kernels (draft_tree.cu; the rules: backend/draft_tree.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hsx::cuda {

// Row r's k best raw logprobs (the Sample op's): ids[r k + j] (+ offsets[id]; -1 where the
// logprob is not finite) and logprobs[r k + j]; k <= vocab.
void TopLogprobs(const float* logits, int32_t rows, int32_t vocab, int32_t k, const int32_t* offsets, int32_t* ids,
                 float* logprobs, cudaStream_t stream);

// ExpandDraftTreeSlot for each of `slots` slots of `places` places (one thread a slot);
// next_* may be null (next_rows: the drafting row among all slots' rows).
void ExpandDraftTrees(const int32_t* ids, const float* logprobs, int32_t slots, int32_t k, int32_t d, int64_t places,
                      int32_t* tokens, float* scores, int32_t* parents, int32_t* frontier, uint64_t* masks,
                      int32_t* next_ids, int32_t* next_rows, uint64_t* next_masks, cudaStream_t stream);

// SelectDraftTreeSlot for each slot (a block a slot): limits [slots, 2] (places, budget),
// out [slots, 2 n] (n tokens, then n parents; -1 past the slot's nodes).
void SelectDraftTrees(const int32_t* tokens, const float* scores, const int32_t* parents, int32_t slots, int64_t places,
                      const int32_t* limits, int32_t n, int32_t* out, cudaStream_t stream);

}  // namespace hsx::cuda
