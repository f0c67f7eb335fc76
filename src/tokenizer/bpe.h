// The byte-pair-encoding model of a HF tokenizer.json ("model": {"type": "BPE", ...}).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace hsx {

// A piece starts as one symbol per character (a character missing from the vocabulary becomes
// its <0xNN> byte tokens under byte_fallback, else the unk token); then the adjacent pair with
// the best-ranked merge is merged, leftmost first, until no adjacent pair has a merge.
class BpeModel {
 public:
  // `where` is the field path used in errors, e.g. "model". Ids must be below the number of
  // vocabulary entries plus `other_tokens` (the added tokens that may fill gaps).
  static Result<BpeModel> FromJson(const nlohmann::json& config, const std::string& where,
                                   size_t other_tokens = 0);

  // Appends the ids of one pre-tokenized piece (valid UTF-8). `merge_steps`, when given, counts
  // the candidate merges examined: the work done, which tests hold to O(n log n).
  void Encode(std::string_view piece, std::vector<int32_t>* ids,
              size_t* merge_steps = nullptr) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token with this id, or null where the vocabulary has none.
  const std::string* IdToToken(int32_t id) const;
  size_t vocab_count() const { return vocab_.size(); }
  // One past the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(token_of_id_.size()); }

 private:
  struct StringHash {
    using is_transparent = void;  // lets find() take a string_view without copying it
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank;  // lower merges first
    int32_t merged_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev;     // index of the symbol to the left, -1 at the start
    int32_t next;     // index of the symbol to the right, symbols.size() at the end
    uint32_t length;  // bytes of the piece it covers; 0 once merged into its left neighbor
  };

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  std::vector<Symbol> InitialSymbols(std::string_view piece) const;
  void MergeAll(std::vector<Symbol>* symbols, size_t* merge_steps) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::optional<std::string>> token_of_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_token_ids_{};  // id of "<0xNN>"; -1 if absent or not byte_fallback
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
};

}  // namespace hsx
