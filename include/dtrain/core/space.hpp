// SPDX-License-Identifier: BSD-3-Clause
// dtrain: memory space tags.
#pragma once

namespace dtrain {

/// Where memory lives. Kernels dispatch on the tag types below; buffers carry the enum.
enum class Space : unsigned char { host, cuda, hip };

/// Tag for host (CPU) memory and kernels.
struct Host {
  static constexpr Space space = Space::host;
};
/// Tag for CUDA device memory and kernels (see <dtrain/kernels/gpu.hpp>).
struct Cuda {
  static constexpr Space space = Space::cuda;
};
/// Tag for HIP device memory and kernels (see <dtrain/kernels/gpu.hpp>).
struct Hip {
  static constexpr Space space = Space::hip;
};

constexpr const char* name_of(Space s) noexcept {
  switch (s) {
    case Space::host: return "host";
    case Space::cuda: return "cuda";
    case Space::hip: return "hip";
  }
  return "?";
}

}  // namespace dtrain
