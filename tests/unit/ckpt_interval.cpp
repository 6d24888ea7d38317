// How often to checkpoint: Daly's interval against a brute-force minimum of the model's overhead,
// Young's limit, the cost terms, bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include <dtrain/ckpt/interval.hpp>

#include "support/messages.hpp"

TEST_CASE("the advised interval is the overhead's minimum, and Young's sqrt(2 C M) in the limit") {
  const double restart = 30;
  for (const double mtbf : {3600.0, 86400.0}) {
    for (const double save : {0.5, 10.0, 120.0}) {
      CAPTURE(mtbf);
      CAPTURE(save);
      const auto best = dtrain::optimal_checkpoint_interval(save, restart, mtbf);
      // Brute force over a fine logarithmic grid of intervals, from the cost function alone.
      double lowest = 1e300;
      for (double t = 1e-3; t < 10 * mtbf; t *= 1.001)
        lowest =
            std::fmin(lowest, dtrain::checkpoint_interval_cost(t, save, restart, mtbf).overhead);
      CHECK(best.overhead >= lowest * (1 - 1e-12));
      CHECK(best.overhead <= lowest * 1.002);  // Daly against this first-order model
      const double young = std::sqrt(2 * save * mtbf);
      if (save / mtbf < 1e-3) CHECK(std::fabs(best.interval - young) / young < 0.03);
    }
  }
}

TEST_CASE("cost terms: restart plus half a period per failure, saves over the period") {
  const auto c = dtrain::checkpoint_interval_cost(600, 20, 40, 36000);
  CHECK(c.interval == 600);
  CHECK(c.lost_per_failure == doctest::Approx(40 + 310));
  CHECK(c.overhead == doctest::Approx(20.0 / 620 + 350.0 / 36000));
  // A save longer than twice the MTBF: Daly's advice is to save once per MTBF.
  CHECK(dtrain::optimal_checkpoint_interval(100, 0, 40).interval == 40);
}

TEST_CASE("bad input names the function and the values") {
  const std::string m =
      dtrain::test::invalid_argument_text([] { dtrain::checkpoint_interval_cost(0, 1, 1, 100); });
  CHECK(dtrain::test::contains(m, "checkpoint_interval_cost"));
  CHECK(dtrain::test::contains(m, "interval 0 s"));
  CHECK_THROWS_AS(dtrain::optimal_checkpoint_interval(0, 1, 100), dtrain::InvalidArgument);
  CHECK_THROWS_AS(dtrain::optimal_checkpoint_interval(1, -1, 100), dtrain::InvalidArgument);
  CHECK_THROWS_AS(dtrain::optimal_checkpoint_interval(1, 1, 0), dtrain::InvalidArgument);
}
