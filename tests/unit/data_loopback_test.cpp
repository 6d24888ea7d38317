// Loaders on loopback ranks (N ranks as N threads): the sampler takes rank and size from the
// transport; shards are disjoint, cover the epoch, and every rank runs the same number of steps;
// a checkpoint taken on N ranks resumes on M ranks from the same global position.
#include <doctest/doctest.h>

#include <mutex>
#include <set>
#include <vector>

#include <dtrain/data/idx.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/transports/loopback.hpp>

#include "unit/data_helpers.hpp"

using namespace dtrain;

TEST_CASE("loopback data: shards over 1..4 ranks, and resume on a different rank count") {
  test::TempDir dir;
  auto files = test::write_synthetic_idx(dir, "d", 250, 4, 4, false);
  IdxDataset ds(files.images, files.labels);
  const std::size_t B = 7;
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    std::mutex m;
    std::vector<std::int64_t> consumed;
    std::vector<std::size_t> steps;
    test::MemoryState state;
    run_loopback(n, [&](LoopbackTransport& t) {
      DistributedSampler s(ds.size(), t, 42, SamplerOptions{true, SamplerTail::drop, false});
      s.set_epoch(1);
      Loader loader(ds, s, B);
      Batch b;
      std::vector<std::int64_t> mine;
      std::size_t k = 0;
      for (; k < 5 && loader.next(b); ++k)
        mine.insert(mine.end(), b.indices.begin(), b.indices.end());
      std::lock_guard<std::mutex> lock(m);
      consumed.insert(consumed.end(), mine.begin(), mine.end());
      steps.push_back(k);
      if (t.rank() == 0) state = test::save_state(s);
    });
    for (auto k : steps) CHECK(k == 5);
    CHECK(std::set<std::int64_t>(consumed.begin(), consumed.end()).size() == consumed.size());
    CHECK(consumed.size() == 5 * B * static_cast<std::size_t>(n));

    const int m_ranks = n % 4 + 1;  // 2, 3, 4, 1
    std::vector<std::int64_t> rest;
    std::vector<std::size_t> rest_steps;
    run_loopback(m_ranks, [&](LoopbackTransport& t) {
      DistributedSampler s(ds.size(), t, 0);
      test::load_state(state, s);
      s.set_epoch(1);
      Loader loader(ds, s, B);
      std::vector<std::int64_t> mine;
      std::size_t k = 0;
      for (Batch& b : loader) {
        mine.insert(mine.end(), b.indices.begin(), b.indices.end());
        ++k;
      }
      std::lock_guard<std::mutex> lock(m);
      rest.insert(rest.end(), mine.begin(), mine.end());
      rest_steps.push_back(k);
    });
    for (auto k : rest_steps) CHECK(k == rest_steps[0]);
    std::set<std::int64_t> all(consumed.begin(), consumed.end());
    for (auto i : rest) CHECK(all.insert(i).second);  // never a sample twice (drop policy)
    // Everything except at most m_ranks - 1 dropped samples of the tail.
    CHECK(all.size() + static_cast<std::size_t>(m_ranks) > ds.size());
  }
}
