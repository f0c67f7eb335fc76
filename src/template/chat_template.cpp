#include "template/chat_template.h"

#include <filesystem>

#include "util/json.h"
#include "util/text_file.h"

namespace hsx {
namespace {

// A template is code a person wrote by hand; 1 MiB is far past any real one.
constexpr size_t kMaxTemplateBytes = 1u << 20;

Result<nlohmann::ordered_json> ReadTokenizerConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) return nlohmann::ordered_json::object();
  HSX_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  HSX_ASSIGN_OR_RETURN(nlohmann::ordered_json config, ParseJson(text, path));
  if (!config.is_object()) return Error(path + ": expected a JSON object");
  return config;
}

std::string Describe(const nlohmann::ordered_json& j) { return j.type_name(); }

Status CheckMessages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return Error("messages: expected an array of messages, got " + Describe(messages));
  if (messages.empty()) return Error("messages: expected at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const nlohmann::ordered_json& m = messages[i];
    if (!m.is_object()) return Error(at + ": expected an object with 'role' and 'content', got " + Describe(m));
    auto role = m.find("role");
    if (role == m.end()) return Error(at + ".role: missing");
    if (!role->is_string()) return Error(at + ".role: expected a string, got " + Describe(*role));
    auto content = m.find("content");
    if (content == m.end() || content->is_null() || content->is_string()) continue;
    if (!content->is_array()) {
      return Error(at + ".content: expected a string, null or an array of text parts, got " + Describe(*content));
    }
    for (size_t k = 0; k < content->size(); ++k) {
      const std::string part_at = at + ".content[" + std::to_string(k) + "]";
      const nlohmann::ordered_json& part = (*content)[k];
      if (!part.is_object()) return Error(part_at + ": expected an object {\"type\": \"text\", \"text\": ...}");
      auto type = part.find("type");
      if (type == part.end() || !type->is_string()) return Error(part_at + ".type: expected a string");
      if (*type != "text") return Error(part_at + ".type: only \"text\" parts are supported, got " + type->dump());
      auto text = part.find("text");
      if (text == part.end() || !text->is_string()) return Error(part_at + ".text: expected a string");
    }
  }
  return {};
}

}  // namespace

Result<std::optional<std::string>> FindChatTemplate(const std::string& model_dir) {
  const std::string jinja = model_dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    HSX_ASSIGN_OR_RETURN(std::string text, ReadTextFile(jinja, kMaxTemplateBytes));
    return std::optional<std::string>(std::move(text));
  }
  HSX_ASSIGN_OR_RETURN(nlohmann::ordered_json config, ReadTokenizerConfig(model_dir));
  auto field = config.find("chat_template");
  if (field == config.end() || field->is_null()) return std::optional<std::string>();
  const std::string where = model_dir + "/tokenizer_config.json: chat_template";
  if (field->is_string()) return std::optional<std::string>(field->get<std::string>());
  if (field->is_array()) {
    for (const auto& entry : *field) {
      if (entry.is_object() && entry.value("name", nlohmann::ordered_json()) == "default") {
        auto text = entry.find("template");
        if (text == entry.end() || !text->is_string()) return Error(where + ": the \"default\" entry has no string \"template\"");
        return std::optional<std::string>(text->get<std::string>());
      }
    }
    return Error(where + ": a list of named templates without a \"default\" one");
  }
  return Error(where + ": expected a string or a list of {\"name\", \"template\"}");
}

Result<ChatOptions> ReadChatOptions(const nlohmann::ordered_json& object, bool default_add_generation_prompt) {
  ChatOptions options;
  options.add_generation_prompt = default_add_generation_prompt;
  if (auto f = object.find("add_generation_prompt"); f != object.end()) {
    if (!f->is_boolean()) return Error("add_generation_prompt: expected true or false");
    options.add_generation_prompt = f->get<bool>();
  }
  if (auto f = object.find("tools"); f != object.end() && !f->is_null()) {
    if (!f->is_array()) return Error("tools: expected an array of tools");
    options.tools = *f;
  }
  if (auto f = object.find("chat_template_kwargs"); f != object.end() && !f->is_null()) {
    if (!f->is_object()) return Error("chat_template_kwargs: expected an object");
    options.extra = *f;
  }
  return options;
}

Result<std::optional<ChatTemplate>> ChatTemplate::Load(const std::string& model_dir) {
  HSX_ASSIGN_OR_RETURN(std::optional<std::string> source, FindChatTemplate(model_dir));
  if (!source) return std::optional<ChatTemplate>();
  HSX_ASSIGN_OR_RETURN(nlohmann::ordered_json config, ReadTokenizerConfig(model_dir));
  // The tokens transformers' special_tokens_map holds: a string or an AddedToken object.
  tmpl::ValueDict special_tokens;
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto field = config.find(name);
    if (field == config.end() || field->is_null()) continue;
    if (field->is_string()) {
      special_tokens.emplace_back(name, tmpl::Value(field->get<std::string>()));
    } else if (field->is_object() && field->contains("content") && (*field)["content"].is_string()) {
      special_tokens.emplace_back(name, tmpl::Value((*field)["content"].get<std::string>()));
    } else {
      return Error(model_dir + "/tokenizer_config.json: " + name + ": expected a string or {\"content\": ...}");
    }
  }
  auto created = Create(*source, std::move(special_tokens));
  if (!created.ok()) return created.status().with_context(model_dir + ": chat template");
  return std::optional<ChatTemplate>(std::move(created).value());
}

Result<ChatTemplate> ChatTemplate::Create(const std::string& source, tmpl::ValueDict special_tokens) {
  HSX_ASSIGN_OR_RETURN(tmpl::Template parsed, tmpl::Template::Parse(source));
  ChatTemplate t;
  t.template_ = std::move(parsed);
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages, const ChatOptions& options) const {
  HSX_RETURN_IF_ERROR(CheckMessages(messages));
  if (!options.extra.is_object()) return Error("chat_template_kwargs: expected an object");
  tmpl::ValueDict variables = special_tokens_;
  variables.emplace_back("messages", tmpl::Value::FromJson(messages));
  variables.emplace_back("tools", options.tools.is_null() ? tmpl::Value::None() : tmpl::Value::FromJson(options.tools));
  variables.emplace_back("documents", tmpl::Value::None());
  variables.emplace_back("add_generation_prompt", tmpl::Value(options.add_generation_prompt));
  for (const auto& [name, value] : options.extra.items()) variables.emplace_back(name, tmpl::Value::FromJson(value));
  auto text = template_.Render(variables);
  if (!text.ok()) return text.status().with_context("chat template");
  return text;
}

}  // namespace hsx
