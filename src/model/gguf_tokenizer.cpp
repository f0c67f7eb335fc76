#include "model/gguf_tokenizer.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <unordered_map>


namespace hsx {
namespace {

using nlohmann::json;

// llama.cpp's token types (llama_token_type). It matches unknown, control and user-defined
// tokens whole in the text; the first two are special.
constexpr int64_t kUnknown = 2, kControl = 3, kUserDefined = 4;

// GPT-2's split, and its variants, as llama.cpp's llm_tokenizer_bpe applies them: each regex
// of the list splits the pieces the previous ones left (HF's Split, Isolated, in sequence).
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizer {
  std::vector<const char*> names;  // tokenizer.ggml.pre values (llama.cpp's)
  std::vector<const char*> regexes;
  bool llama3 = false;  // llama.cpp also skips merges for whole-vocabulary words and adds BOS
};

const std::vector<PreTokenizer>& PreTokenizers() {
  static const std::vector<PreTokenizer> kTable = {
      {{"default"},
       {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3}, true},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {kQwen2}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}, {"\\p{N}", kGpt2}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais"}, {kGpt2}},
  };
  return kTable;
}

// Code points of a UTF-8 string (GGUF does not promise valid UTF-8: a stray byte counts as one).
std::vector<size_t> CharStarts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  return starts;
}

// The merges a SentencePiece vocabulary implies, as transformers derives them for a GGUF file
// without merges (generate_merges): every split of a token into two vocabulary tokens, ranked
// by the token's score, then by the halves' lengths in characters (all descending); ties keep
// vocabulary order, each token's splits ordered by the halves' ids.
json MergesFromScores(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                      const std::unordered_map<std::string, int64_t>& ids) {
  struct Merge {
    double score;
    size_t left_chars, right_chars;
    int64_t left_id, right_id;
    const std::string* token;
    size_t cut;  // byte offset of the split
  };
  std::vector<Merge> merges;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& token = tokens[t];
    const std::vector<size_t> starts = CharStarts(token);
    const size_t first = merges.size();
    for (size_t c = 1; c < starts.size(); ++c) {
      auto left = ids.find(token.substr(0, starts[c]));
      auto right = ids.find(token.substr(starts[c]));
      if (left == ids.end() || right == ids.end()) continue;
      merges.push_back({scores[t], c, starts.size() - c, left->second, right->second, &token, starts[c]});
    }
    std::sort(merges.begin() + first, merges.end(), [](const Merge& a, const Merge& b) {
      return std::tie(a.left_id, a.right_id) < std::tie(b.left_id, b.right_id);
    });
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(a.score, a.left_chars, a.right_chars) > std::tie(b.score, b.left_chars, b.right_chars);
  });
  json out = json::array();
  for (const Merge& m : merges) out.push_back(json::array({m.token->substr(0, m.cut), m.token->substr(m.cut)}));
  return out;
}

// Gemma's vocabulary as transformers spells it (gemma_tokenizer): a token of whitespace only
// (Python's str.isspace) with a space in it is looked up as one '▁' per character.
std::string GemmaSpelling(const std::string& token) {
  static const std::set<std::string> kWhitespace = {
      " ", "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u00a0", "\u1680",
      "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009",
      "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  const std::vector<size_t> starts = CharStarts(token);
  for (size_t c = 0; c < starts.size(); ++c) {
    const size_t end = c + 1 < starts.size() ? starts[c + 1] : token.size();
    if (!kWhitespace.count(token.substr(starts[c], end - starts[c]))) return token;
  }
  if (token.find(' ') == std::string::npos) return token;
  std::string out;
  for (size_t c = 0; c < starts.size(); ++c) out += "\u2581";
  return out;
}

json AddedToken(int64_t id, const std::string& content, bool special) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}


// The pre-tokenizer tokenizer.ggml.pre names (gpt2 models).
Result<const PreTokenizer*> FindPreTokenizer(const GgufFile& g) {
  std::string pre_name = "default";  // llama.cpp's choice when the file names none
  if (g.Find("tokenizer.ggml.pre")) {
    HSX_ASSIGN_OR_RETURN(pre_name, g.String("tokenizer.ggml.pre"));
  }
  for (const PreTokenizer& p : PreTokenizers()) {
    for (const char* name : p.names) {
      if (pre_name == name) return &p;
    }
  }
  return Error(g.path() + ": metadata 'tokenizer.ggml.pre' is '" + pre_name +
               "', a pre-tokenizer hsx does not know (expected default, llama-bpe, qwen2, smollm, gpt-2, ...)");
}

}  // namespace

