#include "template/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "template/lexer.h"

namespace hsx::tmpl {
namespace {

using TK = Token::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseTemplate() {
    std::string end;
    Body body = ParseBody({}, &end);
    return body;
  }

 private:
  // RAII guard for the nesting bound.
  struct Depth {
    explicit Depth(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth) throw TemplateError("template nests deeper than " + std::to_string(kMaxParseDepth) + " levels", p.Peek().line);
    }
    ~Depth() { --p.depth_; }
    Parser& p;
  };

  const Token& Peek(size_t ahead = 0) const {
    const size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const { return Peek(ahead).kind == TK::kOperator && Peek(ahead).text == op; }
  bool IsName(const char* name, size_t ahead = 0) const { return Peek(ahead).kind == TK::kName && Peek(ahead).text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  [[noreturn]] void Fail(const std::string& what) const { throw TemplateError(what, Peek().line); }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TK::kEnd: return "end of template";
      case TK::kBlockEnd: return "'%}'";
      case TK::kVariableEnd: return "'}}'";
      case TK::kText: return "text";
      case TK::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', found " + Describe(Peek()));
  }
  std::string ExpectName() {
    if (Peek().kind != TK::kName) Fail("expected a name, found " + Describe(Peek()));
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Peek().kind != TK::kBlockEnd) Fail("expected '%}', found " + Describe(Peek()));
    Next();
  }

