#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "util/utf8.h"
#include "util/json.h"

namespace hsx {
namespace {

using nlohmann::json;

// A token from tokenizer.json's "added_tokens" (chat markers, <0xNN> bytes, ...): found in the
// text before any other processing and emitted as its id.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  std::string text;          // what is matched and decoded: content, normalized when `normalized`
  bool single_word = false;  // only where no word character touches it on either side
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
  bool normalized = false;   // matched in normalized text rather than in the raw input
  bool special = false;      // left out by decode(skip_special_tokens=True)
};

// Finds added tokens like HF's leftmost-longest Aho-Corasick: of the tokens starting at the
// leftmost position where any starts, the longest.
class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin;
    size_t end;
    int32_t token;  // index into the tokenizer's added tokens
  };

  void Add(std::string_view pattern, int32_t token) {
    int32_t node = 0;
    for (char byte : pattern) {
      int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = token;
    first_bytes_[static_cast<unsigned char>(pattern.front())] = true;
  }

  std::optional<Match> FindFirst(std::string_view text, size_t from) const {
    for (size_t begin = from; begin < text.size(); ++begin) {
      if (!first_bytes_[static_cast<unsigned char>(text[begin])]) continue;
      std::optional<Match> longest;
      int32_t node = 0;
      for (size_t at = begin; at < text.size(); ++at) {
        node = Child(node, text[at]);
        if (node < 0) break;
        if (nodes_[node].token >= 0) longest = Match{begin, at + 1, nodes_[node].token};
      }
      if (longest) return longest;
    }
    return std::nullopt;
  }

 private:
  struct Node {
    std::vector<std::pair<char, int32_t>> children;
    int32_t token = -1;
  };
  int32_t Child(int32_t node, char byte) const {
    for (const auto& [child_byte, child] : nodes_[node].children) {
      if (child_byte == byte) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_ = std::vector<Node>(1);  // nodes_[0] is the root
  std::array<bool, 256> first_bytes_{};
};

size_t LeadingWhitespaceBytes(std::string_view text) {
  size_t at = 0;
  while (at < text.size() && IsWhitespace(CharAt(text, at))) at += Utf8CharLength(text[at]);
  return at;
}

size_t TrailingWhitespaceBytes(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = StartOfLastChar(text.substr(0, end));
    if (!IsWhitespace(CharAt(text, start))) break;
    end = start;
  }
  return text.size() - end;
}

// A stretch of text: an added token, or the text between added tokens.
struct Segment {
  size_t begin;
  size_t end;
  const AddedToken* token;  // null between added tokens
};

}  // namespace

struct Tokenizer::Impl {
  BpeModel model;
  TextNormalizer normalizer;
  PreTokenizer pre_tokenizer;
  TokenDecoder decoder;
  PostProcessor post_processor;
  std::vector<AddedToken> added_tokens;
  AddedTokenMatcher raw_matcher;         // tokens with normalized: false
  AddedTokenMatcher normalized_matcher;  // tokens with normalized: true
  std::unordered_map<std::string, int32_t> added_id_of_content;
  std::vector<const std::string*> text_of_id;  // added tokens over the model's vocabulary
  std::vector<bool> special_of_id;             // ids of added tokens marked "special"

  static Result<std::shared_ptr<const Impl>> FromJson(const nlohmann::json& config);

  // HF's AddedVocabulary::find_matches, including its single_word/lstrip/rstrip rules.
  std::vector<Segment> SplitOnAddedTokens(std::string_view text,
                                          const AddedTokenMatcher& matcher) const {
    std::vector<Segment> segments;
    size_t covered = 0, search_from = 0;
    while (std::optional<AddedTokenMatcher::Match> match = matcher.FindFirst(text, search_from)) {
      search_from = match->end;
      const AddedToken& token = added_tokens[match->token];
      size_t begin = match->begin, end = match->end;
      if (token.single_word) {
        bool word_before =
            begin > 0 && IsWordCharacter(CharAt(text, StartOfLastChar(text.substr(0, begin))));
        bool word_after = end < text.size() && IsWordCharacter(CharAt(text, end));
        if (word_before || word_after) continue;
      }
      if (token.lstrip)
        begin = std::max(begin - TrailingWhitespaceBytes(text.substr(0, begin)), covered);
      if (token.rstrip) end += LeadingWhitespaceBytes(text.substr(end));
      if (covered < begin) segments.push_back({covered, begin, nullptr});
      segments.push_back({begin, end, &token});
      covered = search_from = end;
    }
    if (covered < text.size()) segments.push_back({covered, text.size(), nullptr});
    return segments;
  }
};

