// The blocks that select a run of consecutive elements of a row-major array (a rank's part of a
// sharded tensor, written in place by the parallel checkpoint strategies): checked against the
// run itself, element by element, on every run of every shape of up to 4 axes of up to 4. And
// the runs a distributed restore reads (detail::plan_reads): every element of every tensor read
// once, per-rank state by its owner, the bytes balanced over the ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/ckpt/detail/flat_blocks.hpp>
#include <dtrain/ckpt/detail/restore_distributed.hpp>

namespace {

using Dims = std::vector<std::uint64_t>;

// The row-major (flat) indices of a block's elements, in row-major order.
std::vector<std::uint64_t> elements_of(const Dims& dims, const dtrain::detail::FlatBlock& b) {
  std::vector<std::uint64_t> out;
  const std::size_t d = dims.size();
  std::vector<std::uint64_t> i(d, 0);
  std::uint64_t total = 1;
  for (std::size_t a = 0; a < d; ++a) total *= b.count[a];
  for (std::uint64_t k = 0; k < total; ++k) {
    std::uint64_t flat = 0;
    for (std::size_t a = 0; a < d; ++a) flat = flat * dims[a] + b.start[a] + i[a];
    out.push_back(flat);
    for (std::size_t a = d; a-- > 0;) {  // the next index, last axis fastest
      if (++i[a] < b.count[a]) break;
      i[a] = 0;
    }
  }
  return out;
}

std::string describe(const Dims& dims, std::uint64_t first, std::uint64_t n) {
  std::string s = "dims";
  for (auto x : dims) s += " " + std::to_string(x);
  return s + ", first " + std::to_string(first) + ", n " + std::to_string(n);
}

}  // namespace

TEST_CASE("flat runs as blocks: every run of every shape up to 4 axes of up to 4") {
  std::size_t shapes = 0, runs = 0, bad = 0;
  std::string first_bad;
  for (std::size_t d = 1; d <= 4; ++d) {
    Dims dims(d, 1);
    for (;;) {
      ++shapes;
      std::uint64_t total = 1;
      for (auto x : dims) total *= x;
      for (std::uint64_t first = 0; first <= total; ++first)
        for (std::uint64_t n = 0; first + n <= total; ++n) {
          ++runs;
          const auto blocks = dtrain::detail::flat_range_blocks(dims, first, n);
          std::vector<std::uint64_t> got;
          bool ok = blocks.size() <= 2 * d - 1 && (n > 0 || blocks.empty());
          for (const auto& b : blocks) {
            ok = ok && b.start.size() == d && b.count.size() == d;
            if (!ok) break;
            for (std::size_t a = 0; a < d; ++a)
              ok = ok && b.count[a] > 0 && b.start[a] + b.count[a] <= dims[a];
            if (!ok) break;
            for (auto e : elements_of(dims, b)) got.push_back(e);
          }
          for (std::uint64_t k = 0; ok && k < n; ++k) ok = got.size() == n && got[k] == first + k;
          if (!ok && bad++ == 0) first_bad = describe(dims, first, n);
        }
      std::size_t a = 0;  // the next shape: each axis 1..4
      while (a < d && dims[a] == 4) dims[a++] = 1;
      if (a == d) break;
      ++dims[a];
    }
  }
  CAPTURE(first_bad);
  CHECK(bad == 0u);
  CHECK(shapes == 4u + 16u + 64u + 256u);
  CHECK(runs > 100000u);
}

TEST_CASE("flat runs as blocks: a run inside one row, one across rows, and the whole array") {
  const Dims dims{3, 4, 5};  // 60 elements, rows of 5, planes of 20
  using dtrain::detail::flat_range_blocks;
  auto inside = flat_range_blocks(dims, 6, 3);  // [1][1][1..3]
  REQUIRE(inside.size() == 1u);
  CHECK(inside[0].start == Dims{0, 1, 1});
  CHECK(inside[0].count == Dims{1, 1, 3});
  auto across = flat_range_blocks(dims, 18, 25);  // [18, 43): 2 + 1 plane + 3
  REQUIRE(across.size() == 3u);
  CHECK(across[0].start == Dims{0, 3, 3});
  CHECK(across[0].count == Dims{1, 1, 2});
  CHECK(across[1].start == Dims{1, 0, 0});
  CHECK(across[1].count == Dims{1, 4, 5});
  CHECK(across[2].start == Dims{2, 0, 0});
  CHECK(across[2].count == Dims{1, 1, 3});
  auto whole = flat_range_blocks(dims, 0, 60);
  REQUIRE(whole.size() == 1u);
  CHECK(whole[0].count == dims);
  CHECK(flat_range_blocks(dims, 7, 0).empty());
}

