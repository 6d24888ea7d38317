// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the unit a Loader hands to the training loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <dtrain/core/tensor.hpp>

namespace dtrain {

/// One rank's batch. `features` is f32 row-major [size, ...sample shape] (or [size, elements] when
/// the loader flattens), already transformed; `labels` is i32 [size]; `indices[i]` is the dataset
/// index of row i. Every rank of an epoch receives the same `size` for the same `number`.
/// Local value type, owned by whoever holds it; a Loader swaps buffers in and out of it, so keep
/// a Batch object alive across next() calls to reuse its memory.
struct Batch {
  Tensor features;
  Tensor labels;
  std::vector<std::int64_t> indices;
  std::size_t size = 0;
  /// Epoch this batch belongs to and its number within the loader's pass over that epoch.
  std::int64_t epoch = 0;
  std::size_t number = 0;
};

}  // namespace dtrain
