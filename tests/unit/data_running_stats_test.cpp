// RunningStats: per-channel mean and variance of a stream against a float64 two-pass reference,
// Chan merges in any grouping, the rank-order merge on 1-4 loopback ranks (same bits everywhere),
// checkpoint round trip, normalise / denormalise, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/data/running_stats.hpp>
#include <dtrain/transports/loopback.hpp>

#include "support/memory_state.hpp"

using namespace dtrain;

namespace {

// Values of channel c drawn around offset[c] with spread scale[c] (a large offset tests that the
// update keeps its accuracy where a one-pass sum of squares would cancel).
std::vector<double> draw(std::uint64_t seed, std::size_t batch, std::size_t C, std::size_t inner) {
  RngStream rng(seed, 0);
  const double offset[3] = {1e6, -3.0, 0.25}, scale[3] = {1e-2, 5.0, 1.0};
  std::vector<double> x(batch * C * inner);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < inner; ++j)
        x[(b * C + c) * inner + j] = offset[c % 3] + scale[c % 3] * (rng.uniform_double() - 0.5);
  return x;
}

// Two passes in float64 over everything at once: per channel (mean, population variance).
void reference(const std::vector<double>& x, std::size_t C, std::size_t inner,
               std::vector<double>& mean, std::vector<double>& var) {
  const std::size_t B = x.size() / (C * inner);
  mean.assign(C, 0.0);
  var.assign(C, 0.0);
  for (std::size_t c = 0; c < C; ++c) {
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t j = 0; j < inner; ++j) mean[c] += x[(b * C + c) * inner + j];
    mean[c] /= double(B * inner);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t j = 0; j < inner; ++j) {
        const double d = x[(b * C + c) * inner + j] - mean[c];
        var[c] += d * d;
      }
    var[c] /= double(B * inner);
  }
}

void check_against(const RunningStats& s, const std::vector<double>& all, std::size_t inner) {
  std::vector<double> mean, var;
  reference(all, s.channels(), inner, mean, var);
  for (std::size_t c = 0; c < s.channels(); ++c) {
    CAPTURE(c);
    CHECK(s.count(c) == std::int64_t(all.size() / s.channels()));
    CHECK(std::abs(s.mean(c) - mean[c]) <= 1e-13 * std::abs(mean[c]) + 1e-15);
    // Rounding of the values themselves limits any method to about eps * |mean| * stddev (the
    // offset-1e6 channel: ~3e-13); a one-pass sum of squares would be off by eps * mean^2 (~1e-4,
    // more than that channel's variance).
    const double eps = 2.220446049250313e-16;
    CHECK(std::abs(s.variance(c) - var[c]) <=
          1e-12 * var[c] + 100 * eps * std::abs(mean[c]) * std::sqrt(var[c]));
  }
}

