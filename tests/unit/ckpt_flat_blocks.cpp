// The blocks that select a run of consecutive elements of a row-major array (a rank's part of a
// sharded tensor, written in place by the parallel checkpoint strategies): checked against the
// run itself, element by element, on every run of every shape of up to 4 axes of up to 4.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/ckpt/detail/flat_blocks.hpp>

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
