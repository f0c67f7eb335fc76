#include "template/template.h"

#include <unordered_map>

#include "template/builtins.h"
#include "template/parser.h"

namespace hsx::tmpl {
namespace {

// Render recursion (statements inside statements, expressions inside expressions, macros
// calling macros) deeper than this fails: each level is a C++ stack frame.
constexpr int kMaxRenderDepth = 400;

Status ToStatus(const TemplateError& e) {
  return Error(e.line > 0 ? "line " + std::to_string(e.line) + ": " + e.what() : std::string(e.what()));
}

// What an expression names, for "... is undefined" errors.
std::string Describe(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kName: return e.name;
    case Expr::Kind::kAttribute: return Describe(*e.items[0]) + "." + e.name;
    case Expr::Kind::kItem:
      if (e.items[1]->kind == Expr::Kind::kLiteral) return Describe(*e.items[0]) + "[" + e.items[1]->value.Repr() + "]";
      return Describe(*e.items[0]) + "[...]";
    default: return "the value";
  }
}

class Renderer {
 public:
  Renderer(const ValueDict& variables, const RenderLimits& limits) : budget_(limits) {
    Frame globals;
    for (auto& [name, value] : Globals(budget_)) globals[name] = value;
    for (const auto& [name, value] : variables) globals[name] = value;
    frames_.push_back(std::move(globals));
    frames_.emplace_back();  // the template's own top-level variables
  }

