// Reading the messages of errors that tests provoke on purpose.
#pragma once

#include <string>

#include <dtrain/core/error.hpp>

namespace dtrain::test {

/// The message of the InvalidArgument `f` throws, or "(no InvalidArgument thrown)".
template <class F>
std::string invalid_argument_text(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

/// True when `text` contains `part`.
inline bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

}  // namespace dtrain::test
