// Counts the test cases that passed the command line's filters, so that a main can refuse a run
// in which none did: the CTests of a shared test binary select their cases by source file, and a
// filter that matches nothing (a renamed file, a typo) must fail, not pass with zero cases.
#pragma once

#include <doctest/doctest.h>

namespace dtrain::test {

struct CaseCounter : doctest::IReporter {
  static inline bool run_ended = false;
  static inline unsigned passing_filters = 0;

  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    run_ended = true;
    passing_filters = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

/// True when a run took place (not --help or a listing) and no test case passed the filters.
inline bool no_case_selected() {
  return CaseCounter::run_ended && CaseCounter::passing_filters == 0;
}

}  // namespace dtrain::test

REGISTER_LISTENER("dtrain_case_counter", 1, dtrain::test::CaseCounter);
