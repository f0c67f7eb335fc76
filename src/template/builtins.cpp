#include "template/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include "template/lexer.h"
#include "template/str_case.h"
#include "util/utf8.h"

namespace hsx::tmpl {
namespace {

[[noreturn]] void TypeError(const std::string& message) { throw TemplateError(message); }

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// Python's str(value) with the undefined check Jinja applies when text is needed.
std::string TextOf(const Value& v) { return v.Str(); }

const std::string& StringArg(const Value& v, const std::string& what) {
  if (!v.is_string()) TypeError(what + " must be a string, not " + v.TypeName());
  return v.as_string();
}

int64_t IntArg(const Value& v, const std::string& what) {
  if (!v.is_int() && !v.is_bool()) TypeError(what + " must be an integer, not " + v.TypeName());
  return v.as_int();
}

// ---- str methods -------------------------------------------------------------------------

bool InChars(char32_t c, const Value& chars) {
  if (chars.is_undefined() || chars.is_none()) return IsPythonSpace(c);
  const std::string& set = StringArg(chars, "strip's argument");
  for (size_t i = 0; i < set.size(); i += Utf8CharLength(set[i])) {
    if (DecodeUtf8At(set, i) == c) return true;
  }
  return false;
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto offsets = CodePointOffsets(s);
  size_t begin = 0;
  size_t end = offsets.size() - 1;
  if (left) {
    while (begin < end && InChars(DecodeUtf8At(s, offsets[begin]), chars)) ++begin;
  }
  if (right) {
    while (end > begin && InChars(DecodeUtf8At(s, offsets[end - 1]), chars)) --end;
  }
  return s.substr(offsets[begin], offsets[end] - offsets[begin]);
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count, Budget& budget) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every character and at the end.
    const auto offsets = CodePointOffsets(s);
    int64_t done = 0;
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i + 1 < offsets.size()) out += s.substr(offsets[i], offsets[i + 1] - offsets[i]);
      budget.CheckSize(out.size());
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    budget.CheckSize(out.size());
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  budget.CheckSize(out.size());
  return out;
}

Value Split(const std::string& s, const Value& sep_value, int64_t maxsplit, Budget& budget) {
  ValueList parts;
  if (sep_value.is_undefined() || sep_value.is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace gives no empty parts.
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsPythonSpace(DecodeUtf8At(s, i))) i += Utf8CharLength(s[i]);
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        std::string rest = s.substr(i);
        parts.push_back(Value(Strip(rest, Value(), false, true)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !IsPythonSpace(DecodeUtf8At(s, j))) j += Utf8CharLength(s[j]);
      parts.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
  } else {
    const std::string& sep = StringArg(sep_value, "split's separator");
    if (sep.empty()) TypeError("split(): empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t hit = s.find(sep, pos);
      if (hit == std::string::npos) break;
      parts.push_back(Value(s.substr(pos, hit - pos)));
      pos = hit + sep.size();
    }
    parts.push_back(Value(s.substr(pos)));
  }
  budget.CheckSize(parts.size());
  return Value(std::move(parts));
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = StringArg(a, prefix ? "startswith's argument" : "endswith's argument");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  }
  return one(affix);
}

