// Shape checks shared by the method files (loha.cpp, lokr.cpp, adalora.cpp). Internal.
#pragma once

#include <string>
#include <string_view>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge::detail {

// PEFT_ERR_SHAPE_MISMATCH unless `t` is [rows, cols] (a negative size matches anything) and holds
// that many values.
inline void expect_shape(const MethodTensor& t, int64_t rows, int64_t cols, std::string_view name, const char* param) {
  const bool ok = t.shape.size() == 2 && (rows < 0 || t.shape[0] == rows) && (cols < 0 || t.shape[1] == cols) &&
                  t.shape[0] >= 1 && t.shape[1] >= 1 &&
                  static_cast<int64_t>(t.values.size()) == t.shape[0] * t.shape[1];
  if (ok) return;
  fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": " + param + " is " +
                                    shape_text(t.shape) + ", the layer needs [" +
                                    (rows < 0 ? std::string("r") : std::to_string(rows)) + ", " +
                                    (cols < 0 ? std::string("r") : std::to_string(cols)) + "]");
}

}  // namespace peft::merge::detail
