// doctest main for single-process tests, with a watchdog.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "support/case_counter.hpp"
#include "support/watchdog.hpp"

int main(int argc, char** argv) {
  dtrain::test::Watchdog watchdog([](double s) {
    std::fprintf(stderr, "dtrain test watchdog: still running after %.0f s, aborting\n", s);
    std::fflush(stderr);
    std::_Exit(124);
  });
  doctest::Context context(argc, argv);
  const int code = context.run();
  if (code == 0 && dtrain::test::no_case_selected()) {
    std::fprintf(stderr, "dtrain test: no test case matches the filters given\n");
    return 1;
  }
  return code;
}
