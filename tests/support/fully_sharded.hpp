// Test support for fully sharded training: inputs from a seed, one training step in either mode
// (fully sharded, or replicated with a GradientSync), and the comparison of a rank's parts with
// the replicated run's whole arena. Shared by the thread-rank and MPI tests of FullyShardedSync
// and of its checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/model.hpp>

namespace dtrain::test {

/// A value in [-1, 1] from (seed, i): the tests' inputs and targets, the same on every run.
inline float hashed_value(std::uint64_t seed, std::size_t i) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
  s ^= s >> 31, s *= 0x94D049BB133111EBull, s ^= s >> 29;
  return static_cast<float>(static_cast<double>(s % 1000003) / 500001.0 - 1.0);
}

/// One step: zero the gradients, forward and backward `rows` samples, then either the fully
/// sharded sync's wait (its update included) when `sharded` is given, or the all-reduce's wait
/// and the optimizer's step.
template <class Model, class Label, class Optimizer>
void fully_sharded_or_replicated_step(Model& model, const float* x, const Label* y,
                                      std::int64_t rows, Loss loss,
                                      FullyShardedSync<Model>* sharded, GradientSync* sync,
                                      Optimizer& opt) {
  model.zero_grad();
  if (sharded) {
    model.forward_backward(x, y, rows, loss);
    sharded->wait(opt);
  } else {
    model.forward_backward(x, y, rows, loss, *sync);
    sync->wait();
    opt.step();
  }
}

/// The replicated arena's elements at a sharded rank's parts, back to back.
inline std::vector<float> pick(const std::vector<float>& whole, const StateParts& parts) {
  std::vector<float> v;
  for (const auto& [first, count] : parts)
    v.insert(v.end(), whole.begin() + static_cast<std::ptrdiff_t>(first),
             whole.begin() + static_cast<std::ptrdiff_t>(first + count));
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace dtrain::test
