// Typed reads of Hugging Face config.json objects with errors that name the file and the
// field, shared by the model's config and the drafters'. Unknown fields are refused.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "util/status.h"

namespace hsx::config {

using json = nlohmann::json;

// Any count or width a config gives (layers, heads, hidden size, vocabulary, experts):
// far above every published model, low enough that products of two fit in int64 and a
// typo fails here rather than as a failed multi-terabyte allocation.
constexpr int64_t kMaxSize = 1 << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 30;
constexpr int64_t kMaxLayers = 4096;  // per-layer specs are allocated up front

// Fields transformers reads (or keeps) that cannot change hidden states or stop tokens.
// Every other field hsx does not read is refused: an unknown field may change the
// computation, and a silently wrong hidden state is worse than an error.
const std::set<std::string>& IgnoredFields();

// Unknown fields a user let through by name (--allow-unknown-config-field): each is passed over
// with a warning on stderr naming the file and the field, instead of refused. Set before
// configs are read (the command line's parse); read by every config reader.
void AllowUnknownConfigField(const std::string& name);
const std::set<std::string>& AllowedUnknownConfigFields();
// Passes over an allowed unknown field: logs it. Defined with the setter.
void WarnAllowedUnknownField(const std::string& source, const std::string& key);

// Whether the JSON integer v lies in [lo, hi] (unsigned values above INT64_MAX included).
inline bool IntInRange(const json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    return x <= static_cast<uint64_t>(INT64_MAX) && lo <= static_cast<int64_t>(x) && static_cast<int64_t>(x) <= hi;
  }
  const int64_t x = v.get<int64_t>();
  return lo <= x && x <= hi;
}

// Typed reads of one config object with errors that name the file and the field. A
// field the object lacks falls back to `defaults` (transformers' value); every field
// looked at is recorded, so the fields nobody read can be refused at the end.
class Fields {
 public:
  Fields(const json& j, const json& defaults, std::string source)
      : j_(j), defaults_(defaults), source_(std::move(source)) {}

  // The field's value, the default's, or nullptr when neither has one (null is a value).
  const json* Get(const std::string& key) const {
    read_.insert(key);
    if (j_.contains(key)) return &j_[key];
    if (defaults_.contains(key)) return &defaults_[key];
    return nullptr;
  }
  // Whether config.json itself has the field (with any value, null included).
  bool Given(const std::string& key) const {
    read_.insert(key);
    return j_.contains(key);
  }
  bool Has(const std::string& key) const {
    const json* v = Get(key);
    return v != nullptr && !v->is_null();
  }

  Result<std::optional<int64_t>> OptionalInt(const std::string& key, int64_t lo, int64_t hi) const {
    const json* v = Get(key);
    if (v == nullptr || v->is_null()) return std::optional<int64_t>();
    if (!v->is_number_integer()) return Wrong(key, *v, "an integer");
    if (!IntInRange(*v, lo, hi)) {
      return Fail(key, v->dump() + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return std::optional<int64_t>(v->get<int64_t>());
  }
  // A required integer in [lo, hi].
  Result<int> Int(const std::string& key, int64_t lo = 1, int64_t hi = kMaxSize) const {
    HSX_ASSIGN_OR_RETURN(auto v, OptionalInt(key, lo, hi));
    if (!v) return Missing(key, "an integer");
    return static_cast<int>(*v);
  }

  Result<std::optional<double>> OptionalNumber(const std::string& key) const {
    const json* v = Get(key);
    if (v == nullptr || v->is_null()) return std::optional<double>();
    if (!v->is_number()) return Wrong(key, *v, "a number");
    return std::optional<double>(v->get<double>());
  }
  // A required number that must be finite and > 0 (rope bases, scales, epsilons): other
  // values can only produce inf or NaN.
  Result<double> Positive(const std::string& key) const {
    HSX_ASSIGN_OR_RETURN(auto v, OptionalNumber(key));
    if (!v) return Missing(key, "a number");
    // The forward computes in f32: a value that rounds to 0 or inf there is as bad as 0 or inf.
    if (!(*v >= std::numeric_limits<float>::min() && *v <= std::numeric_limits<float>::max())) {
      return Fail(key, "must be a finite number > 0 within single precision's range (got " + Get(key)->dump() + ")");
    }
    return *v;
  }

  Result<bool> Bool(const std::string& key, bool fallback = false) const {
    const json* v = Get(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_boolean()) return Wrong(key, *v, "true or false");
    return v->get<bool>();
  }

  Result<std::string> String(const std::string& key) const {
    const json* v = Get(key);
    if (v == nullptr || v->is_null()) return Missing(key, "a string");
    if (!v->is_string()) return Wrong(key, *v, "a string");
    return v->get<std::string>();
  }

  // A list of integers in [lo, hi] (null or absent: empty).
  Result<std::vector<int>> IntList(const std::string& key, int64_t lo, int64_t hi) const {
    const json* v = Get(key);
    std::vector<int> out;
    if (v == nullptr || v->is_null()) return out;
    if (!v->is_array()) return Wrong(key, *v, "a list of integers");
    for (const json& e : *v) {
      if (!e.is_number_integer()) return Fail(key, "entries must be integers");
      if (!IntInRange(e, lo, hi)) {
        return Fail(key, "entry " + e.dump() + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      }
      out.push_back(e.get<int>());
    }
    return out;
  }

  // Refuses the fields of config.json that nothing read and that are not known not to matter.
  // Keys with a leading underscore are Hugging Face's bookkeeping (transformers writes
  // _name_or_path, _commit_hash, _model_name_or_path when it converts a GGUF, ...; it keeps
  // them out of the model's arguments) and are passed over.
  Status CheckAllRead(const std::set<std::string>& also_ignored = {}) const {
    for (const auto& [key, value] : j_.items()) {
      if (read_.count(key) || IgnoredFields().count(key) || also_ignored.count(key)) continue;
      if (!key.empty() && key[0] == '_') continue;
      if (AllowedUnknownConfigFields().count(key)) {
        WarnAllowedUnknownField(source_, key);
        continue;
      }
      return Fail(key, "not supported: hsx does not implement it and cannot rule out that it changes the "
                       "model's computation (see docs/model-semantics.md; --allow-unknown-config-field " +
                       key + " proceeds anyway)");
    }
    return {};
  }

  const std::string& source() const { return source_; }
  Status Fail(const std::string& key, const std::string& what) const {
    return Error(source_ + ": field '" + key + "': " + what);
  }

 private:
  Status Missing(const std::string& key, const char* expected) const {
    return Fail(key, std::string("missing (expected ") + expected + ")");
  }
  Status Wrong(const std::string& key, const json& v, const char* expected) const {
    return Fail(key, "is " + std::string(v.type_name()) + ", expected " + expected);
  }
  const json& j_;
  const json& defaults_;
  std::string source_;
  mutable std::set<std::string> read_;
};

}  // namespace hsx::config
