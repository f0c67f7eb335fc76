#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <queue>

#include "tokenizer/json_fields.h"
#include "util/utf8.h"

namespace hsx {
namespace {

using nlohmann::json;

// A merge is "left right" in older files and ["left", "right"] in newer ones.
Result<std::pair<std::string, std::string>> ParseMerge(const json& merge,
                                                       const std::string& where) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  if (merge.is_string()) {
    const std::string& text = merge.get_ref<const std::string&>();
    size_t space = text.find(' ');
    if (space != std::string::npos && text.find(' ', space + 1) == std::string::npos) {
      return std::pair(text.substr(0, space), text.substr(space + 1));
    }
  }
  return Error(where + ": expected \"left right\" or [\"left\", \"right\"]");
}

}  // namespace

Result<BpeModel> BpeModel::FromJson(const json& config, const std::string& where,
                                    size_t other_tokens) {
  namespace jf = json_fields;
  BpeModel model;

  // Options that change what BPE produces and that no model we serve uses are refused rather
  // than silently ignored.
  auto dropout = config.find("dropout");
  if (dropout != config.end() && !dropout->is_null() && *dropout != 0.0) {
    return Error(jf::Path(where, "dropout") +
                 ": BPE dropout is not supported (it randomizes encoding)");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    HSX_ASSIGN_OR_RETURN(std::optional<std::string> value,
                         jf::OptionalString(config, affix, where));
    if (value && !value->empty()) return Error(jf::Path(where, affix) + ": is not supported");
  }

  HSX_ASSIGN_OR_RETURN(const json* vocab, jf::Required(config, "vocab", where));
  if (!vocab->is_object()) return Error(jf::Path(where, "vocab") + ": expected an object");
  const int64_t id_bound = static_cast<int64_t>(
      std::min<size_t>(vocab->size() + other_tokens, std::numeric_limits<int32_t>::max()));
  model.vocab_.reserve(vocab->size());
  for (const auto& [token, id_value] : vocab->items()) {
    if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 ||
        id_value.get<int64_t>() >= id_bound) {
      return Error(jf::Path(where, "vocab") + ": the id of '" + token +
                   "' must be an integer from 0 to " + std::to_string(id_bound - 1) +
                   " (the file lists " + std::to_string(id_bound) + " tokens)");
    }
    auto id = static_cast<int32_t>(id_value.get<int64_t>());
    model.vocab_[token] = id;
    if (static_cast<size_t>(id) >= model.token_of_id_.size()) model.token_of_id_.resize(id + 1);
    model.token_of_id_[id] = token;
  }

  HSX_ASSIGN_OR_RETURN(const json* merges, jf::Required(config, "merges", where));
  if (!merges->is_array()) return Error(jf::Path(where, "merges") + ": expected an array");
  int32_t rank = 0;
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string merge_where = jf::Path(where, "merges") + "[" + std::to_string(i) + "]";
    const json& merge = (*merges)[i];
    // Merges copied from a merges.txt may keep its "#version" header line; HF skips it.
    if (merge.is_string() && merge.get_ref<const std::string&>().starts_with("#version")) continue;
    HSX_ASSIGN_OR_RETURN(auto pair, ParseMerge(merge, merge_where));
    const auto& [left, right] = pair;
    auto id_of = [&](const std::string& token) -> Result<int32_t> {
      if (std::optional<int32_t> id = model.TokenToId(token)) return *id;
      return Error(merge_where + ": '" + token + "' is not in the vocabulary");
    };
    HSX_ASSIGN_OR_RETURN(int32_t left_id, id_of(left));
    HSX_ASSIGN_OR_RETURN(int32_t right_id, id_of(right));
    HSX_ASSIGN_OR_RETURN(int32_t merged_id, id_of(left + right));
    // A repeated pair keeps its last rank, as HF's merge map does.
    model.merges_[PairKey(left_id, right_id)] = Merge{rank++, merged_id};
  }

  HSX_ASSIGN_OR_RETURN(std::optional<std::string> unk_token,
                       jf::OptionalString(config, "unk_token", where));
  if (unk_token) {
    model.unk_id_ = model.TokenToId(*unk_token);
    if (!model.unk_id_) {
      return Error(jf::Path(where, "unk_token") + ": '" + *unk_token +
                   "' is not in the vocabulary");
    }
  }
  HSX_ASSIGN_OR_RETURN(model.fuse_unk_, jf::Bool(config, "fuse_unk", where, false));
  HSX_ASSIGN_OR_RETURN(model.ignore_merges_, jf::Bool(config, "ignore_merges", where, false));
  HSX_ASSIGN_OR_RETURN(bool byte_fallback, jf::Bool(config, "byte_fallback", where, false));
  model.byte_token_ids_.fill(-1);
  if (byte_fallback) {
    for (int byte = 0; byte < 256; ++byte) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", byte);
      model.byte_token_ids_[byte] = model.TokenToId(name).value_or(-1);
    }
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !token_of_id_[id]) return nullptr;
  return &*token_of_id_[id];
}

