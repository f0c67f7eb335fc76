// A Jinja2 template as Hugging Face renders chat templates (trim_blocks, lstrip_blocks,
// loop controls, {% generation %}, raise_exception, strftime_now, a tojson without HTML
// escaping), parsed once and rendered many times with bounded time, memory and depth.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "template/ast.h"
#include "template/budget.h"
#include "util/status.h"

namespace hsx::tmpl {

class Template {
 public:
  // Errors name the template line ("line 3: ...").
  static Result<Template> Parse(std::string_view source);

  // The text for `variables` (a dict of name → value); a raise_exception() message, an
  // undefined name called, a type error or a limit exceeded fails with the line at fault.
  Result<std::string> Render(const ValueDict& variables, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace hsx::tmpl