Result<json> GgufTokenizerJson(const GgufFile& g) {
  HSX_ASSIGN_OR_RETURN(const std::string model, g.String("tokenizer.ggml.model"));
  const bool spm = model == "llama";
  if (model != "gpt2" && !spm) {
    return Error(g.path() + ": metadata 'tokenizer.ggml.model' is '" + model +
                 "': hsx reads gpt2 (byte-level BPE) and llama (SentencePiece BPE) tokenizers from GGUF");
  }
  const PreTokenizer* pre = nullptr;
  bool gemma = false;
  if (!spm) {
    HSX_ASSIGN_OR_RETURN(pre, FindPreTokenizer(g));
  } else if (g.Find("general.architecture")) {
    // transformers builds Gemma's SentencePiece tokenizers its own way (gemma_tokenizer), and
    // Gemma 4's and Phi-3's differently again; hsx knows the plain (Llama) one and Gemma's.
    HSX_ASSIGN_OR_RETURN(const std::string arch, g.String("general.architecture"));
    gemma = arch == "gemma" || arch == "gemma2" || arch == "gemma3";
    if ((arch.rfind("gemma", 0) == 0 && !gemma) || arch == "phi3") {
      return Error(g.path() + ": a SentencePiece ('llama') tokenizer of architecture '" + arch +
                   "' is not supported from GGUF");
    }
  }

  HSX_ASSIGN_OR_RETURN(const auto* tokens, g.Array("tokenizer.ggml.tokens", GgufType::kString));
  const std::vector<GgufValue>* types = nullptr;
  if (g.Find("tokenizer.ggml.token_type")) {
    HSX_ASSIGN_OR_RETURN(types, g.Array("tokenizer.ggml.token_type", GgufType::kI32));
    if (types->size() != tokens->size()) {
      return Error(g.path() + ": metadata 'tokenizer.ggml.token_type' has " + std::to_string(types->size()) +
                   " entries for " + std::to_string(tokens->size()) + " tokens");
    }
  }
  std::vector<std::string> spelled;
  spelled.reserve(tokens->size());
  for (const GgufValue& t : *tokens) spelled.push_back(gemma ? GemmaSpelling(t.s) : t.s);
  json vocab = json::object();
  std::unordered_map<std::string, int64_t> ids;
  for (size_t id = 0; id < spelled.size(); ++id) {
    const std::string& token = spelled[id];
    auto [it, inserted] = ids.emplace(token, static_cast<int64_t>(id));
    if (!inserted) {
      return Error(g.path() + ": metadata 'tokenizer.ggml.tokens': token " + std::to_string(id) + " (" + json(token).dump() +
                   ") repeats token " + std::to_string(it->second));
    }
    vocab[token] = id;
  }
  json added = json::array();
  for (size_t id = 0; id < tokens->size(); ++id) {
    const std::string& token = (*tokens)[id].s;
    const int64_t type = types ? (*types)[id].i : 1;
    // transformers adds a user-defined token only under its own spelling (Gemma's space tokens
    // are not: they stay plain vocabulary).
    if (type == kUserDefined && token != spelled[id]) continue;
    if (type == kUnknown || type == kControl || type == kUserDefined) {
      added.push_back(AddedToken(static_cast<int64_t>(id), token, type != kUserDefined));
    }
  }
  json merge_list = json::array();
  if (g.Find("tokenizer.ggml.merges") || !spm) {
    HSX_ASSIGN_OR_RETURN(const auto* merges, g.Array("tokenizer.ggml.merges", GgufType::kString));
    for (const GgufValue& m : *merges) merge_list.push_back(m.s);
  } else {
    // Gemma's scores do not follow its merge order; transformers ranks by vocabulary order.
    std::vector<double> scores(tokens->size());
    if (gemma) {
      for (size_t id = 0; id < scores.size(); ++id) scores[id] = -static_cast<double>(id);
    } else {
      HSX_ASSIGN_OR_RETURN(const auto* given, g.Array("tokenizer.ggml.scores", GgufType::kF32));
      if (given->size() != tokens->size()) {
        return Error(g.path() + ": metadata 'tokenizer.ggml.scores' has " + std::to_string(given->size()) +
                     " entries for " + std::to_string(tokens->size()) + " tokens");
      }
      for (size_t id = 0; id < scores.size(); ++id) scores[id] = (*given)[id].f;
    }
    merge_list = MergesFromScores(spelled, scores, ids);
  }

  // BOS and EOS: added where tokenizer.ggml.add_{bos,eos}_token say (llama.cpp's defaults
  // otherwise: BOS for SentencePiece and llama3-style pre-tokenizers).
  auto special_id = [&](const char* key) -> Result<std::optional<uint64_t>> {
    if (!g.Find(key)) return std::optional<uint64_t>();
    HSX_ASSIGN_OR_RETURN(const uint64_t id, g.Unsigned(key));
    if (id >= tokens->size()) {
      return Error(g.path() + ": metadata '" + key + "' is " + std::to_string(id) + ", past the " +
                   std::to_string(tokens->size()) + "-token vocabulary");
    }
    return std::optional<uint64_t>(id);
  };
  auto flag = [&](const char* key, bool fallback) -> Result<bool> { return g.Find(key) ? g.Bool(key) : fallback; };
  HSX_ASSIGN_OR_RETURN(const auto bos, special_id("tokenizer.ggml.bos_token_id"));
  HSX_ASSIGN_OR_RETURN(const auto eos, special_id("tokenizer.ggml.eos_token_id"));
  HSX_ASSIGN_OR_RETURN(const bool add_bos, flag("tokenizer.ggml.add_bos_token", spm || pre->llama3));
  HSX_ASSIGN_OR_RETURN(const bool add_eos, flag("tokenizer.ggml.add_eos_token", false));
  json single = json::array();
  json specials = json::object();
  auto add_special = [&](const std::optional<uint64_t>& id, const char* which) -> Status {
    if (!id) return Error(g.path() + ": metadata 'tokenizer.ggml.add_" + which + "_token' is true, but the file names no " + which + " token");
    const std::string& token = (*tokens)[*id].s;
    single.push_back({{"SpecialToken", {{"id", token}, {"type_id", 0}}}});
    specials[token] = {{"id", token}, {"ids", {*id}}, {"tokens", {token}}};
    return {};
  };
  if (add_bos) HSX_RETURN_IF_ERROR(add_special(bos, "bos"));
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) HSX_RETURN_IF_ERROR(add_special(eos, "eos"));

  json normalizer, pre_tokenizer, decoder, unk;
  if (gemma) {
    // transformers' GemmaTokenizer: spaces become '▁' (no prefix), a no-op split on the spaces
    // left, byte fallback, and '▁' back to spaces when decoding.
    normalizer = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
    pre_tokenizer = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
    decoder = {{"type", "Sequence"},
               {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                         {{"type", "ByteFallback"}},
                                         {{"type", "Fuse"}}})}};
    HSX_ASSIGN_OR_RETURN(const auto unk_id, special_id("tokenizer.ggml.unknown_token_id"));
    if (unk_id) unk = (*tokens)[*unk_id].s;
  } else if (spm) {
    // transformers' LlamaTokenizer, which its GGUF conversion builds: '▁' for spaces and one
    // before the text, byte fallback, and the reverse when decoding.
    pre_tokenizer = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
    decoder = {{"type", "Sequence"},
               {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                         {{"type", "ByteFallback"}},
                                         {{"type", "Fuse"}},
                                         {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  } else {
    json splits = json::array();
    for (const char* regex : pre->regexes) {
      splits.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
    }
    splits.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}});
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", splits}};
    decoder = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", single}, {"special_tokens", specials}}},
      {"decoder", decoder},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk}, {"fuse_unk", spm}, {"byte_fallback", spm},
        {"ignore_merges", !spm && pre->llama3}, {"vocab", vocab}, {"merges", merge_list}}},
  };
}

Result<Tokenizer> GgufTokenizer(const GgufFile& file) {
  HSX_ASSIGN_OR_RETURN(const json document, GgufTokenizerJson(file));
  return Tokenizer::FromJson(document, file.path() + " (tokenizer.ggml.* as tokenizer.json)");
}

Result<Tokenizer> LoadGgufTokenizer(const std::string& path) {
  HSX_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(path));
  return GgufTokenizer(file);
}

}  // namespace hsx
