// DistributedSampler: permutation properties, sharding, tail policies, exact resume (also with a
// different number of ranks), checked against an independent slicing formulation.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include <dtrain/data/distributed_sampler.hpp>

#include "unit/data_helpers.hpp"

using dtrain::DistributedSampler;
using dtrain::SamplerOptions;
using dtrain::SamplerTail;
using Batches = std::vector<std::vector<std::int64_t>>;

namespace {

// The epoch order of one rank from position 0, written the way it is specified: pad or truncate
// the permutation to a multiple of W, so each rank has q samples; step j has b = min(B, q - jB)
// rows per rank and covers the next b*W entries, rank r taking the r-th block of b. Shares nothing
// with the sampler's position arithmetic.
Batches reference_batches(const std::vector<std::int64_t>& perm, int world, int rank,
                          SamplerTail tail, std::size_t B, bool drop_last) {
  const std::size_t n = perm.size(), w = static_cast<std::size_t>(world);
  std::vector<std::int64_t> list = perm;
  if (tail == SamplerTail::pad) {
    const std::size_t total = (n + w - 1) / w * w;
    for (std::size_t i = n; i < total; ++i) list.push_back(perm[i % n]);
  } else {
    list.resize(n / w * w);
  }
  const std::size_t q = list.size() / w;
  Batches out;
  std::size_t start = 0;
  for (std::size_t done = 0; done < q; done += B) {
    const std::size_t b = std::min(B, q - done);
    if (drop_last && b < B) break;
    const auto first =
        list.begin() + static_cast<std::ptrdiff_t>(start + static_cast<std::size_t>(rank) * b);
    out.emplace_back(first, first + static_cast<std::ptrdiff_t>(b));
    start += b * w;
  }
  return out;
}

std::vector<std::int64_t> permutation_of(const DistributedSampler& s) {
  std::vector<std::int64_t> p(s.num_samples());
  for (std::size_t k = 0; k < p.size(); ++k) p[k] = s.permuted(k);
  return p;
}

// Drains the rest of the epoch of one sampler.
Batches drain(DistributedSampler& s, std::size_t B) {
  Batches out;
  for (;;) {
    auto idx = s.next_indices(B);
    if (idx.empty()) break;
    out.push_back(std::move(idx));
    s.advance(B);
  }
  return out;
}

}  // namespace

TEST_CASE("sampler: each epoch is a permutation that depends only on (seed, epoch)") {
  for (std::size_t n : {0u, 1u, 7u, 1000u}) {
    DistributedSampler a(n, 0, 1, 42), b(n, 2, 5, 42), c(n, 0, 1, 43);
    auto pa = permutation_of(a);
    std::vector<std::int64_t> sorted = pa;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> iota(n);
    std::iota(iota.begin(), iota.end(), 0);
    CHECK(sorted == iota);
    CHECK(permutation_of(b) == pa);  // rank and world size do not enter the order
    if (n >= 7) {
      CHECK(pa != iota);
      CHECK(permutation_of(c) != pa);  // the seed does
      a.set_epoch(1);
      CHECK(permutation_of(a) != pa);  // and the epoch does
      a.set_epoch(0);
      CHECK(permutation_of(a) == pa);  // reproducibly
    }
  }
  DistributedSampler plain(10, 0, 1, 42, SamplerOptions{false});
  std::vector<std::int64_t> iota(10);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(permutation_of(plain) == iota);
}

