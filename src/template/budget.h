// What one render may spend, so an adversarial template ends with an error instead of
// taking the process's memory or time: every evaluation step and every byte a string or list
// operation builds is charged against one work budget, no single string exceeds the output
// bound, and loops and macro calls are counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "template/value.h"

namespace hsx::tmpl {

struct RenderLimits {
  // The rendered text, and any one string built on the way: a conversation as long as the
  // largest request body (--max-body-bytes, 32 MiB) still renders.
  size_t max_output_bytes = 32u << 20;
  int64_t max_loop_iterations = 1000000;  // over all loops of a render
  int max_call_depth = 32;                // nested macro calls
  int64_t max_work = 1000000000;          // steps plus bytes built (seconds of work at worst)
};

class Budget {
 public:
  explicit Budget(const RenderLimits& limits) : limits_(limits), work_left_(limits.max_work) {}
  const RenderLimits& limits() const { return limits_; }
  void Charge(int64_t units) {
    work_left_ -= units;
    if (work_left_ < 0) throw TemplateError("template exceeds its work bound (" + std::to_string(limits_.max_work) + " steps and bytes built)");
  }
  // Charges a string or list about to be built with `size` bytes or elements.
  void CheckSize(size_t size) {
    if (size > limits_.max_output_bytes) {
      throw TemplateError("template builds a value larger than " + std::to_string(limits_.max_output_bytes) + " bytes or elements");
    }
    Charge(static_cast<int64_t>(size));
  }

 private:
  RenderLimits limits_;
  int64_t work_left_;
};

}  // namespace hsx::tmpl
