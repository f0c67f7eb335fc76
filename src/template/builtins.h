// What templates call by name: Jinja's filters and tests, Python's operators and the str and
// dict methods chat templates use, and item and attribute lookup as Jinja's sandbox does it.
// Each follows the Python/Jinja2 behaviour it stands for; what is missing fails by name.
#pragma once

#include <string>

#include "template/budget.h"
#include "template/value.h"

namespace hsx::tmpl {

// obj.name: a str/dict method bound to obj, else the dict's item, else undefined.
Value GetAttribute(const Value& obj, const std::string& name, Budget& budget);
// obj[key]: the item (negative list indices count from the end), else a method of that
// name, else undefined; as Jinja's getitem.
Value GetItem(const Value& obj, const Value& key, Budget& budget);
// obj[start:stop:step] for lists and strings (absent parts undefined).
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step, Budget& budget);

// The elements a for loop visits: a list's items, a dict's keys, a string's characters;
// undefined visits nothing.
ValueList Iterate(const Value& v);

// a op b for + - * / // % ** ~.
Value BinaryOp(const std::string& op, const Value& a, const Value& b, Budget& budget);
// a op b for == != < > <= >= in, "not in".
bool CompareOp(const std::string& op, const Value& a, const Value& b);

Value ApplyFilter(const std::string& name, const Value& input, const CallArgs& args, Budget& budget);
bool ApplyTest(const std::string& name, const Value& input, const CallArgs& args);

// Global functions every template sees: range, namespace, dict, raise_exception, strftime_now.
ValueDict Globals(Budget& budget);

}  // namespace hsx::tmpl