  // Nodes up to a {% tag %} named in `ends` (consumed up to the tag's name; its name in
  // *end), or the end of the template when `ends` is empty.
  Body ParseBody(std::initializer_list<const char*> ends, std::string* end) {
    Depth depth(*this);
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == TK::kEnd) {
        if (ends.size() == 0) return body;
        Fail(std::string("template ended inside a block; expected {% ") + *ends.begin() + " %}");
      }
      if (t.kind == TK::kText) {
        auto node = std::make_unique<Node>(Node{Node::Kind::kText, t.line});
        node->text = t.text;
        body.push_back(std::move(node));
        Next();
      } else if (t.kind == TK::kVariableBegin) {
        Next();
        auto node = std::make_unique<Node>(Node{Node::Kind::kPrint, t.line});
        node->expr = ParseTuple(true);
        if (Peek().kind != TK::kVariableEnd) Fail("expected '}}', found " + Describe(Peek()));
        Next();
        body.push_back(std::move(node));
      } else if (t.kind == TK::kBlockBegin) {
        Next();
        const std::string tag = Peek().kind == TK::kName ? Peek().text : "";
        for (const char* e : ends) {
          if (tag == e) {
            Next();
            *end = tag;
            return body;
          }
        }
        body.push_back(ParseStatement());
      } else {
        Fail("unexpected " + Describe(t));
      }
    }
  }

  std::unique_ptr<Node> ParseStatement() {
    const int line = Peek().line;
    const std::string tag = ExpectName();
    auto node = std::make_unique<Node>();
    node->line = line;
    std::string end;
    if (tag == "if") {
      node->kind = Node::Kind::kIf;
      node->conditions.push_back(ParseTuple(false));
      ExpectBlockEnd();
      while (true) {
        node->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          node->conditions.push_back(ParseTuple(false));
          ExpectBlockEnd();
        } else if (end == "else") {
          ExpectBlockEnd();
          node->bodies.push_back(ParseBody({"endif"}, &end));
          break;
        } else {
          break;
        }
      }
    } else if (tag == "for") {
      node->kind = Node::Kind::kFor;
      do {
        node->targets.push_back(ExpectName());
      } while (SkipOp(","));
      if (!SkipName("in")) Fail("expected 'in' in a for loop, found " + Describe(Peek()));
      node->expr = ParseTuple(false, /*stop_at_if=*/true);
      if (SkipName("if")) node->condition = ParseExpression(false);
      if (IsName("recursive")) Fail("recursive for loops are not supported");
      ExpectBlockEnd();
      node->bodies.push_back(ParseBody({"else", "endfor"}, &end));
      if (end == "else") {
        ExpectBlockEnd();
        node->bodies.push_back(ParseBody({"endfor"}, &end));
      }
    } else if (tag == "set") {
      node->kind = Node::Kind::kSet;
      std::string first = ExpectName();
      if (SkipOp(".")) {
        node->attribute_of = first;
        node->targets.push_back(ExpectName());
      } else {
        node->targets.push_back(first);
        while (SkipOp(",")) node->targets.push_back(ExpectName());
      }
      if (SkipOp("=")) {
        node->expr = ParseTuple(true);
      } else {
        if (node->targets.size() != 1 || !node->attribute_of.empty()) Fail("a block set assigns one name");
        ExpectBlockEnd();
        node->bodies.push_back(ParseBody({"endset"}, &end));
      }
    } else if (tag == "macro") {
      node->kind = Node::Kind::kMacro;
      node->text = ExpectName();
      ExpectOp("(");
      while (!SkipOp(")")) {
        if (!node->targets.empty()) ExpectOp(",");
        if (SkipOp(")")) break;
        node->targets.push_back(ExpectName());
        node->defaults.push_back(SkipOp("=") ? ParseExpression(true) : nullptr);
      }
      ExpectBlockEnd();
      node->bodies.push_back(ParseBody({"endmacro"}, &end));
    } else if (tag == "break" || tag == "continue") {
      node->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    } else if (tag == "generation") {
      node->kind = Node::Kind::kScope;
      ExpectBlockEnd();
      node->bodies.push_back(ParseBody({"endgeneration"}, &end));
    } else {
      throw TemplateError("unknown or unexpected tag '" + tag + "'", line);
    }
    ExpectBlockEnd();
    return node;
  }

  // Records the finished node's height; operator chains (a + a + ... + a) nest without
  // recursing in the parser, so this is where their depth is bounded.
  ExprPtr Seal(ExprPtr e) {
    for (const auto& item : e->items) {
      if (item) e->height = std::max(e->height, item->height + 1);
    }
    for (const auto& [k, item] : e->keywords) e->height = std::max(e->height, item->height + 1);
    if (e->height > kMaxParseDepth) throw TemplateError("expression nests deeper than " + std::to_string(kMaxParseDepth) + " levels", e->line);
    return e;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Comma-separated expressions make a tuple (`{% set a, b = x %}`, `{% for x in a, b %}`).
  ExprPtr ParseTuple(bool with_condition, bool stop_at_if = false) {
    const int line = Peek().line;
    auto first = ParseExpression(with_condition && !stop_at_if);
    if (!IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple, line);
    tuple->items.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Peek().kind == TK::kBlockEnd || Peek().kind == TK::kVariableEnd || IsName("if")) break;
      tuple->items.push_back(ParseExpression(with_condition && !stop_at_if));
    }
    return Seal(std::move(tuple));
  }

  ExprPtr ParseExpression(bool with_condition) {
    Depth depth(*this);
    auto expr = ParseOr();
    if (!with_condition) return expr;
    while (IsName("if")) {
      const int line = Next().line;
      auto cond = Make(Expr::Kind::kCondition, line);
      cond->items.push_back(ParseOr());
      cond->items.push_back(std::move(expr));
      cond->items.push_back(SkipName("else") ? ParseExpression(true) : nullptr);
      expr = Seal(std::move(cond));
    }
    return expr;
  }

  ExprPtr ParseOr() {
    auto left = ParseAnd();
    while (IsName("or")) {
      auto e = Make(Expr::Kind::kOr, Next().line);
      e->items.push_back(std::move(left));
      e->items.push_back(ParseAnd());
      left = Seal(std::move(e));
    }
    return left;
  }

  ExprPtr ParseAnd() {
    auto left = ParseNot();
    while (IsName("and")) {
      auto e = Make(Expr::Kind::kAnd, Next().line);
      e->items.push_back(std::move(left));
      e->items.push_back(ParseNot());
      left = Seal(std::move(e));
    }
    return left;
  }

  ExprPtr ParseNot() {
    Depth depth(*this);
    if (IsName("not")) {
      auto e = Make(Expr::Kind::kNot, Next().line);
      e->items.push_back(ParseNot());
      return Seal(std::move(e));
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = Peek().line;
    auto first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Peek().kind == TK::kOperator && (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
                                           Peek().text == ">" || Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, line);
        cmp->items.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(ParseMath1());
      if (cmp->items.size() > kMaxParseDepth) Fail("comparison chain is too long");
    }
    return cmp ? Seal(std::move(cmp)) : std::move(first);
  }

  ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = Make(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return Seal(std::move(e));
  }

  ExprPtr ParseMath1() {
    auto left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = Next();
      left = Binary(t.text, std::move(left), ParseConcat(), t.line);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    auto left = ParseMath2();
    while (IsOp("~")) {
      const int line = Next().line;
      left = Binary("~", std::move(left), ParseMath2(), line);
    }
    return left;
  }

  ExprPtr ParseMath2() {
    auto left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = Next();
      left = Binary(t.text, std::move(left), ParsePow(), t.line);
    }
    return left;
  }

  ExprPtr ParsePow() {
    auto left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Next().line;
      left = Binary("**", std::move(left), ParseUnary(true), line);
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    Depth depth(*this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      node = Make(t.text == "-" ? Expr::Kind::kNegate : Expr::Kind::kPlus, t.line);
      node->items.push_back(ParseUnary(false));
      node = Seal(std::move(node));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterChain(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    Depth depth(*this);
    const Token& t = Peek();
    const int line = t.line;
    if (t.kind == TK::kName) {
      Next();
      if (t.text == "true" || t.text == "True") return Literal(Value(true), line);
      if (t.text == "false" || t.text == "False") return Literal(Value(false), line);
      if (t.text == "none" || t.text == "None") return Literal(Value::None(), line);
      auto e = Make(Expr::Kind::kName, line);
      e->name = t.text;
      return e;
    }
    if (t.kind == TK::kString) {
      std::string s;
      while (Peek().kind == TK::kString) s += Next().text;  // adjacent literals join, as in Python
      return Literal(Value(std::move(s)), line);
    }
    if (t.kind == TK::kInt) {
      int64_t v = 0;
      const std::string& text = Next().text;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || p != text.data() + text.size()) throw TemplateError("integer literal " + text + " is out of range", line);
      return Literal(Value(v), line);
    }
    if (t.kind == TK::kFloat) return Literal(Value(std::strtod(Next().text.c_str(), nullptr)), line);
    if (SkipOp("(")) {
      if (SkipOp(")")) return Make(Expr::Kind::kTuple, line);
      auto inner = ParseExpression(true);
      if (IsOp(",")) {
        auto tuple = Make(Expr::Kind::kTuple, line);
        tuple->items.push_back(std::move(inner));
        while (SkipOp(",")) {
          if (IsOp(")")) break;
          tuple->items.push_back(ParseExpression(true));
        }
        inner = Seal(std::move(tuple));
      }
      ExpectOp(")");
      return inner;
    }
    if (SkipOp("[")) {
      auto list = Make(Expr::Kind::kList, line);
      while (!SkipOp("]")) {
        if (!list->items.empty()) ExpectOp(",");
        if (SkipOp("]")) break;
        list->items.push_back(ParseExpression(true));
      }
      return Seal(std::move(list));
    }
    if (SkipOp("{")) {
      auto dict = Make(Expr::Kind::kDict, line);
      while (!SkipOp("}")) {
        if (!dict->items.empty()) ExpectOp(",");
        if (SkipOp("}")) break;
        dict->items.push_back(ParseExpression(true));
        ExpectOp(":");
        dict->items.push_back(ParseExpression(true));
      }
      return Seal(std::move(dict));
    }
    Fail("expected an expression, found " + Describe(t));
  }

  ExprPtr Literal(Value v, int line) {
    auto e = Make(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      const int line = Peek().line;
      if (SkipOp(".")) {
        if (Peek().kind == TK::kInt) {
          auto e = Make(Expr::Kind::kItem, line);
          e->items.push_back(std::move(node));
          e->items.push_back(ParsePrimary());
          node = Seal(std::move(e));
        } else {
          auto e = Make(Expr::Kind::kAttribute, line);
          e->name = ExpectName();
          e->items.push_back(std::move(node));
          node = Seal(std::move(e));
        }
      } else if (SkipOp("[")) {
        node = ParseSubscript(std::move(node), line);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        slice = true;
        if (++part > 2) Fail("a slice has at most three parts");
        continue;
      }
      if (parts[part]) Fail("expected ']' or ':', found " + Describe(Peek()));
      parts[part] = ParseExpression(true);
    }
    Next();
    if (!slice) {
      if (!parts[0]) Fail("empty subscript");
      auto e = Make(Expr::Kind::kItem, line);
      e->items.push_back(std::move(target));
      e->items.push_back(std::move(parts[0]));
      return Seal(std::move(e));
    }
    auto e = Make(Expr::Kind::kSlice, line);
    e->items.push_back(std::move(target));
    for (auto& p : parts) e->items.push_back(std::move(p));
    return Seal(std::move(e));
  }

  // Arguments in parentheses into `call` (items after its first, keywords).
  void ParseArguments(Expr& call) {
    ExpectOp("(");
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (SkipOp(")")) break;
      if (Peek().kind == TK::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        call.keywords.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!call.keywords.empty()) Fail("positional argument after a keyword argument");
        call.items.push_back(ParseExpression(true));
      }
    }
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto e = Make(Expr::Kind::kCall, Peek().line);
    e->items.push_back(std::move(callee));
    ParseArguments(*e);
    return Seal(std::move(e));
  }

  std::string DottedName() {
    std::string name = ExpectName();
    while (IsOp(".") && Peek(1).kind == TK::kName) {
      Next();
      name += "." + Next().text;
    }
    return name;
  }

  ExprPtr ParseFilterChain(ExprPtr node) {
    while (true) {
      const int line = Peek().line;
      if (SkipOp("|")) {
        auto e = Make(Expr::Kind::kFilter, line);
        e->name = DottedName();
        e->items.push_back(std::move(node));
        if (IsOp("(")) ParseArguments(*e);
        node = Seal(std::move(e));
      } else if (SkipName("is")) {
        auto e = Make(Expr::Kind::kTest, line);
        e->negated = SkipName("not");
        e->name = DottedName();
        e->items.push_back(std::move(node));
        const Token& t = Peek();
        if (IsOp("(")) {
          ParseArguments(*e);
        } else if ((t.kind == TK::kName && t.text != "else" && t.text != "or" && t.text != "and") ||
                   t.kind == TK::kString || t.kind == TK::kInt || t.kind == TK::kFloat || IsOp("[") || IsOp("{")) {
          e->items.push_back(ParsePostfix(ParsePrimary()));
        }
        node = Seal(std::move(e));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body Parse(std::string_view source) { return Parser(Tokenize(source)).ParseTemplate(); }

}  // namespace hsx::tmpl