namespace {

Result<AddedToken> ParseAddedToken(const json& entry, const std::string& where,
                                   const TextNormalizer& normalizer) {
  namespace jf = json_fields;
  AddedToken token;
  HSX_ASSIGN_OR_RETURN(token.content, jf::String(entry, "content", where));
  HSX_ASSIGN_OR_RETURN(token.single_word, jf::Bool(entry, "single_word", where, false));
  HSX_ASSIGN_OR_RETURN(token.lstrip, jf::Bool(entry, "lstrip", where, false));
  HSX_ASSIGN_OR_RETURN(token.rstrip, jf::Bool(entry, "rstrip", where, false));
  HSX_ASSIGN_OR_RETURN(token.special, jf::Bool(entry, "special", where, false));
  HSX_ASSIGN_OR_RETURN(token.normalized, jf::Bool(entry, "normalized", where, !token.special));
  token.text = token.content;
  if (token.normalized) {
    Result<std::string> normalized = normalizer.Apply(token.content);
    if (!normalized.ok()) return normalized.status().with_context(where + ".content");
    token.text = std::move(normalized).value();
  }
  return token;
}

}  // namespace

Result<std::shared_ptr<const Tokenizer::Impl>> Tokenizer::Impl::FromJson(const json& config) {
  namespace jf = json_fields;
  if (!config.is_object()) return Error("expected a JSON object at the top level");
  auto impl = std::make_shared<Impl>();

  // Absent stages are null stages. Stages are read in place: the document is never copied.
  static const json kNull;
  auto stage = [&config](const char* key) -> const json& {
    auto it = config.find(key);
    return it == config.end() ? kNull : *it;
  };
  const json& added_list = stage("added_tokens");
  if (!added_list.is_null() && !added_list.is_array()) {
    return Error("added_tokens: expected an array");
  }

  HSX_ASSIGN_OR_RETURN(const json* model, jf::Required(config, "model", ""));
  HSX_ASSIGN_OR_RETURN(std::string model_type, jf::String(*model, "type", "model"));
  if (model_type != "BPE") {
    return Error("model.type '" + model_type + "' is not supported; expected BPE");
  }
  // Every id is below the number of tokens the file lists, so the id tables stay as small as
  // the file (a single id of 2^31 must not allocate gigabytes).
  HSX_ASSIGN_OR_RETURN(impl->model, BpeModel::FromJson(*model, "model", added_list.size()));

  HSX_ASSIGN_OR_RETURN(impl->normalizer,
                       TextNormalizer::FromJson(stage("normalizer"), "normalizer"));
  HSX_ASSIGN_OR_RETURN(impl->pre_tokenizer,
                       PreTokenizer::FromJson(stage("pre_tokenizer"), "pre_tokenizer"));
  HSX_ASSIGN_OR_RETURN(impl->decoder, TokenDecoder::FromJson(stage("decoder"), "decoder"));

  // HF does not read the ids in added_tokens: a token takes its id in the vocabulary, or else
  // the next one after the vocabulary. In files HF wrote these agree with the listed ids.
  auto next_id = static_cast<int32_t>(impl->model.vocab_count());
  for (size_t i = 0; i < added_list.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    HSX_ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken(added_list[i], where, impl->normalizer));
    if (token.content.empty()) continue;  // HF ignores empty added tokens
    auto listed = impl->added_id_of_content.find(token.content);
    if (listed != impl->added_id_of_content.end()) {
      token.id = listed->second;
    } else {
      std::optional<int32_t> vocab_id = impl->model.TokenToId(token.content);
      token.id = vocab_id ? *vocab_id : next_id++;
      impl->added_id_of_content.emplace(token.content, token.id);
    }
    impl->added_tokens.push_back(std::move(token));
  }

  size_t id_limit = static_cast<size_t>(impl->model.id_limit());
  for (const AddedToken& token : impl->added_tokens)
    id_limit = std::max<size_t>(id_limit, token.id + 1);
  impl->text_of_id.assign(id_limit, nullptr);
  for (int32_t id = 0; id < impl->model.id_limit(); ++id)
    impl->text_of_id[id] = impl->model.IdToToken(id);
  for (size_t i = 0; i < impl->added_tokens.size(); ++i) {
    const AddedToken& token = impl->added_tokens[i];
    if (token.text.empty()) continue;  // normalized to nothing: nothing to find
    (token.normalized ? impl->normalized_matcher : impl->raw_matcher)
        .Add(token.text, static_cast<int32_t>(i));
    impl->text_of_id[token.id] = &token.text;
  }
  impl->special_of_id.assign(id_limit, false);
  for (const AddedToken& token : impl->added_tokens) {
    if (token.special) impl->special_of_id[token.id] = true;
  }

  // transformers 5 takes the special tokens from here alone: with a tokenizer.json present it
  // drops tokenizer_config.json's add_bos_token and add_eos_token.
  HSX_ASSIGN_OR_RETURN(impl->post_processor,
                       PostProcessor::FromJson(stage("post_processor"), static_cast<int>(id_limit),
                                               "post_processor"));
  return std::shared_ptr<const Impl>(std::move(impl));
}

