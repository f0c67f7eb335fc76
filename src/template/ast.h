// The parsed template: expressions and statements as plain trees the renderer walks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace hsx::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items
    kTuple,      // items (evaluates to a list: templates only iterate and index tuples)
    kDict,       // items: key, value, key, value, ...
    kAttribute,  // items[0].name
    kItem,       // items[0][items[1]]
    kSlice,      // items[0][items[1]:items[2]:items[3]], absent parts are null
    kCall,       // items[0](items[1..], keywords)
    kFilter,     // name(items[0], items[1..], keywords)
    kTest,       // items[0] is [not: negated] name(items[1..])
    kNot,        // not items[0]
    kNegate,     // -items[0]
    kPlus,       // +items[0]
    kBinary,     // items[0] op items[1]: + - * / // % ** ~
    kAnd,
    kOr,
    kCompare,    // items[0] ops[0] items[1] ops[1] items[2] ... (chained, as Python)
    kCondition,  // items[1] if items[0] else items[2] (items[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // kName, kAttribute, kFilter, kTest, kBinary's operator
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;  // kCompare
  bool negated = false;          // kTest
  int height = 1;                // of this tree: rendering recurses this deep
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,      // text
    kPrint,     // {{ expr }}
    kIf,        // conditions[i] → bodies[i]; a last extra body is the else
    kFor,       // for targets in expr [if condition]: bodies[0], else bodies[1]
    kSet,       // set targets (or attribute_of.targets[0]) = expr; block set: bodies[0]
    kMacro,     // macro name(params = defaults): bodies[0]
    kBreak,
    kContinue,
    kScope,     // a block that only renders its body ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attribute_of;           // kSet on a namespace attribute: `ns` of `ns.x`
  std::vector<ExprPtr> defaults;      // kMacro: one per target (parameter), null when none
  ExprPtr condition;                  // kFor's filter
};

}  // namespace hsx::tmpl
