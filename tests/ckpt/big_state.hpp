// Checkpoint tests: a large, deterministic tensor so that a save takes long enough to be
// interrupted in the middle.
#pragma once

#include <cstdint>

#include <dtrain/core/tensor.hpp>

namespace dtrain::test {

struct BigState {
  Tensor data;
  explicit BigState(std::int64_t mib) : data({mib, 262144}, DType::f32) {}
  void fill(std::uint32_t salt) {
    auto v = data.as<float>();
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>((static_cast<std::uint32_t>(i) * 2654435761u) ^ salt);
  }
  bool holds(std::uint32_t salt) const {
    auto v = data.as<float>();
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] != static_cast<float>((static_cast<std::uint32_t>(i) * 2654435761u) ^ salt))
        return false;
    return true;
  }
  template <class V>
  void visit_state(V& v) {
    v.tensor("data", data.view(), data.shape());
  }
};

}  // namespace dtrain::test