Value StringMethod(const std::string& s, const std::string& name, const CallArgs& args, Budget& budget) {
  budget.Charge(static_cast<int64_t>(s.size()));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    args.Expect(1, {});
    return Value(Strip(s, args.Get(0, ""), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    args.Expect(1, {});
    return Value(AffixMatch(s, args.Get(0, ""), name == "startswith"));
  }
  if (name == "split") {
    args.Expect(2, {"sep", "maxsplit"});
    return Split(s, args.Get(0, "sep"), IntArg(args.Get(1, "maxsplit", Value(-1)), "maxsplit"), budget);
  }
  if (name == "upper") return Value(Upper(s));
  if (name == "lower") return Value(Lower(s));
  if (name == "title") return Value(Title(s));
  if (name == "capitalize") return Value(Capitalize(s));
  if (name == "replace") {
    args.Expect(3, {"count"});
    return Value(Replace(s, StringArg(args.Get(0, ""), "replace's first argument"),
                         StringArg(args.Get(1, ""), "replace's second argument"),
                         IntArg(args.Get(2, "count", Value(-1)), "replace's count"), budget));
  }
  if (name == "find") {
    args.Expect(1, {});
    const size_t hit = s.find(StringArg(args.Get(0, ""), "find's argument"));
    return hit == std::string::npos ? Value(-1) : Value(static_cast<int64_t>(CodePointCount(s.substr(0, hit))));
  }
  if (name == "count") {
    args.Expect(1, {});
    const std::string& x = StringArg(args.Get(0, ""), "count's argument");
    if (x.empty()) return Value(static_cast<int64_t>(CodePointCount(s) + 1));
    int64_t n = 0;
    for (size_t pos = s.find(x); pos != std::string::npos; pos = s.find(x, pos + x.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    args.Expect(1, {});
    std::string out;
    bool first = true;
    for (const auto& e : Iterate(args.Get(0, ""))) {
      if (!first) out += s;
      first = false;
      out += StringArg(e, "join's element");
      budget.CheckSize(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha") {
    if (s.empty()) return Value(false);
    for (size_t i = 0; i < s.size(); i += Utf8CharLength(s[i])) {
      const char32_t c = DecodeUtf8At(s, i);
      const bool ok = name == "isdigit" ? (c >= '0' && c <= '9') : name == "isspace" ? IsPythonSpace(c) : ((c | 32) >= 'a' && (c | 32) <= 'z');
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  TypeError("str has no method " + Quoted(name) + " that hsx supports");
}

bool IsStringMethod(const std::string& name) {
  static const char* kNames[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper", "lower", "title",
                                 "capitalize", "replace", "find", "count", "join", "isdigit", "isspace", "isalpha"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; });
}

Value DictMethod(const Value& d, const std::string& name, const CallArgs& args) {
  if (name == "items") {
    args.Expect(0, {});
    ValueList items;
    for (const auto& [k, v] : d.as_dict()) items.push_back(Value(ValueList{Value(k), v}));
    return Value(std::move(items));
  }
  if (name == "keys" || name == "values") {
    args.Expect(0, {});
    ValueList out;
    for (const auto& [k, v] : d.as_dict()) out.push_back(name == "keys" ? Value(k) : v);
    return Value(std::move(out));
  }
  // get(key, default=None)
  args.Expect(2, {});
  const Value key = args.Get(0, "");
  const Value* hit = key.is_string() ? d.Find(key.as_string()) : nullptr;
  return hit ? *hit : args.Get(1, "", Value::None());
}

bool IsDictMethod(const std::string& name) { return name == "items" || name == "keys" || name == "values" || name == "get"; }

// ---- sequences ----------------------------------------------------------------------------

// Python's index normalization; false when out of range.
bool NormalizeIndex(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && i < static_cast<int64_t>(size);
}

std::vector<int64_t> SliceIndices(size_t size, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  const int64_t step = given(step_v) ? IntArg(step_v, "slice step") : 1;
  if (step == 0) TypeError("slice step cannot be zero");
  const auto n = static_cast<int64_t>(size);
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = IntArg(v, "slice index");
    if (i < 0) i = std::max<int64_t>(i + n, step < 0 ? -1 : 0);
    return std::min<int64_t>(i, step < 0 ? n - 1 : n);
  };
  const int64_t start = clamp(start_v, step < 0 ? n - 1 : 0);
  const int64_t stop = clamp(stop_v, step < 0 ? -1 : n);
  std::vector<int64_t> out;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) out.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) out.push_back(i);
  }
  return out;
}

int64_t Length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(CodePointCount(v.as_string()));
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.as_dict().size());
  if (v.is_undefined()) return 0;
  TypeError("object of type " + Quoted(v.TypeName()) + " has no len()");
}

// "a.b" looks up a then b, as Jinja's attribute arguments of filters do.
Value GetPath(const Value& v, const std::string& path, Budget& budget) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits && part.size() < 18 ? GetItem(cur, Value(static_cast<int64_t>(std::stoll(part))), budget) : GetItem(cur, Value(part), budget);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// Python's < for the types templates sort and compare.
bool Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  TypeError("'<' not supported between instances of " + Quoted(a.TypeName()) + " and " + Quoted(b.TypeName()));
}

