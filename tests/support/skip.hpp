// Test support: end a test process as "skipped" (exit 77, CTest's SKIP_RETURN_CODE) saying why.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace dtrain::test {
[[noreturn]] inline void skip_process(const char* what_is_missing) {
  std::printf("SKIPPED: %s\n", what_is_missing);
  std::fflush(stdout);
  std::exit(77);
}
}  // namespace dtrain::test