  std::string Run(const Body& body) {
    std::string out;
    if (Exec(body, out) != Flow::kNormal) throw TemplateError("break or continue outside a loop");
    return out;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow { kNormal, kBreak, kContinue };

  struct Depth {
    explicit Depth(Renderer& r, int line) : r(r) {
      if (++r.depth_ > kMaxRenderDepth) throw TemplateError("template recurses deeper than " + std::to_string(kMaxRenderDepth) + " levels", line);
    }
    ~Depth() { --r.depth_; }
    Renderer& r;
  };

  void Append(std::string& out, const std::string& text) {
    budget_.Charge(static_cast<int64_t>(text.size()));
    if (out.size() + text.size() > budget_.limits().max_output_bytes) {
      throw TemplateError("template output exceeds " + std::to_string(budget_.limits().max_output_bytes) + " bytes");
    }
    out += text;
  }

  Flow Exec(const Body& body, std::string& out) {
    for (const auto& node : body) {
      const Flow flow = ExecNode(*node, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow ExecNode(const Node& node, std::string& out) {
    Depth depth(*this, node.line);
    budget_.Charge(1);
    try {
      switch (node.kind) {
        case Node::Kind::kText: Append(out, node.text); return Flow::kNormal;
        case Node::Kind::kPrint: Append(out, Eval(*node.expr).Str()); return Flow::kNormal;
        case Node::Kind::kIf:
          for (size_t i = 0; i < node.conditions.size(); ++i) {
            if (Eval(*node.conditions[i]).Truthy()) return Exec(node.bodies[i], out);
          }
          if (node.bodies.size() > node.conditions.size()) return Exec(node.bodies.back(), out);
          return Flow::kNormal;
        case Node::Kind::kFor: ExecFor(node, out); return Flow::kNormal;
        case Node::Kind::kSet: ExecSet(node); return Flow::kNormal;
        case Node::Kind::kMacro:
          frames_.back()[node.text] = Value::MakeCallable(node.text, [this, &node](CallArgs& args) { return CallMacro(node, args); });
          return Flow::kNormal;
        case Node::Kind::kBreak: return Flow::kBreak;
        case Node::Kind::kContinue: return Flow::kContinue;
        case Node::Kind::kScope: return Exec(node.bodies[0], out);
      }
    } catch (TemplateError& e) {
      if (e.line == 0) e.line = node.line;
      throw;
    }
    return Flow::kNormal;
  }

  void Bind(Frame& frame, const std::vector<std::string>& targets, const Value& value) {
    if (targets.size() == 1) {
      frame[targets[0]] = value;
      return;
    }
    const ValueList items = Iterate(value);
    if (items.size() != targets.size()) {
      throw TemplateError("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) frame[targets[i]] = items[i];
  }

  void ExecFor(const Node& node, std::string& out) {
    ValueList items = Iterate(Eval(*node.expr));
    budget_.Charge(static_cast<int64_t>(items.size()));
    if (node.condition) {
      ValueList kept;
      for (const auto& item : items) {
        frames_.emplace_back();
        Bind(frames_.back(), node.targets, item);
        const bool keep = Eval(*node.condition).Truthy();
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++loop_iterations_ > budget_.limits().max_loop_iterations) {
        throw TemplateError("template runs more than " + std::to_string(budget_.limits().max_loop_iterations) + " loop iterations");
      }
      const auto at = static_cast<size_t>(i);
      ValueDict loop = {{"index", Value(i + 1)},      {"index0", Value(i)},       {"revindex", Value(n - i)},
                        {"revindex0", Value(n - i - 1)}, {"first", Value(i == 0)}, {"last", Value(i == n - 1)},
                        {"length", Value(n)},         {"depth", Value(1)},        {"depth0", Value(0)}};
      if (i > 0) loop.emplace_back("previtem", items[at - 1]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[at + 1]);
      loop.emplace_back("cycle", Value::MakeCallable("loop.cycle", [i](CallArgs& args) {
        if (args.positional.empty()) throw TemplateError("loop.cycle() needs at least one value");
        return args.positional[static_cast<size_t>(i) % args.positional.size()];
      }));
      frames_.emplace_back();
      frames_.back()["loop"] = Value(std::move(loop));
      Bind(frames_.back(), node.targets, items[at]);
      Flow flow = Flow::kNormal;
      try {
        flow = Exec(node.bodies[0], out);
      } catch (...) {
        frames_.pop_back();
        throw;
      }
      frames_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && node.bodies.size() > 1) {
      if (Exec(node.bodies[1], out) != Flow::kNormal) throw TemplateError("break or continue outside a loop", node.line);
    }
  }

  void ExecSet(const Node& node) {
    Value value;
    if (node.expr) {
      value = Eval(*node.expr);
    } else {
      std::string captured;
      if (Exec(node.bodies[0], captured) != Flow::kNormal) throw TemplateError("break or continue inside a set block");
      value = Value(std::move(captured));
    }
    if (!node.attribute_of.empty()) {
      const Value target = Lookup(node.attribute_of);
      if (!target.is_namespace()) {
        throw TemplateError("cannot assign attribute on non-namespace object '" + node.attribute_of + "'");
      }
      target.as_namespace()[node.targets[0]] = value;
      return;
    }
    Bind(frames_.back(), node.targets, value);
  }

  Value CallMacro(const Node& macro, CallArgs& args) {
    if (++call_depth_ > budget_.limits().max_call_depth) {
      --call_depth_;
      throw TemplateError("macro calls nest deeper than " + std::to_string(budget_.limits().max_call_depth));
    }
    // A macro sees the template's globals and top-level variables and its parameters,
    // not its caller's locals.
    std::vector<Frame> caller_frames(std::make_move_iterator(frames_.begin() + 2), std::make_move_iterator(frames_.end()));
    frames_.resize(2);
    frames_.emplace_back();
    std::string out;
    try {
      if (args.positional.size() > macro.targets.size()) {
        throw TemplateError("macro '" + macro.text + "' takes " + std::to_string(macro.targets.size()) + " arguments");
      }
      for (const auto& [k, v] : args.keyword) {
        if (std::find(macro.targets.begin(), macro.targets.end(), k) == macro.targets.end()) {
          throw TemplateError("macro '" + macro.text + "' has no parameter '" + k + "'");
        }
      }
      for (size_t i = 0; i < macro.targets.size(); ++i) {
        Value v = args.Get(i, macro.targets[i]);
        if (v.is_undefined() && macro.defaults[i]) v = Eval(*macro.defaults[i]);
        frames_.back()[macro.targets[i]] = v;
      }
      if (Exec(macro.bodies[0], out) != Flow::kNormal) throw TemplateError("break or continue outside a loop", macro.line);
    } catch (...) {
      frames_.resize(2);
      for (auto& f : caller_frames) frames_.push_back(std::move(f));
      --call_depth_;
      throw;
    }
    frames_.resize(2);
    for (auto& f : caller_frames) frames_.push_back(std::move(f));
    --call_depth_;
    return Value(std::move(out));
  }

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto hit = it->find(name);
      if (hit != it->end()) return hit->second;
    }
    return Value();
  }

  CallArgs EvalArgs(const Expr& e, size_t first, std::string callee) {
    CallArgs args;
    args.callee = std::move(callee);
    for (size_t i = first; i < e.items.size(); ++i) args.positional.push_back(Eval(*e.items[i]));
    for (const auto& [k, v] : e.keywords) args.keyword.emplace_back(k, Eval(*v));
    return args;
  }

  Value Eval(const Expr& e) {
    Depth depth(*this, e.line);
    budget_.Charge(1);
    try {
      return EvalUnchecked(e);
    } catch (TemplateError& error) {
      if (error.line == 0) error.line = e.line;
      throw;
    }
  }

  Value EvalUnchecked(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& item : e.items) items.push_back(Eval(*item));
        return Value(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict dict;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value key = Eval(*e.items[i]);
          if (!key.is_string()) throw TemplateError("dict keys must be strings here, not " + key.TypeName());
          Value value = Eval(*e.items[i + 1]);
          auto existing = std::find_if(dict.begin(), dict.end(), [&](const auto& p) { return p.first == key.as_string(); });
          if (existing != dict.end()) existing->second = std::move(value);
          else dict.emplace_back(key.as_string(), std::move(value));
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::kAttribute: {
        const Value obj = Eval(*e.items[0]);
        if (obj.is_undefined()) throw TemplateError("'" + Describe(*e.items[0]) + "' is undefined (reading ." + e.name + ")");
        return GetAttribute(obj, e.name, budget_);
      }
      case Expr::Kind::kItem: {
        const Value obj = Eval(*e.items[0]);
        if (obj.is_undefined()) throw TemplateError("'" + Describe(*e.items[0]) + "' is undefined (indexing it)");
        return GetItem(obj, Eval(*e.items[1]), budget_);
      }
      case Expr::Kind::kSlice: {
        const Value obj = Eval(*e.items[0]);
        auto part = [&](size_t i) { return e.items[i] ? Eval(*e.items[i]) : Value(); };
        return GetSlice(obj, part(1), part(2), part(3), budget_);
      }
      case Expr::Kind::kCall: {
        const Value callee = Eval(*e.items[0]);
        if (!callee.is_callable()) {
          throw TemplateError("'" + Describe(*e.items[0]) + "' is " + (callee.is_undefined() ? "undefined" : "not callable"));
        }
        CallArgs args = EvalArgs(e, 1, callee.callable_name());
        return callee.as_callable()(args);
      }
      case Expr::Kind::kFilter: {
        const Value input = Eval(*e.items[0]);
        return ApplyFilter(e.name, input, EvalArgs(e, 1, e.name), budget_);
      }
      case Expr::Kind::kTest: {
        const Value input = Eval(*e.items[0]);
        return Value(ApplyTest(e.name, input, EvalArgs(e, 1, e.name)) != e.negated);
      }
      case Expr::Kind::kNot: return Value(!Eval(*e.items[0]).Truthy());
      case Expr::Kind::kNegate:
      case Expr::Kind::kPlus: {
        const Value v = Eval(*e.items[0]);
        if (!v.is_number()) throw TemplateError("bad operand type for unary " + std::string(e.kind == Expr::Kind::kNegate ? "-" : "+") + ": '" + v.TypeName() + "'");
        if (e.kind == Expr::Kind::kPlus) return v.is_bool() ? Value(v.as_int()) : v;
        if (v.is_float()) return Value(-v.as_float());
        return BinaryOp("-", Value(0), v, budget_);
      }
      case Expr::Kind::kBinary: {
        const Value a = Eval(*e.items[0]);
        return BinaryOp(e.name, a, Eval(*e.items[1]), budget_);
      }
      case Expr::Kind::kAnd: {
        Value a = Eval(*e.items[0]);
        return a.Truthy() ? Eval(*e.items[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = Eval(*e.items[0]);
        return a.Truthy() ? a : Eval(*e.items[1]);
      }
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.items[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.items[i + 1]);
          if (!CompareOp(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondition:
        if (Eval(*e.items[0]).Truthy()) return Eval(*e.items[1]);
        return e.items[2] ? Eval(*e.items[2]) : Value();
    }
    return Value();
  }

  Budget budget_;
  std::vector<Frame> frames_;
  int depth_ = 0;
  int call_depth_ = 0;
  int64_t loop_iterations_ = 0;
};

}  // namespace

Result<Template> Template::Parse(std::string_view source) {
  try {
    Template t;
    t.body_ = std::make_shared<const Body>(tmpl::Parse(source));
    return t;
  } catch (const TemplateError& e) {
    return ToStatus(e);
  } catch (const std::exception& e) {  // a library error on odd input must fail one template, not the process
    return Error(std::string("template could not be parsed: ") + e.what());
  }
}

Result<std::string> Template::Render(const ValueDict& variables, const RenderLimits& limits) const {
  try {
    return Renderer(variables, limits).Run(*body_);
  } catch (const TemplateError& e) {
    return ToStatus(e);
  } catch (const std::bad_alloc&) {
    return Error("template rendering ran out of memory");
  } catch (const std::exception& e) {
    return Error(std::string("template rendering failed: ") + e.what());
  }
}

}  // namespace hsx::tmpl
