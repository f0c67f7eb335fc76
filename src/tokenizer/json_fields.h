// Typed reads of tokenizer.json fields. Every error names the field by its path in the file
// ("model.unk_token: expected a string or null"), so a user can find what to fix.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "util/status.h"

namespace hsx::json_fields {

inline std::string Path(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

inline Result<const nlohmann::json*> Required(const nlohmann::json& object, const std::string& key,
                                              const std::string& where) {
  if (!object.is_object()) return Error(where + ": expected an object");
  auto it = object.find(key);
  if (it == object.end()) return Error(Path(where, key) + ": missing");
  return &*it;
}

inline Result<std::string> String(const nlohmann::json& object, const std::string& key,
                                  const std::string& where) {
  HSX_ASSIGN_OR_RETURN(const nlohmann::json* value, Required(object, key, where));
  if (!value->is_string()) return Error(Path(where, key) + ": expected a string");
  return value->get<std::string>();
}

// Missing and null both mean "not set", as HF's serde defaults do.
inline Result<std::optional<std::string>> OptionalString(const nlohmann::json& object,
                                                         const std::string& key,
                                                         const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return Error(Path(where, key) + ": expected a string or null");
  return std::optional<std::string>(it->get<std::string>());
}

inline Result<bool> Bool(const nlohmann::json& object, const std::string& key,
                         const std::string& where, bool fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Error(Path(where, key) + ": expected true or false");
  return it->get<bool>();
}

inline Result<int64_t> Integer(const nlohmann::json& object, const std::string& key,
                               const std::string& where) {
  HSX_ASSIGN_OR_RETURN(const nlohmann::json* value, Required(object, key, where));
  if (!value->is_number_integer()) return Error(Path(where, key) + ": expected an integer");
  return value->get<int64_t>();
}

}  // namespace hsx::json_fields
