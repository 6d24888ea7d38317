// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the loop shape of the host kernels' element-wise passes, vectorised at -O2 as at -O3.
#pragma once

#include <cstddef>

namespace dtrain {
namespace host {
namespace detail {

/// Bytes of the blocks elementwise() runs its body over.
inline constexpr std::size_t kElementBlockBytes = 256;

/// Runs body(i) for i = 0 .. n-1, where body(i) reads and writes element i of its arrays only
/// (arrays equal or disjoint, never offset against each other): in blocks of
/// kElementBlockBytes / sizeof(T) elements, each a loop of fixed length marked free of
/// dependences between iterations, then the rest one by one. Written as one loop over 0 .. n,
/// these passes were vectorised at -O3 only: at -O2 (CMake's RelWithDebInfo, nvcc's host pass)
/// GCC 12 vectorises neither a loop whose length is known only at run time (that needs a
/// remainder loop) nor one whose arrays may overlap (that needs a check at run time), so the
/// collectives reduced one element at a time there and ReLU took a branch per element, taken or
/// not at random (benchmarks/RESULTS.md). Clang vectorises such loops at -O2 with checks of its
/// own; a clang loop pragma asking for it warned wherever the element type does not vectorise
/// (16-bit floats), so clang gets none. Local.
template <class T, class Body>
inline void elementwise(std::size_t n, Body&& body) {
  constexpr std::size_t block = kElementBlockBytes / sizeof(T);
  const std::size_t whole = n - n % block;
  for (std::size_t i = 0; i < whole; i += block) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
    for (std::size_t j = 0; j < block; ++j) body(i + j);
  }
  for (std::size_t i = whole; i < n; ++i) body(i);
}

}  // namespace detail
}  // namespace host
}  // namespace dtrain