// Python's integers do not overflow; hsx's 64-bit ones fail instead of wrapping.
[[noreturn]] void Overflow(const char* op) {
  TypeError(std::string("integer overflow in '") + op + "' (hsx's integers are 64-bit)");
}

int64_t CheckedMul(int64_t x, int64_t y, const char* op) {
  int64_t r = 0;
  if (__builtin_mul_overflow(x, y, &r)) Overflow(op);
  return r;
}

Value Repeat(const Value& seq, int64_t times, Budget& budget) {
  if (times <= 0) return seq.is_string() ? Value("") : Value(ValueList{});
  if (seq.is_string()) {
    budget.CheckSize(seq.as_string().size() * static_cast<size_t>(std::min<int64_t>(times, 1 << 30)));
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  budget.CheckSize(seq.as_list().size() * static_cast<size_t>(std::min<int64_t>(times, 1 << 30)));
  ValueList out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value(std::move(out));
}

// ---- filters ----------------------------------------------------------------------------

Value SelectOrReject(const Value& input, const CallArgs& args, bool by_attribute, bool select, Budget& budget) {
  ValueList out;
  const size_t first_test_arg = by_attribute ? 1 : 0;
  std::string attribute;
  if (by_attribute) attribute = StringArg(args.Get(0, ""), "the attribute argument");
  const Value test = args.Get(first_test_arg, "");
  CallArgs test_args;
  test_args.callee = test.is_string() ? test.as_string() : "";
  for (size_t i = first_test_arg + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  for (const auto& e : Iterate(input)) {
    const Value subject = by_attribute ? GetPath(e, attribute, budget) : e;
    const bool passed = test.is_undefined() ? subject.Truthy() : ApplyTest(StringArg(test, "the test name"), subject, test_args);
    if (passed == select) out.push_back(e);
  }
  return Value(std::move(out));
}

// Jinja's do_indent: lines after the first get the indentation (blank ones only with
// `blank`), the first too with `first`.
std::string Indent(const std::string& s, const Value& width_v, bool first, bool blank) {
  const std::string pad = width_v.is_string() ? width_v.as_string()
                                              : std::string(static_cast<size_t>(std::clamp<int64_t>(IntArg(width_v, "indent width"), 0, 1024)), ' ');
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t nl = s.find('\n', pos);
    lines.push_back(s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    pos = nl == std::string::npos ? s.size() : nl + 1;
  }
  if (lines.empty()) lines.emplace_back();  // "" + "\n" splits into one empty line
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (blank || !lines[i].empty() ? pad : "") + lines[i];
  return first ? pad + out : out;
}

}  // namespace

Value GetAttribute(const Value& obj, const std::string& name, Budget& budget) {
  if (!name.empty() && name[0] == '_') return Value();  // the sandbox hides private attributes
  if (obj.is_string() && IsStringMethod(name)) {
    return Value::MakeCallable("str." + name, [s = obj, name, &budget](CallArgs& args) {
      return StringMethod(s.as_string(), name, args, budget);
    });
  }
  if (obj.is_dict() && IsDictMethod(name)) {
    return Value::MakeCallable("dict." + name, [d = obj, name](CallArgs& args) { return DictMethod(d, name, args); });
  }
  if (obj.is_namespace()) {
    const auto& ns = obj.as_namespace();
    auto it = ns.find(name);
    return it == ns.end() ? Value() : it->second;
  }
  if (obj.is_undefined()) TypeError("cannot read attribute " + Quoted(name) + " of an undefined value");
  if (obj.is_dict()) {
    const Value* hit = obj.Find(name);
    if (hit) return *hit;
  }
  return Value();
}

Value GetItem(const Value& obj, const Value& key, Budget& budget) {
  if (obj.is_undefined()) TypeError("cannot index an undefined value");
  if (obj.is_dict() && key.is_string()) {
    const Value* hit = obj.Find(key.as_string());
    if (hit) return *hit;
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) return NormalizeIndex(i, obj.as_list().size()) ? obj.as_list()[static_cast<size_t>(i)] : Value();
    const auto offsets = CodePointOffsets(obj.as_string());
    if (!NormalizeIndex(i, offsets.size() - 1)) return Value();
    const auto at = static_cast<size_t>(i);
    return Value(obj.as_string().substr(offsets[at], offsets[at + 1] - offsets[at]));
  }
  if (key.is_string()) return GetAttribute(obj, key.as_string(), budget);
  return Value();
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step, Budget& budget) {
  if (obj.is_list()) {
    const auto& list = obj.as_list();
    const auto indices = SliceIndices(list.size(), start, stop, step);
    budget.CheckSize(indices.size());
    ValueList out;
    out.reserve(indices.size());
    for (int64_t i : indices) out.push_back(list[static_cast<size_t>(i)]);
    return Value(std::move(out));
  }
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    const auto offsets = CodePointOffsets(s);
    const auto indices = SliceIndices(offsets.size() - 1, start, stop, step);
    budget.CheckSize(s.size());
    std::string out;
    for (int64_t i : indices) {
      const auto at = static_cast<size_t>(i);
      out.append(s, offsets[at], offsets[at + 1] - offsets[at]);
    }
    return Value(std::move(out));
  }
  if (obj.is_undefined()) TypeError("cannot slice an undefined value");
  TypeError(Quoted(obj.TypeName()) + " object is not subscriptable");
}

