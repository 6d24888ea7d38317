// SPDX-License-Identifier: BSD-3-Clause
// dtrain: a run of consecutive elements of a row-major array as rectangular blocks. A sharded
// optimizer state holds each tensor in parts (runs of elements in row-major order); a parallel
// write selects a rank's parts in the whole tensor's dataset as the union of these blocks. Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::detail {

/// One rectangular block of an array: its first index and its extent along every axis.
struct FlatBlock {
  std::vector<std::uint64_t> start, count;
};

namespace flat_blocks_impl {

// Blocks of the elements [lo, hi) of the sub-array dims[axis..] whose indices along the axes
// before `axis` are `at`.
inline void add(const std::vector<std::uint64_t>& dims, std::size_t axis,
                std::vector<std::uint64_t>& at, std::uint64_t lo, std::uint64_t hi,
                std::vector<FlatBlock>& out) {
  if (lo >= hi) return;
  const std::size_t rank = dims.size();
  std::uint64_t inner = 1;  // elements of one index along `axis`
  for (std::size_t a = axis + 1; a < rank; ++a) inner *= dims[a];
  auto block = [&](std::uint64_t first, std::uint64_t rows) {
    FlatBlock b;
    b.start = at;
    b.start.push_back(first);
    b.start.resize(rank, 0);
    b.count.assign(axis, 1);
    b.count.push_back(rows);
    for (std::size_t a = axis + 1; a < rank; ++a) b.count.push_back(dims[a]);
    out.push_back(std::move(b));
  };
  auto partial = [&](std::uint64_t row, std::uint64_t from, std::uint64_t to) {
    at.push_back(row);
    add(dims, axis + 1, at, from, to, out);
    at.pop_back();
  };
  if (lo % inner != 0) {  // a partial first row
    const std::uint64_t row = lo / inner, row_end = (row + 1) * inner;
    partial(row, lo - row * inner, (hi < row_end ? hi : row_end) - row * inner);
    lo = row_end;
    if (lo >= hi) return;
  }
  if (hi / inner > lo / inner) {  // whole rows
    block(lo / inner, hi / inner - lo / inner);
    lo = hi / inner * inner;
  }
  if (lo < hi) partial(lo / inner, 0, hi - lo);  // a partial last row
}

}  // namespace flat_blocks_impl

/// Blocks that together select exactly the elements [first, first + n) of a row-major array of
/// shape `dims`, in ascending order and disjoint (so a union of them, read in row-major order,
/// visits the run in order): at most 2 d - 1 blocks for d axes. None when n == 0. Requires
/// first + n <= the array's element count and at least one axis (a 0-d array is one element:
/// select it whole). Pure.
inline std::vector<FlatBlock> flat_range_blocks(const std::vector<std::uint64_t>& dims,
                                                std::uint64_t first, std::uint64_t n) {
  std::vector<FlatBlock> out;
  if (n == 0 || dims.empty()) return out;
  std::vector<std::uint64_t> at;
  flat_blocks_impl::add(dims, 0, at, first, first + n, out);
  return out;
}

}  // namespace dtrain::detail
