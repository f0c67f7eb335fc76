#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace hsx::tmpl {

namespace {

template <class Elements, class Get>
int NestingOf(const Elements& elements, Get get) {
  int deepest = 0;
  for (const auto& e : elements) deepest = std::max(deepest, get(e));
  if (deepest + 1 > Value::kMaxNesting) {
    throw TemplateError("a list or dict nests deeper than " + std::to_string(Value::kMaxNesting) + " levels");
  }
  return deepest + 1;
}

}  // namespace

Value::Value(ValueList l) : kind_(Kind::kList) {
  nesting_ = NestingOf(l, [](const Value& e) { return e.nesting_; });
  list_ = std::make_shared<const ValueList>(std::move(l));
}

Value::Value(ValueDict d) : kind_(Kind::kDict) {
  nesting_ = NestingOf(d, [](const auto& e) { return e.second.nesting_; });
  dict_ = std::make_shared<const ValueDict>(std::move(d));
}

Value Value::MakeNamespace(Namespace ns) {
  Value v(Kind::kNamespace);
  v.namespace_ = std::make_shared<Namespace>(std::move(ns));
  return v;
}

Value Value::MakeCallable(std::string name, Callable fn) {
  Value v(Kind::kCallable);
  v.callable_ = std::make_shared<const std::pair<std::string, Callable>>(std::move(name), std::move(fn));
  return v;
}

// Iterative over the nesting would gain nothing: ParseJson bounds request nesting at 64.
Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return None();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList list;
      list.reserve(j.size());
      for (const auto& e : j) list.push_back(FromJson(e));
      return Value(std::move(list));
    }
    case nlohmann::json::value_t::object: {
      ValueDict dict;
      dict.reserve(j.size());
      for (const auto& [k, e] : j.items()) dict.emplace_back(k, FromJson(e));
      return Value(std::move(dict));
    }
    default: return None();  // binary and discarded values never come out of ParseJson
  }
}

const Value* Value::Find(const std::string& key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0;
    case Kind::kString: return !string_->empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->empty();
    default: return true;
  }
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip, laid out as Python's repr: positional for
  // exponents in [-4, 16), scientific (two-digit exponent at least) otherwise.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e_at = sci.find('e');
  std::string mantissa = sci.substr(0, e_at);
  const int exponent = std::stoi(sci.substr(e_at + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= 16 || exponent < -4) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + e;
  }
  if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

namespace {

void AppendStringRepr(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) < 0xA0) {
      char hex[8];  // U+0080..U+009F, which Python does not count as printable
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(s[i + 1]));
      out += hex;
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
}

void AppendRepr(std::string& out, const Value& v);

void AppendStr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kNone: out += "None"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "True" : "False"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: out += FloatRepr(v.as_float()); return;
    case Value::Kind::kString: out += v.as_string(); return;
    case Value::Kind::kList: {
      out += '[';
      bool first = true;
      for (const auto& e : v.as_list()) {
        if (!first) out += ", ";
        first = false;
        AppendRepr(out, e);
      }
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.as_dict()) {
        if (!first) out += ", ";
        first = false;
        AppendStringRepr(out, k);
        out += ": ";
        AppendRepr(out, e);
      }
      out += '}';
      return;
    }
    case Value::Kind::kNamespace: out += "<Namespace>"; return;
    case Value::Kind::kCallable: out += "<function " + v.callable_name() + ">"; return;
  }
}

void AppendRepr(std::string& out, const Value& v) {
  if (v.is_string()) {
    AppendStringRepr(out, v.as_string());
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else {
    AppendStr(out, v);
  }
}

void AppendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void AppendJson(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
  };
  const char* item_separator = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : FloatRepr(f);
      return;
    }
    case Value::Kind::kString: AppendJsonString(out, v.as_string()); return;
    case Value::Kind::kList: {
      if (v.as_list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& e : v.as_list()) {
        if (!first) out += item_separator;
        first = false;
        newline(depth + 1);
        AppendJson(out, e, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.as_dict().empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.as_dict()) entries.push_back(&entry);
      if (sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      bool first = true;
      for (const auto* entry : entries) {
        if (!first) out += item_separator;
        first = false;
        newline(depth + 1);
        AppendJsonString(out, entry->first);
        out += ": ";
        AppendJson(out, entry->second, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: throw TemplateError("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

std::string Value::Str() const {
  std::string out;
  AppendStr(out, *this);
  return out;
}

std::string Value::Repr() const {
  std::string out;
  AppendRepr(out, *this);
  return out;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict()) {
        const Value* other = b.Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.as_namespace() == &b.as_namespace();
    default: return false;
  }
}

std::string ToJson(const Value& value, int indent, bool sort_keys) {
  std::string out;
  AppendJson(out, value, indent, sort_keys, 0);
  return out;
}

Value CallArgs::Get(size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return fallback;
}

void CallArgs::Expect(size_t max_positional, std::initializer_list<const char*> names) const {
  if (positional.size() > max_positional) {
    throw TemplateError(callee + "() takes at most " + std::to_string(max_positional) + " positional arguments");
  }
  for (const auto& [k, v] : keyword) {
    if (std::none_of(names.begin(), names.end(), [&](const char* n) { return k == n; })) {
      throw TemplateError(callee + "() got an unexpected keyword argument '" + k + "'");
    }
  }
}

}  // namespace hsx::tmpl