namespace {

dtrain::detail::CkptEntry tensor_entry(const std::string& path, dtrain::Shape shape,
                                       dtrain::DType dtype, int owner = -1) {
  dtrain::detail::CkptEntry e;
  e.path = path;
  e.shape = std::move(shape);
  e.dtype = dtype;
  e.owner = owner;
  return e;
}

}  // namespace

TEST_CASE("distributed restore plan: every element read once, owners read their own, balanced") {
  using dtrain::DType;
  using dtrain::detail::CkptEntry;
  using dtrain::detail::plan_reads;
  // A model's alternating weights and biases (the case that round-robin would put all weights on
  // one rank), a 0-d tensor, an empty one, scalars, f16 and f64 tensors, per-rank state of ranks
  // 0-2.
  std::vector<CkptEntry> entries;
  for (int l = 0; l < 6; ++l) {
    entries.push_back(tensor_entry("/model/l" + std::to_string(l) + "/w", {300, 41}, DType::f32));
    entries.push_back(tensor_entry("/model/l" + std::to_string(l) + "/b", {41}, DType::f32));
  }
  entries.push_back(tensor_entry("/opt/t", {}, DType::i64));
  entries.push_back(tensor_entry("/opt/none", {0, 5}, DType::f32));
  entries.push_back(tensor_entry("/opt/h", {7, 3, 5}, DType::f16));
  entries.push_back(tensor_entry("/opt/d", {1000}, DType::f64));
  CkptEntry scalar;
  scalar.path = "/opt/step";
  scalar.kind = dtrain::detail::EntryKind::i64;
  entries.push_back(scalar);
  for (int r = 0; r < 3; ++r)
    entries.push_back(
        tensor_entry("/ranks/" + std::to_string(r) + "/sampler/perm", {5000}, DType::i64, r));
  for (int p = 1; p <= 5; ++p)
    for (std::size_t run_bytes :
         {std::size_t{1}, std::size_t{64}, std::size_t{4096}, std::size_t{16} << 20})
      for (bool owners_read : {false, true}) {
        CAPTURE(p);
        CAPTURE(run_bytes);
        CAPTURE(owners_read);
        const auto plan = plan_reads(entries, p, owners_read, run_bytes);
        std::vector<std::uint64_t> bytes_of(static_cast<std::size_t>(p), 0);
        std::uint64_t largest_run = 0;
        std::size_t count = 0;
        for (const CkptEntry& e : entries) {
          CAPTURE(e.path);
          const auto it = plan.runs.find(e.path);
          if (e.kind != dtrain::detail::EntryKind::tensor || e.bytes() == 0) {
            CHECK(it == plan.runs.end());
            continue;
          }
          REQUIRE(it != plan.runs.end());
          const auto& runs = it->second;
          count += runs.size();
          // Back to back from element 0 to the last: each element read exactly once.
          std::uint64_t next = 0;
          std::vector<int> readers;
          for (const auto& run : runs) {
            CHECK(run.first == next);
            CHECK(run.count > 0u);
            CHECK(run.reader >= 0);
            CHECK(run.reader < p);
            next = run.first + run.count;
            readers.push_back(run.reader);
            const std::uint64_t b = run.count * dtrain::size_of(e.dtype);
            bytes_of[static_cast<std::size_t>(run.reader)] += b;
            largest_run = std::max(largest_run, b);
          }
          CHECK(next == dtrain::element_count(e.shape));
          std::sort(readers.begin(), readers.end());
          CHECK(std::unique(readers.begin(), readers.end()) == readers.end());  // distinct ranks
          CHECK(runs.size() <= static_cast<std::size_t>(p));
          if (owners_read && e.owner >= 0 && e.owner < p) {
            REQUIRE(runs.size() == 1u);
            CHECK(runs[0].reader == e.owner);
          } else {
            // As many readers as runs of run_bytes fit (at least one, at most p), each reading at
            // least run_bytes unless the tensor is smaller (runs differ by an element at most).
            const std::size_t fit = std::max<std::size_t>(1, e.bytes() / run_bytes);
            CHECK(runs.size() == std::min<std::size_t>({static_cast<std::size_t>(p), fit,
                                                        dtrain::element_count(e.shape)}));
            for (const auto& run : runs)
              CHECK(run.count * dtrain::size_of(e.dtype) + dtrain::size_of(e.dtype) >=
                    std::min(e.bytes(), run_bytes));
          }
        }
        CHECK(plan.count == count);
        // Balanced: no rank reads more than the least-loaded one plus the largest run and an
        // element (greedy assignment; a tensor's runs differ by up to an element), except what
        // owners must read of their own state.
        if (!owners_read) {
          const auto [lo, hi] = std::minmax_element(bytes_of.begin(), bytes_of.end());
          CHECK(*hi - *lo <= largest_run + 8);
        }
      }
}