TEST_CASE("sampler: shards match the reference slicing for awkward sizes") {
  for (std::size_t n : {0u, 1u, 7u, 1000u, 1001u})
    for (int w : {1, 2, 3, 5, 8, 16})
      for (SamplerTail tail : {SamplerTail::pad, SamplerTail::drop})
        for (bool drop_last : {false, true})
          for (std::size_t B : {1u, 3u, 32u}) {
            CAPTURE(n);
            CAPTURE(w);
            CAPTURE(static_cast<int>(tail));
            CAPTURE(drop_last);
            CAPTURE(B);
            const SamplerOptions opt{true, tail, drop_last};
            std::vector<Batches> got(static_cast<std::size_t>(w));
            std::vector<std::int64_t> perm;
            for (int r = 0; r < w; ++r) {
              DistributedSampler s(n, r, w, 7, opt);
              s.set_epoch(3);
              if (r == 0) perm = permutation_of(s);
              CHECK(s.num_batches(B) == s.remaining_batches(B));
              const std::size_t expected_batches = s.num_batches(B);
              got[static_cast<std::size_t>(r)] = drain(s, B);
              CHECK(got[static_cast<std::size_t>(r)].size() == expected_batches);
              CHECK(s.remaining_batches(B) == 0);
              CHECK(got[static_cast<std::size_t>(r)] ==
                    reference_batches(perm, w, r, tail, B, drop_last));
            }
            // Same number of batches and the same batch sizes on every rank.
            for (int r = 1; r < w; ++r) {
              REQUIRE(got[static_cast<std::size_t>(r)].size() == got[0].size());
              for (std::size_t j = 0; j < got[0].size(); ++j)
                CHECK(got[static_cast<std::size_t>(r)][j].size() == got[0][j].size());
            }
            // Coverage: drop never repeats a sample; pad covers every sample.
            std::multiset<std::int64_t> all;
            for (auto& rb : got)
              for (auto& b : rb) all.insert(b.begin(), b.end());
            if (!drop_last) {
              if (tail == SamplerTail::drop) {
                CHECK(all.size() == n / static_cast<std::size_t>(w) * static_cast<std::size_t>(w));
                CHECK(std::set<std::int64_t>(all.begin(), all.end()).size() == all.size());
              } else {
                CHECK(std::set<std::int64_t>(all.begin(), all.end()).size() == n);
              }
            }
          }
}

TEST_CASE("sampler: ranks as threads agree without communication") {
  const int w = 4;
  const std::size_t n = 503, B = 16;
  std::vector<Batches> got(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      DistributedSampler s(n, r, w, 99);
      s.set_epoch(5);
      got[static_cast<std::size_t>(r)] = drain(s, B);
    });
  for (auto& t : threads) t.join();
  std::set<std::int64_t> seen;
  std::size_t total = 0;
  for (std::size_t j = 0; j < got[0].size(); ++j) {
    // The step's shards are disjoint, apart from the wrap-around padding of the last step.
    std::set<std::int64_t> step;
    std::size_t count = 0;
    for (int r = 0; r < w; ++r) {
      step.insert(got[static_cast<std::size_t>(r)][j].begin(),
                  got[static_cast<std::size_t>(r)][j].end());
      count += got[static_cast<std::size_t>(r)][j].size();
    }
    if (j + 1 < got[0].size()) CHECK(step.size() == count);
    seen.insert(step.begin(), step.end());
    total += count;
  }
  CHECK(seen.size() == n);
  CHECK(total == (n + w - 1) / w * w);
}

TEST_CASE("sampler: restoring mid-epoch reproduces the remaining batches exactly") {
  const std::size_t n = 1000, B = 24;
  for (int w : {1, 3, 4}) {
    for (int r = 0; r < w; ++r) {
      DistributedSampler s(n, r, w, 1234);
      s.set_epoch(2);
      for (int k = 0; k < 5; ++k) s.advance(B);
      auto state = dtrain::test::save_state(s);
      const Batches rest = drain(s, B);
      REQUIRE(!rest.empty());

      DistributedSampler fresh(n, r, w, 1);  // another seed: the checkpoint's wins
      dtrain::test::load_state(state, fresh);
      CHECK(fresh.seed() == 1234);
      CHECK(fresh.epoch() == 2);
      fresh.set_epoch(2);  // the usual loop call keeps the restored position
      CHECK(fresh.position() == static_cast<std::uint64_t>(5 * B * w));
      CHECK(drain(fresh, B) == rest);
      fresh.set_epoch(2);  // a second call restarts the epoch
      CHECK(fresh.position() == 0);
    }
  }
}

