#include "model/gguf_tokenizer.h"


namespace hsx {
namespace {

using nlohmann::json;

// llama.cpp's token types (llama_token_type).
constexpr int64_t kControl = 3, kUserDefined = 4;

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

json AddedToken(int64_t id, const std::string& content, bool special) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

}  // namespace

Result<json> GgufTokenizerJson(const GgufFile& g) {
  HSX_ASSIGN_OR_RETURN(const std::string model, g.String("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return Error(g.path() + ": metadata 'tokenizer.ggml.model' is '" + model +
                 "': hsx reads only gpt2 (byte-level BPE) tokenizers from GGUF");
  }
  std::string pre_name = "default";  // llama.cpp's choice when the file names none
  if (g.Find("tokenizer.ggml.pre")) {
    HSX_ASSIGN_OR_RETURN(pre_name, g.String("tokenizer.ggml.pre"));
  }
  const PreTokenizer* pre = nullptr;
  for (const PreTokenizer& p : PreTokenizers()) {
    for (const char* name : p.names) {
      if (pre_name == name) pre = &p;
    }
  }
  if (!pre) {
    return Error(g.path() + ": metadata 'tokenizer.ggml.pre' is '" + pre_name +
                 "', a pre-tokenizer hsx does not know (expected default, llama-bpe, qwen2, smollm, gpt-2, ...)");
  }

  HSX_ASSIGN_OR_RETURN(const auto* tokens, g.Array("tokenizer.ggml.tokens", GgufType::kString));
  HSX_ASSIGN_OR_RETURN(const auto* merges, g.Array("tokenizer.ggml.merges", GgufType::kString));
  const std::vector<GgufValue>* types = nullptr;
  if (g.Find("tokenizer.ggml.token_type")) {
    HSX_ASSIGN_OR_RETURN(types, g.Array("tokenizer.ggml.token_type", GgufType::kI32));
    if (types->size() != tokens->size()) {
      return Error(g.path() + ": metadata 'tokenizer.ggml.token_type' has " + std::to_string(types->size()) +
                   " entries for " + std::to_string(tokens->size()) + " tokens");
    }
  }
  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < tokens->size(); ++id) {
    const std::string& token = (*tokens)[id].s;
    if (vocab.contains(token)) {
      return Error(g.path() + ": metadata 'tokenizer.ggml.tokens': token " + std::to_string(id) + " (" + json(token).dump() +
                   ") repeats token " + vocab[token].dump());
    }
    vocab[token] = id;
    const int64_t type = types ? (*types)[id].i : 1;
    if (type == kControl || type == kUserDefined) added.push_back(AddedToken(static_cast<int64_t>(id), token, type == kControl));
  }
  json merge_list = json::array();
  for (const GgufValue& m : *merges) merge_list.push_back(m.s);

  // BOS and EOS: added where tokenizer.ggml.add_{bos,eos}_token say (llama.cpp's defaults
  // otherwise: BOS for llama3-style pre-tokenizers only).
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
  HSX_ASSIGN_OR_RETURN(const bool add_bos, flag("tokenizer.ggml.add_bos_token", pre->llama3));
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

  json splits = json::array();
  for (const char* regex : pre->regexes) {
    splits.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
  }
  splits.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}});
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", splits}}},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", single}, {"special_tokens", specials}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", pre->llama3}, {"vocab", vocab}, {"merges", merge_list}}},
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