bool same_bits(const RunningStats& a, const RunningStats& b) {
  if (a.channels() != b.channels()) return false;
  for (std::size_t c = 0; c < a.channels(); ++c) {
    const double x[2] = {a.mean(c), a.variance(c)}, y[2] = {b.mean(c), b.variance(c)};
    if (a.count(c) != b.count(c) || std::memcmp(x, y, sizeof x) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("running stats: a stream of uneven batches against a float64 two-pass reference") {
  const std::size_t C = 3, inner = 17;
  RunningStats s(C);
  std::vector<double> all;
  std::uint64_t seed = 1;
  for (std::size_t batch : {1, 0, 5, 2, 40, 1, 13}) {  // includes an empty batch
    const auto x = draw(seed++, batch, C, inner);
    s.update(span<const double>(x), inner);
    all.insert(all.end(), x.begin(), x.end());
  }
  check_against(s, all, inner);

  // f32 batches: the reference sees the same rounded values.
  RunningStats f(C);
  std::vector<double> seen;
  for (std::size_t batch : {3, 7, 1}) {
    const auto x = draw(seed++, batch, C, inner);
    std::vector<float> xf(x.begin(), x.end());
    f.update(span<const float>(xf), inner);
    seen.insert(seen.end(), xf.begin(), xf.end());
  }
  check_against(f, seen, inner);

  SUBCASE("one value at a time (Welford's update) agrees") {
    RunningStats w(1);
    std::vector<double> one;
    const auto x = draw(99, 200, 1, 1);
    for (double v : x) {
      w.update(span<const double>(&v, 1), 1);
      one.push_back(v);
    }
    check_against(w, one, 1);
  }
}

TEST_CASE(
    "running stats: merging groups in any split and order gives the statistics of the union") {
  const std::size_t C = 2, inner = 4;
  const auto a = draw(7, 9, C, inner), b = draw(8, 30, C, inner), c = draw(9, 1, C, inner);
  std::vector<double> all(a);
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  RunningStats sa(C), sb(C), sc(C), empty(C);
  sa.update(span<const double>(a), inner);
  sb.update(span<const double>(b), inner);
  sc.update(span<const double>(c), inner);

  RunningStats ab_c(C), c_ba(C);
  ab_c.merge(sa);
  ab_c.merge(sb);
  ab_c.merge(empty);  // merging nothing changes nothing
  ab_c.merge(sc);
  c_ba.merge(sc);
  c_ba.merge(sb);
  c_ba.merge(sa);
  check_against(ab_c, all, inner);
  check_against(c_ba, all, inner);

  RunningStats three(3);
  CHECK_THROWS_AS(three.merge(sa), InvalidArgument);
}

TEST_CASE("running stats: merged over 1-4 loopback ranks, rank order, same bits on every rank") {
  const std::size_t C = 3, inner = 5;
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    // What each rank sees: a different amount of data per rank, rank 2 nothing at all.
    std::vector<std::vector<double>> data(n);
    std::vector<double> all;
    for (int r = 0; r < n; ++r) {
      data[r] = draw(100 + r, r == 2 ? 0 : 3 + 4 * r, C, inner);
      all.insert(all.end(), data[r].begin(), data[r].end());
    }
    // The fold in rank order, done here on one thread: what every rank must get, to the bit.
    RunningStats expect(C);
    for (int r = 0; r < n; ++r) {
      RunningStats local(C);
      local.update(span<const double>(data[r]), inner);
      expect.merge(local);
    }
    check_against(expect, all, inner);

    std::mutex m;
    std::vector<RunningStats> got(n, RunningStats(C));
    std::vector<RunningStats> kept(n, RunningStats(C));
    run_loopback(n, [&](LoopbackTransport& t) {
      Communicator comm(t);
      const int r = comm.rank();
      RunningStats local(C);
      local.update(span<const double>(data[r]), inner);
      const RunningStats g = local.merged(comm);
      std::lock_guard<std::mutex> lock(m);
      got[r] = g;
      kept[r] = local;
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(same_bits(got[r], expect));
      CHECK(kept[r].count(0) == std::int64_t(data[r].size() / C));  // local stats untouched
    }
  }
}

TEST_CASE("running stats: checkpoint round trip restores the bits and the stream continues") {
  const std::size_t C = 3, inner = 6;
  const auto x = draw(3, 11, C, inner), y = draw(4, 5, C, inner);
  RunningStats s(C);
  s.update(span<const double>(x), inner);
  test::MemoryState state;
  visit_object(state, s);
  CHECK(state.shapes.at("count") == Shape{3});
  CHECK(state.shapes.at("mean") == Shape{3});
  CHECK(state.shapes.at("m2") == Shape{3});

  RunningStats r(C);
  state.load = true;
  visit_object(state, r);
  CHECK(same_bits(r, s));
  s.update(span<const double>(y), inner);
  r.update(span<const double>(y), inner);
  CHECK(same_bits(r, s));

  RunningStats other(C + 1);  // a checkpoint of other channels is refused
  CHECK_THROWS(visit_object(state, other));
  std::int64_t bad = -1;  // a corrupted count is refused with the channel named
  std::memcpy(state.tensors.at("count").data(), &bad, sizeof bad);
  RunningStats t(C);
  CHECK_THROWS_WITH_AS(visit_object(state, t), doctest::Contains("channel 0 holds count -1"),
                       InvalidArgument);
}

TEST_CASE("running stats: normalise gives zero mean and unit variance; denormalise inverts it") {
  const std::size_t C = 3, inner = 8;
  const auto x = draw(21, 16, C, inner);
  RunningStats s(C);
  s.update(span<const double>(x), inner);

  std::vector<double> z(x);
  s.normalise(span<double>(z), inner);
  std::vector<double> mean, var;
  reference(z, C, inner, mean, var);
  for (std::size_t c = 0; c < C; ++c) {
    CHECK(std::abs(mean[c]) < 1e-6);  // the offset-1e6 channel's values carry ~4e-8 of rounding
    CHECK(std::abs(var[c] - 1.0) < 1e-6);
  }
  s.denormalise(span<double>(z), inner);
  for (std::size_t k = 0; k < x.size(); ++k)
    REQUIRE(std::abs(z[k] - x[k]) <= 1e-9 * (std::abs(x[k]) + 1));

  std::vector<float> zf(x.begin(), x.end()), xf(zf);
  s.normalise(span<float>(zf), inner);
  for (std::size_t k = 0; k < zf.size(); ++k) {
    const std::size_t c = k / inner % C;
    REQUIRE(std::abs(zf[k] - (double(xf[k]) - s.mean(c)) / s.stddev(c)) < 1e-4);
  }

  // A constant channel: its standard deviation is floored, so it maps to 0, not NaN.
  RunningStats k(1, 1e-6);
  std::vector<double> flat(10, 4.5);
  k.update(span<const double>(flat), 10);
  k.normalise(span<double>(flat), 10);
  for (double v : flat) CHECK(v == 0.0);
}

TEST_CASE("running stats: bad input is refused, naming the operation, and changes nothing") {
  CHECK_THROWS_AS(RunningStats(0), InvalidArgument);
  CHECK_THROWS_AS(RunningStats(2, 0.0), InvalidArgument);
  RunningStats s(2);
  std::vector<double> x(7, 1.0);
  CHECK_THROWS_WITH_AS(s.update(span<const double>(x), 2),
                       doctest::Contains("RunningStats::update"), InvalidArgument);  // 7 % 4
  CHECK_THROWS_WITH_AS(s.normalise(span<double>(x.data(), 4), 2),
                       doctest::Contains("no values yet"), InvalidArgument);
  CHECK_THROWS_AS(s.update(span<const double>(x.data(), 4), 0), InvalidArgument);
  x[5] = std::nan("");
  CHECK_THROWS_WITH_AS(s.update(span<const double>(x.data(), 6), 1),
                       doctest::Contains("sample 2, channel 1"), InvalidArgument);
  CHECK(s.count(0) == 0);
  CHECK(s.count(1) == 0);
  x[5] = 1.0;
  s.update(span<const double>(x.data(), 4), 2);
  CHECK_THROWS_AS(s.denormalise(span<double>(x.data(), 3), 2), InvalidArgument);
}
