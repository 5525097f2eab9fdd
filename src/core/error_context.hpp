// Naming the file an error is about: the parsers and checks below a file's reader do not know its
// path, so the reader runs them through with_path and every coded error they throw reaches the
// caller as "<path>: <message>", with its code unchanged.
#pragma once

#include <string>

#include "core/error.hpp"

namespace peft {

template <class Body>
auto with_path(const std::string& path, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

}  // namespace peft