ValueList Iterate(const Value& v) {
  if (v.is_list()) return v.as_list();
  if (v.is_undefined()) return {};
  if (v.is_dict()) {
    ValueList keys;
    for (const auto& [k, e] : v.as_dict()) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_string()) {
    ValueList chars;
    const std::string& s = v.as_string();
    for (size_t i = 0; i < s.size(); i += Utf8CharLength(s[i])) chars.push_back(Value(s.substr(i, Utf8CharLength(s[i]))));
    return chars;
  }
  TypeError(Quoted(v.TypeName()) + " object is not iterable");
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b, Budget& budget) {
  if (op == "~") {
    std::string out = TextOf(a);
    budget.CheckSize(out.size() + (b.is_string() ? b.as_string().size() : 0));
    out += TextOf(b);
    budget.CheckSize(out.size());
    return Value(std::move(out));
  }
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = numbers && !a.is_float() && !b.is_float();
  if (op == "+") {
    int64_t r = 0;
    if (ints && __builtin_add_overflow(a.as_int(), b.as_int(), &r)) Overflow("+");
    if (ints) return Value(r);
    if (numbers) return Value(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      budget.CheckSize(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      budget.CheckSize(a.as_list().size() + b.as_list().size());
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(out));
    }
  } else if (op == "-") {
    int64_t r = 0;
    if (ints && __builtin_sub_overflow(a.as_int(), b.as_int(), &r)) Overflow("-");
    if (ints) return Value(r);
    if (numbers) return Value(a.as_float() - b.as_float());
  } else if (op == "*") {
    if (ints) return Value(CheckedMul(a.as_int(), b.as_int(), "*"));
    if (numbers) return Value(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return Repeat(a, b.as_int(), budget);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return Repeat(b, a.as_int(), budget);
  } else if (op == "/") {
    if (numbers) {
      if (b.as_float() == 0) TypeError("division by zero");
      return Value(a.as_float() / b.as_float());
    }
  } else if (op == "//" || op == "%") {
    if (numbers) {
      if (b.as_float() == 0) TypeError(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (ints) {
        const int64_t x = a.as_int();
        const int64_t y = b.as_int();
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == "%") return Value(0);
          TypeError("integer overflow in '//'");
        }
        int64_t q = x / y;
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return op == "//" ? Value(q) : Value(r);
      }
      const double x = a.as_float();
      const double y = b.as_float();
      const double r = std::fmod(x, y);
      const double m = (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
      return op == "//" ? Value(std::floor(x / y)) : Value(m);
    }
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {  // by squaring: O(log exponent) steps
      int64_t base = a.as_int(), result = 1;
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if (e & 1) result = CheckedMul(result, base, "**");
        if (e > 1) base = CheckedMul(base, base, "**");
      }
      return Value(result);
    }
    if (numbers) return Value(std::pow(a.as_float(), b.as_float()));
  }
  TypeError("unsupported operand type(s) for " + op + ": " + Quoted(a.TypeName()) + " and " + Quoted(b.TypeName()));
}

