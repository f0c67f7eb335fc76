#include "tokenizer/post_processor.h"

#include "tokenizer/json_fields.h"

namespace hsx {
namespace {

using nlohmann::json;

Status CheckId(int64_t id, int vocab_size, const std::string& where) {
  if (id < 0 || id >= vocab_size) {
    return Error(where + ": id " + std::to_string(id) + " is outside the vocabulary of " +
                 std::to_string(vocab_size) + " ids");
  }
  return Status();
}

// RobertaProcessing's and BertProcessing's ["<s>", 0].
Result<int32_t> TokenPairId(const json& config, const std::string& key, int vocab_size,
                            const std::string& where) {
  HSX_ASSIGN_OR_RETURN(const json* pair, json_fields::Required(config, key, where));
  const std::string path = json_fields::Path(where, key);
  if (!pair->is_array() || pair->size() != 2 || !(*pair)[0].is_string() ||
      !(*pair)[1].is_number_integer()) {
    return Error(path + ": expected [\"token\", id]");
  }
  const int64_t id = (*pair)[1].get<int64_t>();
  HSX_RETURN_IF_ERROR(CheckId(id, vocab_size, path));
  return static_cast<int32_t>(id);
}

}  // namespace

Result<PostProcessor> PostProcessor::FromJson(const json& config, int vocab_size,
                                              const std::string& where) {
  PostProcessor processor;
  if (!config.is_null()) HSX_RETURN_IF_ERROR(AddSteps(config, vocab_size, where, &processor));
  return processor;
}

Status PostProcessor::AddSteps(const json& config, int vocab_size, const std::string& where,
                               PostProcessor* processor) {
  namespace jf = json_fields;
  HSX_ASSIGN_OR_RETURN(std::string type, jf::String(config, "type", where));
  if (type == "Sequence") {
    HSX_ASSIGN_OR_RETURN(const json* list, jf::Required(config, "processors", where));
    if (!list->is_array()) return Error(where + ".processors: expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      HSX_RETURN_IF_ERROR(AddSteps((*list)[i], vocab_size,
                                   where + ".processors[" + std::to_string(i) + "]", processor));
    }
  } else if (type == "ByteLevel") {
    // Adjusts offsets only; ids are unchanged.
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    HSX_ASSIGN_OR_RETURN(int32_t cls, TokenPairId(config, "cls", vocab_size, where));
    HSX_ASSIGN_OR_RETURN(int32_t sep, TokenPairId(config, "sep", vocab_size, where));
    // Each processor of a Sequence wraps what the previous ones produced.
    processor->prefix_.insert(processor->prefix_.begin(), cls);
    processor->suffix_.push_back(sep);
  } else if (type == "TemplateProcessing") {
    HSX_ASSIGN_OR_RETURN(const json* single, jf::Required(config, "single", where));
    HSX_ASSIGN_OR_RETURN(const json* special_tokens, jf::Required(config, "special_tokens", where));
    if (!single->is_array()) return Error(where + ".single: expected an array");
    if (!special_tokens->is_object()) return Error(where + ".special_tokens: expected an object");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const std::string piece_where = where + ".single[" + std::to_string(i) + "]";
      const json& piece = (*single)[i];
      if (piece.is_object() && piece.contains("Sequence")) {
        HSX_ASSIGN_OR_RETURN(std::string id, jf::String(piece["Sequence"], "id", piece_where + ".Sequence"));
        if (id != "A" || seen_sequence) {
          return Error(piece_where + ": a single-sequence template holds $A exactly once");
        }
        seen_sequence = true;
      } else if (piece.is_object() && piece.contains("SpecialToken")) {
        HSX_ASSIGN_OR_RETURN(std::string name,
                             jf::String(piece["SpecialToken"], "id", piece_where + ".SpecialToken"));
        auto token = special_tokens->find(name);
        if (token == special_tokens->end()) {
          return Error(piece_where + ": '" + name + "' is not in " + where + ".special_tokens");
        }
        const std::string token_where = where + ".special_tokens." + name;
        HSX_ASSIGN_OR_RETURN(const json* ids, jf::Required(*token, "ids", token_where));
        if (!ids->is_array()) return Error(token_where + ".ids: expected an array");
        for (const json& id : *ids) {
          if (!id.is_number_integer()) return Error(token_where + ".ids: expected integers");
          HSX_RETURN_IF_ERROR(CheckId(id.get<int64_t>(), vocab_size, token_where + ".ids"));
          (seen_sequence ? after : before).push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
      } else {
        return Error(piece_where + ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_sequence) return Error(where + ".single: the template has no $A");
    processor->prefix_.insert(processor->prefix_.begin(), before.begin(), before.end());
    processor->suffix_.insert(processor->suffix_.end(), after.begin(), after.end());
  } else {
    return Error(where + ".type '" + type +
                 "' is not supported; expected TemplateProcessing, RobertaProcessing, "
                 "BertProcessing, ByteLevel or Sequence");
  }
  return Status();
}

std::vector<int32_t> PostProcessor::Apply(std::vector<int32_t> ids) const {
  if (prefix_.empty() && suffix_.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(prefix_.size() + ids.size() + suffix_.size());
  out.insert(out.end(), prefix_.begin(), prefix_.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

}  // namespace hsx
