// SPDX-License-Identifier: BSD-3-Clause
// dtrain: evaluate_accuracy, the distributed accuracy of a classifier on a dataset.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/transform.hpp>

namespace dtrain {

/// Collective over `comm` (one all-reduce of two integers). The fraction of rows [0, limit) of
/// `dataset` that `model` classifies correctly: each rank evaluates its contiguous share of those
/// rows (rank r of p: rows [n r / p, n (r + 1) / p)), reading `chunk` rows at a time transformed
/// by `transform`, and the counts are summed exactly before the division, so every rank returns
/// the same value whatever the world size. `model` needs count_correct(const float* x, const
/// std::int32_t* labels, std::int64_t rows) (dtrain::BasicSequential); `dataset` meets the dataset
/// requirement (<dtrain/data/dataset.hpp>). Blocking; buffers are this call's own.
template <class Comm, class Model, class Dataset>
double evaluate_accuracy(Comm& comm, Model& model, Dataset& dataset, const Normalize& transform,
                         std::size_t limit, std::size_t chunk = 1000) {
  static_assert(is_dataset_v<Dataset>,
                "evaluate_accuracy: Dataset must meet the dataset requirement");
  const std::size_t n = std::min(limit, dataset.size());
  const std::size_t p = static_cast<std::size_t>(comm.size());
  const std::size_t r = static_cast<std::size_t>(comm.rank());
  const std::size_t begin = n * r / p, end = n * (r + 1) / p;
  const std::size_t features = sample_elements(dataset);
  chunk = std::max<std::size_t>(chunk, 1);
  std::vector<std::int64_t> idx;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::int64_t counts[2] = {0, static_cast<std::int64_t>(end - begin)};
  for (std::size_t s = begin; s < end; s += chunk) {
    const std::size_t b = std::min(chunk, end - s);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::int64_t>(s + i);
    x.resize(b * features);
    y.resize(b);
    dataset.read(span<const std::int64_t>(idx.data(), b), span<float>(x.data(), x.size()),
                 span<std::int32_t>(y.data(), b), transform);
    counts[0] += model.count_correct(x.data(), y.data(), static_cast<std::int64_t>(b));
  }
  comm.allreduce(BufferView(counts, 2, DType::i64), ReduceOp::sum);
  return counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
}

}  // namespace dtrain