bool CompareOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equal(a, b);
  if (op == "!=") return !Equal(a, b);
  if (op == "<") return Less(a, b);
  if (op == ">") return Less(b, a);
  if (op == "<=") return !Less(b, a);
  if (op == ">=") return !Less(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) TypeError("'in <string>' requires string as left operand, not " + a.TypeName());
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_dict()) {
      found = a.is_string() && b.Find(a.as_string()) != nullptr;
    } else if (b.is_list()) {
      found = std::any_of(b.as_list().begin(), b.as_list().end(), [&](const Value& e) { return Equal(e, a); });
    } else if (b.is_namespace()) {
      found = a.is_string() && b.as_namespace().count(a.as_string()) > 0;
    } else if (!b.is_undefined()) {
      TypeError("argument of type " + Quoted(b.TypeName()) + " is not iterable");
    }
    return op == "in" ? found : !found;
  }
  TypeError("unknown comparison " + op);
}

Value ApplyFilter(const std::string& name, const Value& input, const CallArgs& args, Budget& budget) {
  if (input.is_string()) budget.Charge(static_cast<int64_t>(input.as_string().size()));
  if (name == "safe") return input;
  if (name == "trim") {
    args.Expect(1, {"chars"});
    return Value(Strip(TextOf(input), args.Get(0, "chars"), true, true));
  }
  if (name == "length" || name == "count") return Value(Length(input));
  if (name == "upper") return Value(Upper(TextOf(input)));
  if (name == "lower") return Value(Lower(TextOf(input)));
  if (name == "capitalize") return Value(Capitalize(TextOf(input)));
  if (name == "title") return Value(Title(TextOf(input)));
  if (name == "string") return Value(TextOf(input));
  if (name == "tojson") {
    args.Expect(1, {"indent", "ensure_ascii", "sort_keys", "separators"});
    const Value indent = args.Get(0, "indent");
    const Value ascii = args.Get(99, "ensure_ascii", Value(false));
    if (ascii.Truthy()) TypeError("tojson(ensure_ascii=True) is not supported");
    if (!args.Get(99, "separators").is_undefined() && !args.Get(99, "separators").is_none()) TypeError("tojson(separators=...) is not supported");
    const int width = indent.is_undefined() || indent.is_none() ? -1 : static_cast<int>(std::clamp<int64_t>(IntArg(indent, "tojson's indent"), 0, 64));
    std::string out = ToJson(input, width, args.Get(99, "sort_keys", Value(false)).Truthy());
    budget.CheckSize(out.size());
    return Value(std::move(out));
  }
  if (name == "default" || name == "d") {
    args.Expect(2, {"default_value", "boolean"});
    const bool boolean = args.Get(1, "boolean", Value(false)).Truthy();
    if (input.is_undefined() || (boolean && !input.Truthy())) return args.Get(0, "default_value", Value(""));
    return input;
  }
  if (name == "first" || name == "last") {
    const ValueList items = Iterate(input);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    args.Expect(2, {"d", "attribute"});
    const std::string sep = TextOf(args.Get(0, "d", Value("")));
    const Value attribute = args.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& e : Iterate(input)) {
      if (!first) out += sep;
      first = false;
      out += TextOf(attribute.is_undefined() ? e : GetPath(e, TextOf(attribute), budget));
      budget.CheckSize(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    args.Expect(3, {"old", "new", "count"});
    const Value count = args.Get(2, "count");
    return Value(Replace(TextOf(input), TextOf(args.Get(0, "old")), TextOf(args.Get(1, "new")),
                         count.is_undefined() || count.is_none() ? -1 : IntArg(count, "replace's count"), budget));
  }
  if (name == "selectattr" || name == "rejectattr") return SelectOrReject(input, args, true, name == "selectattr", budget);
  if (name == "select" || name == "reject") return SelectOrReject(input, args, false, name == "select", budget);
  if (name == "map") {
    ValueList out;
    const Value attribute = args.Get(99, "attribute");
    CallArgs rest;
    rest.callee = args.positional.empty() ? "map" : TextOf(args.positional[0]);
    for (size_t i = 1; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
    for (const auto& e : Iterate(input)) {
      if (!attribute.is_undefined()) {
        Value v = GetPath(e, TextOf(attribute), budget);
        out.push_back(v.is_undefined() ? args.Get(99, "default") : v);
      } else {
        if (args.positional.empty()) TypeError("map() needs a filter name or attribute=");
        out.push_back(ApplyFilter(rest.callee, e, rest, budget));
      }
    }
    return Value(std::move(out));
  }
  if (name == "items") {
    if (input.is_undefined()) return Value(ValueList{});
    if (!input.is_dict()) TypeError("items filter needs a mapping, not " + input.TypeName());
    CallArgs none;
    return DictMethod(input, "items", none);
  }
  if (name == "list") return Value(Iterate(input));
  if (name == "reverse") {
    if (input.is_string()) return GetSlice(input, Value(), Value(), Value(-1), budget);
    ValueList items = Iterate(input);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "unique") {
    ValueList out;
    for (const auto& e : Iterate(input)) {
      budget.Charge(static_cast<int64_t>(out.size()));
      if (std::none_of(out.begin(), out.end(), [&](const Value& x) { return Equal(x, e); })) out.push_back(e);
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    args.Expect(3, {"reverse", "case_sensitive", "attribute"});
    ValueList items = Iterate(input);
    const Value attribute = args.Get(2, "attribute");
    auto key = [&](const Value& v) { return attribute.is_undefined() ? v : GetPath(v, TextOf(attribute), budget); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return Less(key(x), key(y)); });
    if (args.Get(0, "reverse", Value(false)).Truthy()) std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "int") {
    if (input.is_number()) return Value(input.is_float() ? static_cast<int64_t>(input.as_float()) : input.as_int());
    if (input.is_string()) {
      try {
        size_t used = 0;
        const std::string t = Strip(input.as_string(), Value(), true, true);
        const int64_t v = std::stoll(t, &used);
        if (used == t.size()) return Value(v);
      } catch (const std::exception&) {
      }
    }
    return args.Get(0, "default", Value(0));
  }
  if (name == "float") {
    if (input.is_number()) return Value(input.as_float());
    if (input.is_string()) {
      try {
        size_t used = 0;
        const double v = std::stod(input.as_string(), &used);
        if (used == input.as_string().size()) return Value(v);
      } catch (const std::exception&) {
      }
    }
    return args.Get(0, "default", Value(0.0));
  }
  if (name == "abs") {
    if (input.is_int() || input.is_bool()) {
      const int64_t v = input.as_int();
      if (v == std::numeric_limits<int64_t>::min()) Overflow("abs");
      return Value(v < 0 ? -v : v);
    }
    if (input.is_float()) return Value(std::fabs(input.as_float()));
    TypeError("bad operand type for abs(): " + Quoted(input.TypeName()));
  }
  if (name == "indent") {
    args.Expect(3, {"width", "first", "blank"});
    std::string out = Indent(TextOf(input), args.Get(0, "width", Value(4)), args.Get(1, "first", Value(false)).Truthy(),
                             args.Get(2, "blank", Value(false)).Truthy());
    budget.CheckSize(out.size());
    return Value(std::move(out));
  }
  TypeError("no filter named " + Quoted(name));
}

bool ApplyTest(const std::string& name, const Value& input, const CallArgs& args) {
  const Value arg = args.Get(0, "");
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.as_bool();
  if (name == "false") return input.is_bool() && !input.as_bool();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "number") return input.is_number();
  if (name == "string") return input.is_string();
  if (name == "mapping") return input.is_dict();
  if (name == "sequence") return input.is_string() || input.is_list() || input.is_dict();
  if (name == "iterable") return input.is_string() || input.is_list() || input.is_dict() || input.is_undefined();
  if (name == "callable") return input.is_callable();
  if (name == "odd" || name == "even") return (IntArg(input, name + " test's value") % 2 != 0) == (name == "odd");
  if (name == "divisibleby") {
    const int64_t d = IntArg(arg, "divisibleby's argument");
    if (d == 0) TypeError("divisibleby 0");
    return IntArg(input, "divisibleby's value") % d == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return Equal(input, arg);
  if (name == "ne" || name == "!=") return !Equal(input, arg);
  if (name == "lt" || name == "lessthan" || name == "<") return CompareOp("<", input, arg);
  if (name == "le" || name == "<=") return CompareOp("<=", input, arg);
  if (name == "gt" || name == "greaterthan" || name == ">") return CompareOp(">", input, arg);
  if (name == "ge" || name == ">=") return CompareOp(">=", input, arg);
  if (name == "in") return CompareOp("in", input, arg);
  if (name == "lower") return input.is_string() && Lower(input.as_string()) == input.as_string();
  if (name == "upper") return input.is_string() && Upper(input.as_string()) == input.as_string();
  TypeError("no test named " + Quoted(name));
}

ValueDict Globals(Budget& budget) {
  ValueDict globals;
  globals.emplace_back("range", Value::MakeCallable("range", [&budget](CallArgs& args) {
    args.Expect(3, {});
    if (args.positional.empty()) TypeError("range expected at least 1 argument");
    int64_t start = 0;
    int64_t stop = 0;
    int64_t step = 1;
    if (args.positional.size() == 1) {
      stop = IntArg(args.positional[0], "range's argument");
    } else {
      start = IntArg(args.positional[0], "range's start");
      stop = IntArg(args.positional[1], "range's stop");
      if (args.positional.size() == 3) step = IntArg(args.positional[2], "range's step");
    }
    if (step == 0) TypeError("range() arg 3 must not be zero");
    // The element count; long double holds any int64 span exactly enough to compare with the bound.
    const long double span = step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
    const long double count = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
    budget.CheckSize(count > static_cast<long double>(budget.limits().max_output_bytes) ? SIZE_MAX : static_cast<size_t>(count));
    ValueList out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.push_back(Value(start + i * step));
    return Value(std::move(out));
  }));
  globals.emplace_back("namespace", Value::MakeCallable("namespace", [](CallArgs& args) {
    Namespace ns;
    for (const auto& p : args.positional) {
      if (!p.is_dict()) TypeError("namespace() takes keyword arguments or a dict");
      for (const auto& [k, v] : p.as_dict()) ns[k] = v;
    }
    for (const auto& [k, v] : args.keyword) ns[k] = v;
    return Value::MakeNamespace(std::move(ns));
  }));
  globals.emplace_back("dict", Value::MakeCallable("dict", [](CallArgs& args) {
    ValueDict d;
    auto put = [&](const std::string& k, const Value& v) {
      for (auto& entry : d) {
        if (entry.first == k) {
          entry.second = v;
          return;
        }
      }
      d.emplace_back(k, v);
    };
    for (const auto& p : args.positional) {
      if (!p.is_dict()) TypeError("dict() takes keyword arguments or a dict");
      for (const auto& [k, v] : p.as_dict()) put(k, v);
    }
    for (const auto& [k, v] : args.keyword) put(k, v);
    return Value(std::move(d));
  }));
  globals.emplace_back("raise_exception", Value::MakeCallable("raise_exception", [](CallArgs& args) -> Value {
    throw TemplateError(TextOf(args.Get(0, "message")));
  }));
  globals.emplace_back("strftime_now", Value::MakeCallable("strftime_now", [](CallArgs& args) {
    const std::string format = StringArg(args.Get(0, "format"), "strftime_now's format");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = format.size() < 128 ? std::strftime(buf, sizeof buf, format.c_str(), &local) : 0;
    if (n == 0 && !format.empty()) TypeError("strftime_now's format is too long or gives nothing");
    return Value(std::string(buf, n));
  }));
  return globals;
}

}  // namespace hsx::tmpl