namespace {

// Far above any real tokenizer.json (Gemma 3's, 262k tokens, is 33 MB).
constexpr uintmax_t kMaxTokenizerBytes = uintmax_t{1} << 30;

Result<std::string> ReadFile(const std::string& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) return Error(path + ": cannot open: no such file");
  if (!std::filesystem::is_regular_file(status)) return Error(path + ": not a regular file");
  if (std::filesystem::file_size(path, error) > kMaxTokenizerBytes) {
    return Error(path + ": larger than " + std::to_string(kMaxTokenizerBytes >> 20) + " MiB");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return Error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (!file && !file.eof()) return Error(path + ": cannot read: " + std::strerror(errno));
  return contents.str();
}

}  // namespace

Result<Tokenizer> Tokenizer::Load(const std::string& path) {
  HSX_ASSIGN_OR_RETURN(std::string contents, ReadFile(path));
  HSX_ASSIGN_OR_RETURN(json config, ParseJson(contents, path));
  return FromJson(config, path);
}

Result<Tokenizer> Tokenizer::FromJson(const json& document, const std::string& where) {
  Result<std::shared_ptr<const Impl>> impl = Impl::FromJson(document);
  if (!impl.ok()) return impl.status().with_context(where);
  return Tokenizer(std::move(impl).value());
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                               bool add_special_tokens) const {
  if (size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return Error("Encode: the text is not valid UTF-8 (byte " + std::to_string(bad) + " of " +
                 std::to_string(text.size()) + ")");
  }
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // As HF: added tokens are taken out of the raw text, the rest is normalized, then added tokens
  // that match normalized text are taken out, and what remains is pre-tokenized and encoded.
  for (const Segment& raw : impl.SplitOnAddedTokens(text, impl.raw_matcher)) {
    if (raw.token != nullptr) {
      ids.push_back(raw.token->id);
      continue;
    }
    Result<std::string> normalized =
        impl.normalizer.Apply(std::string(text.substr(raw.begin, raw.end - raw.begin)));
    if (!normalized.ok()) return normalized.status().with_context("Encode");
    for (const Segment& part : impl.SplitOnAddedTokens(*normalized, impl.normalized_matcher)) {
      if (part.token != nullptr) {
        ids.push_back(part.token->id);
        continue;
      }
      Status encoded = impl.pre_tokenizer.Apply(
          std::string_view(*normalized).substr(part.begin, part.end - part.begin), raw.begin == 0 && part.begin == 0,
          [&](std::string_view piece) { impl.model.Encode(piece, &ids); });
      if (!encoded.ok()) return encoded.with_context("Encode");
    }
  }
  if (add_special_tokens) return impl.post_processor.Apply(std::move(ids));
  return ids;
}

Result<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return Error("Decode: token id " + std::to_string(id) +
                   " is out of range; the vocabulary has " + std::to_string(vocab_size()) + " ids");
    }
    if (skip_special_tokens && impl_->special_of_id[id]) continue;
    const std::string* token = impl_->text_of_id[id];
    if (token == nullptr) return Error("Decode: token id " + std::to_string(id) + " has no token");
    tokens.push_back(*token);
  }
  return impl_->decoder.Decode(std::move(tokens));
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->text_of_id.size()); }

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special_of_id[id];
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto added = impl_->added_id_of_content.find(std::string(token));
  if (added != impl_->added_id_of_content.end()) return added->second;
  return impl_->model.TokenToId(token);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->text_of_id[id] == nullptr) return "";
  return *impl_->text_of_id[id];
}

}  // namespace hsx