std::vector<BpeModel::Symbol> BpeModel::InitialSymbols(std::string_view piece) const {
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto add = [&symbols](int32_t id, size_t length) {
    auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, static_cast<uint32_t>(length)});
  };
  // Bytes of unknown characters not yet emitted: consecutive ones become one unk token when
  // fuse_unk is set.
  size_t pending_unk_length = 0;
  auto flush_unk = [&] {
    if (pending_unk_length > 0) add(*unk_id_, pending_unk_length);
    pending_unk_length = 0;
  };
  for (size_t at = 0; at < piece.size();) {
    size_t length = Utf8CharLength(piece[at]);
    std::string_view character = piece.substr(at, length);
    at += length;
    if (std::optional<int32_t> id = TokenToId(character)) {
      flush_unk();
      add(*id, length);
      continue;
    }
    bool has_byte_tokens = true;
    for (char byte : character)
      has_byte_tokens &= byte_token_ids_[static_cast<unsigned char>(byte)] >= 0;
    if (has_byte_tokens) {
      for (char byte : character) add(byte_token_ids_[static_cast<unsigned char>(byte)], 1);
      continue;
    }
    if (!unk_id_) continue;  // HF drops a character it cannot represent at all
    if (!fuse_unk_) flush_unk();
    pending_unk_length += length;
  }
  flush_unk();
  return symbols;
}

void BpeModel::MergeAll(std::vector<Symbol>* symbols_ptr, size_t* merge_steps) const {
  std::vector<Symbol>& symbols = *symbols_ptr;
  const auto end = static_cast<int32_t>(symbols.size());
  struct Candidate {
    int32_t rank;
    int32_t left;  // index of the left symbol of the pair
    int32_t merged_id;
  };
  auto merges_later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  // A heap of candidate merges keeps this O(n log n) on long pieces (runs of spaces, digits).
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(merges_later)> queue(
      merges_later);
  auto consider_pair = [&](int32_t left) {
    int32_t right = symbols[left].next;
    if (right >= end) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < end; ++i) consider_pair(i);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    if (merge_steps != nullptr) ++*merge_steps;
    Symbol& left = symbols[top.left];
    if (left.length == 0 || left.next >= end) continue;
    Symbol& right = symbols[left.next];
    // Entries go stale when a neighbor merged first; the pair there now must still merge the same
    // way.
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next < end) symbols[left.next].prev = top.left;
    if (left.prev >= 0) consider_pair(left.prev);
    consider_pair(top.left);
  }
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* ids,
                      size_t* merge_steps) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (std::optional<int32_t> id = TokenToId(piece)) {
      ids->push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols = InitialSymbols(piece);
  MergeAll(&symbols, merge_steps);
  for (const Symbol& symbol : symbols) {
    if (symbol.length > 0) ids->push_back(symbol.id);
  }
}

}  // namespace hsx