TEST_CASE("sampler: restoring with a different world size continues the same global order") {
  const std::size_t n = 1001, B = 8;
  for (SamplerTail tail : {SamplerTail::pad, SamplerTail::drop})
    for (int w_old : {4, 2, 3})
      for (int w_new : {3, 1, 2, 5}) {
        CAPTURE(w_old);
        CAPTURE(w_new);
        const SamplerOptions opt{true, tail, false};
        std::multiset<std::int64_t> consumed;
        dtrain::test::MemoryState state;
        for (int r = 0; r < w_old; ++r) {
          DistributedSampler s(n, r, w_old, 77, opt);
          s.set_epoch(1);
          for (int k = 0; k < 7; ++k) {
            auto idx = s.next_indices(B);
            consumed.insert(idx.begin(), idx.end());
            s.advance(B);
          }
          if (r == 0) state = dtrain::test::save_state(s);
        }
        const std::uint64_t g = static_cast<std::uint64_t>(7 * B * w_old);
        std::multiset<std::int64_t> rest;
        std::size_t batches = 0;
        for (int r = 0; r < w_new; ++r) {
          DistributedSampler s(n, r, w_new, 77, opt);
          dtrain::test::load_state(state, s);
          s.set_epoch(1);
          CHECK(s.position() == g);
          const Batches b = drain(s, B);
          if (r == 0) batches = b.size();
          CHECK(b.size() == batches);
          for (auto& x : b) rest.insert(x.begin(), x.end());
        }
        // The consumed prefix and the continuation together are P[0, N) (plus the new run's pad
        // or minus its dropped tail), and the continuation is exactly P from position g.
        DistributedSampler ref(n, 0, 1, 77, opt);
        ref.set_epoch(1);
        std::multiset<std::int64_t> expect_rest;
        const std::size_t w = static_cast<std::size_t>(w_new), r_left = n - g;
        const std::size_t total =
            tail == SamplerTail::pad ? (r_left + w - 1) / w * w : r_left / w * w;
        for (std::size_t k = 0; k < total; ++k) expect_rest.insert(ref.permuted((g + k) % n));
        CHECK(rest == expect_rest);
        std::set<std::int64_t> prefix;
        for (std::uint64_t k = 0; k < g; ++k) prefix.insert(ref.permuted(k));
        CHECK(std::multiset<std::int64_t>(prefix.begin(), prefix.end()) == consumed);
      }
}

TEST_CASE("sampler: state visits the documented names and rejects another dataset size") {
  DistributedSampler s(100, 0, 2, 5, SamplerOptions{true, SamplerTail::drop, true});
  s.set_epoch(4);
  s.advance(10);
  auto st = dtrain::test::save_state(s);
  CHECK(st.ints.at("epoch") == 4);
  CHECK(st.ints.at("position") == 20);
  CHECK(st.ints.at("seed") == 5);
  CHECK(st.ints.at("num_samples") == 100);
  CHECK(st.strings.at("tail") == "drop");
  CHECK(st.ints.at("drop_last") == 1);

  DistributedSampler other(101, 0, 2, 5);
  CHECK_THROWS_AS(dtrain::test::load_state(st, other), dtrain::InvalidArgument);
  DistributedSampler same(100, 1, 2, 9);  // options come from the checkpoint
  dtrain::test::load_state(st, same);
  CHECK(same.options().tail == SamplerTail::drop);
  CHECK(same.options().drop_last);
  CHECK(same.position() == 20);
}

TEST_CASE("sampler: bad arguments are InvalidArgument naming the operation") {
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2, 0), dtrain::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, -1, 2, 0), dtrain::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0, 0), dtrain::InvalidArgument);
  DistributedSampler s(10, 0, 1, 0);
  CHECK_THROWS_WITH_AS(s.num_batches(0), doctest::Contains("batch size"), dtrain::InvalidArgument);
  CHECK_THROWS_AS(s.set_epoch(-1), dtrain::InvalidArgument);
}

TEST_CASE("sampler: a group object supplies rank and size") {
  struct Group {
    int rank() const { return 1; }
    int size() const { return 3; }
  } g;
  DistributedSampler s(10, g, 3);
  CHECK(s.rank() == 1);
  CHECK(s.world_size() == 3);
  CHECK(s.num_batches(2) == 2);  // ceil(10/3) = 4 samples per rank
}
