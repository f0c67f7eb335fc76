// The values a chat template computes with: Python's as Jinja2 sees them (None, bool, int,
// float, str, list, dict), plus Jinja's undefined, a namespace() and callables (macros,
// bound string/dict methods, globals). Lists and dicts are immutable once built (HF renders in
// an ImmutableSandboxedEnvironment), so they are shared, never copied; a namespace is the one
// mutable value (`{% set ns.x = ... %}`).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hsx::tmpl {

// Raised inside the lexer, parser and renderer; the public entry points turn it into a
// Status. `line` is the template line at fault, 0 when not yet known.
struct TemplateError : std::runtime_error {
  TemplateError(const std::string& message, int line = 0) : std::runtime_error(message), line(line) {}
  int line;
};

class Value;
using ValueList = std::vector<Value>;
// Insertion-ordered, as Python's dict (tojson and items() keep the order messages came in).
using ValueDict = std::vector<std::pair<std::string, Value>>;
using Namespace = std::map<std::string, Value>;
struct CallArgs;
using Callable = std::function<Value(CallArgs&)>;

class Value {
 public:
  static constexpr int kMaxNesting = 128;

  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // undefined
  static Value None() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}  // NOLINT: literals convert implicitly
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}  // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double f) : kind_(Kind::kFloat), float_(f) {}  // NOLINT
  Value(std::string s) : kind_(Kind::kString), string_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  // Lists and dicts nest at most kMaxNesting deep (printing, comparing and freeing recurse).
  Value(ValueList l);  // NOLINT
  Value(ValueDict d);  // NOLINT
  static Value MakeNamespace(Namespace ns);
  static Value MakeCallable(std::string name, Callable fn);
  // A JSON document (request messages, tools) as Python's json.loads would give it.
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // bool and int
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return *string_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  Namespace& as_namespace() const { return *namespace_; }
  const Callable& as_callable() const { return callable_->second; }
  const std::string& callable_name() const { return callable_->first; }

  // A dict's value for `key`, or nullptr.
  const Value* Find(const std::string& key) const;
  // Python's bool(): empty strings, lists and dicts, 0, None and undefined are false.
  bool Truthy() const;
  // Python's str(): what {{ }} prints (undefined prints nothing).
  std::string Str() const;
  // Python's repr(): strings quoted, as inside a printed list or dict.
  std::string Repr() const;
  // Python's type name, for error messages.
  std::string TypeName() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}
  Kind kind_ = Kind::kUndefined;
  int nesting_ = 0;  // lists and dicts: 1 + the deepest element's
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<const ValueDict> dict_;
  std::shared_ptr<Namespace> namespace_;
  std::shared_ptr<const std::pair<std::string, Callable>> callable_;
};

// Python's ==, as Jinja compares (1 == 1.0 == True; lists and dicts element-wise).
bool Equal(const Value& a, const Value& b);

// Python's float repr (1.0, 0.1, 1e+16, inf, nan).
std::string FloatRepr(double f);

// json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys): HF's tojson
// filter. indent < 0: no indentation (", " and ": " separators).
std::string ToJson(const Value& value, int indent, bool sort_keys);

// Arguments of a call as written: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  std::string callee;  // for errors

  // Argument `index` (or keyword `name`); `fallback` when neither was given.
  Value Get(size_t index, const std::string& name, Value fallback = Value()) const;
  // Fails naming the callee when more than `max_positional` positional arguments or a
  // keyword outside `names` was given.
  void Expect(size_t max_positional, std::initializer_list<const char*> names) const;
};

}  // namespace hsx::tmpl
