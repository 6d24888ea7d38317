// SPDX-License-Identifier: BSD-3-Clause
// dtrain: replicas_identical, whether every rank holds the same parameters, bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/exec/exec_traits.hpp>

namespace dtrain {

/// Collective over `comm` (two all-reduces of one integer). True when the parameters of `model`
/// are bit-identical on every rank, as data-parallel training keeps them: each rank hashes a host
/// copy of its parameter arena (FNV-1a; downloaded through the model's execution policy, so the
/// parameters may live on a GPU) and the ranks compare the smallest and largest hash. Blocking
/// (waits for the model's compute stream, bounded by exec_timeout_s()); not thread-safe against
/// a concurrent update of the model. `model` needs parameters() and exec() (BasicSequential).
template <class Comm, class Model>
bool replicas_identical(Comm& comm, Model& model) {
  const BufferView params = model.parameters();
  std::vector<unsigned char> bytes(params.bytes());
  auto& exec = model.exec();
  exec.copy_d2h(exec.compute_stream(), bytes.data(), params.data, params.bytes());
  exec_synchronize(exec, exec.compute_stream(), exec_timeout_s(), "replicas_identical: download");
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  std::int64_t lo = static_cast<std::int64_t>(h >> 1), hi = lo;
  comm.allreduce(BufferView(&lo, 1, DType::i64), ReduceOp::min);
  comm.allreduce(BufferView(&hi, 1, DType::i64), ReduceOp::max);
  return lo == hi;
}

}  // namespace dtrain
