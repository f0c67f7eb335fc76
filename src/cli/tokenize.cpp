// hsx tokenize: {"text": ..} lines in, {"ids": [..]} lines out; {"ids": [..]} lines in,
// {"text": ..} lines out (HF's decode with skip_special_tokens=False).
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/gguf_config.h"
#include "model/gguf_tokenizer.h"
#include "util/json.h"

namespace hsx::cli {
namespace {

// One line's answer, or an error naming what is wrong with it.
Result<nlohmann::json> TokenizeLine(const Tokenizer& tokenizer, const nlohmann::json& line,
                                    bool add_special_tokens) {
  if (!line.is_object()) return Error("expected {\"text\": ...} or {\"ids\": [...]}");
  if (auto ids = line.find("ids"); ids != line.end()) {
    std::vector<int32_t> parsed;
    if (!ids->is_array()) return Error("'ids': expected an array of token ids");
    for (const nlohmann::json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= tokenizer.vocab_size()) {
        return Error("'ids': " + id.dump() + " is not a token id (the vocabulary has " +
                     std::to_string(tokenizer.vocab_size()) + ")");
      }
      parsed.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    HSX_ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(parsed));
    return nlohmann::json{{"text", text}};
  }
  auto text = line.find("text");
  if (text == line.end() || !text->is_string()) return Error("expected a string field 'text'");
  if (auto add = line.find("add_special_tokens"); add != line.end()) {
    if (!add->is_boolean()) return Error("'add_special_tokens': expected true or false");
    add_special_tokens = add->get<bool>();
  }
  HSX_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                       tokenizer.Encode(text->get_ref<const std::string&>(), add_special_tokens));
  return nlohmann::json{{"ids", ids}};
}

int RunTokenize(const std::string& tokenizer_path, const std::string& input, bool add_special_tokens) {
  const char* cmd = "tokenize";
  auto tokenizer = IsGgufPath(tokenizer_path) ? LoadGgufTokenizer(tokenizer_path) : Tokenizer::Load(tokenizer_path);
  if (!tokenizer.ok()) return Fail(cmd, tokenizer.status());
  return RunJsonLines(cmd, input, /*error_lines=*/false,
                      [&](const std::string& text, const std::string& where) -> Result<std::string> {
                        HSX_ASSIGN_OR_RETURN(nlohmann::json parsed, ParseJson(text, where));
                        Result<nlohmann::json> answer = TokenizeLine(*tokenizer, parsed, add_special_tokens);
                        if (!answer.ok()) return answer.status().with_context(where);
                        // Invalid UTF-8 cannot come out: decoding replaces it with U+FFFD, as HF does.
                        return answer->dump();
                      });
}

}  // namespace

void RegisterTokenize(CLI::App& root) {
  auto tokenizer = std::make_shared<std::string>();
  auto input = std::make_shared<std::string>();
  auto add_special_tokens = std::make_shared<bool>(true);
  CLI::App* app = root.add_subcommand(
      "tokenize", "Encode {\"text\"} or decode {\"ids\"} JSONL lines with a tokenizer.json");
  app->add_option("--tokenizer", *tokenizer, "Path of a Hugging Face tokenizer.json, or a .gguf file (its tokenizer.ggml.* metadata)")->required();
  app->add_option("--input", *input, "JSONL with a 'text' or an 'ids' field per line")->required();
  app->add_option("--add-special-tokens", *add_special_tokens,
                  "Add the tokenizer's special tokens (BOS, ...) around each text, as HF and vLLM "
                  "do by default; a line's own 'add_special_tokens' overrides it")
      ->default_val(true);
  app->callback([tokenizer, input, add_special_tokens] {
    ExitCode() = RunTokenize(*tokenizer, *input, *add_special_tokens);
  });
}

}  // namespace hsx::cli
