// SPDX-License-Identifier: BSD-3-Clause
// dtrain: counter-based random numbers (Philox4x32-10). The value at (seed, stream, index) is a
// pure function, so every rank computes the same stream without communication and any position
// can be reached in O(1) (dropout masks per sample, shuffles per epoch, initialisation).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include <dtrain/core/host_device.hpp>

namespace dtrain {

namespace detail {
/// Philox4x32-10 on a counter held in c[0..3] (little end first) with key (k0, k1), in place.
/// DTRAIN_HOST_DEVICE: host code (Philox) and device kernels (dropout masks) share this one
/// definition, so both draw the same bits for the same counter.
DTRAIN_HOST_DEVICE constexpr void philox4x32_10(std::uint32_t* c, std::uint32_t k0,
                                                std::uint32_t k1) noexcept {
  for (int r = 0; r < 10; ++r) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32),
                        lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32),
                        lo1 = static_cast<std::uint32_t>(p1);
    const std::uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}
}  // namespace detail

/// Philox4x32 with 10 rounds (Salmon, Moraes, Dror, Shaw, SC'11). Pure and thread-safe.
class Philox {
 public:
  using Block = std::array<std::uint32_t, 4>;

  explicit constexpr Philox(std::uint64_t seed) noexcept
      : k0_(static_cast<std::uint32_t>(seed)), k1_(static_cast<std::uint32_t>(seed >> 32)) {}

  /// 128 random bits for the 128-bit counter (hi, lo).
  constexpr Block operator()(std::uint64_t hi, std::uint64_t lo) const noexcept {
    std::uint32_t c[4] = {static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(lo >> 32),
                          static_cast<std::uint32_t>(hi), static_cast<std::uint32_t>(hi >> 32)};
    detail::philox4x32_10(c, k0_, k1_);
    return Block{c[0], c[1], c[2], c[3]};
  }

 private:
  std::uint32_t k0_, k1_;
};

/// Maps 32 random bits to a float in [0, 1) with 24 significant bits. Host and device.
DTRAIN_HOST_DEVICE constexpr float u32_to_unit_float(std::uint32_t x) noexcept {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}
/// Maps 64 random bits to a double in [0, 1) with 53 significant bits.
constexpr double u64_to_unit_double(std::uint64_t x) noexcept {
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
}

/// A sequential stream over Philox: (seed, stream) select the sequence, `position` counts the
/// 128-bit blocks consumed. Local object, not thread-safe; copy it per thread. Its whole state is
/// the three integers, so it checkpoints exactly.
class RngStream {
 public:
  RngStream() : RngStream(0, 0) {}
  RngStream(std::uint64_t seed, std::uint64_t stream) noexcept
      : seed_(seed), stream_(stream), gen_(seed) {}

  std::uint32_t next_u32() noexcept {
    if (used_ == 4) refill();
    return block_[used_++];
  }
  std::uint64_t next_u64() noexcept {
    const std::uint64_t lo = next_u32();
    return (static_cast<std::uint64_t>(next_u32()) << 32) | lo;
  }
  /// Uniform in [0, 1).
  float uniform() noexcept { return u32_to_unit_float(next_u32()); }
  double uniform_double() noexcept { return u64_to_unit_double(next_u64()); }
  /// Standard normal (Box-Muller on two doubles; the second value is discarded so the stream
  /// position depends only on how many normals were drawn).
  double normal() noexcept {
    double u1 = uniform_double();
    const double u2 = uniform_double();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
  }
  /// Uniform integer in [0, n), n > 0, without modulo bias (Lemire's multiply-and-reject).
  std::uint64_t below(std::uint64_t n) noexcept {
    if (n <= 1) return 0;
    if (n <= 0xffffffffu) {
      const std::uint32_t n32 = static_cast<std::uint32_t>(n);
      std::uint64_t m = static_cast<std::uint64_t>(next_u32()) * n32;
      std::uint32_t l = static_cast<std::uint32_t>(m);
      if (l < n32) {
        const std::uint32_t t = static_cast<std::uint32_t>(-n32) % n32;
        while (l < t) {
          m = static_cast<std::uint64_t>(next_u32()) * n32;
          l = static_cast<std::uint32_t>(m);
        }
      }
      return m >> 32;
    }
    // Wide range: rejection on the smallest covering power of two.
    std::uint64_t mask = n - 1;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    for (;;) {
      const std::uint64_t v = next_u64() & mask;
      if (v < n) return v;
    }
  }

  std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t stream() const noexcept { return stream_; }
  /// Number of values (32-bit words) drawn so far.
  std::uint64_t position() const noexcept { return counter_ * 4 - (4 - used_) * (counter_ > 0); }
  /// Jumps to a position previously returned by position().
  void seek(std::uint64_t words) noexcept {
    counter_ = words / 4;
    used_ = 4;
    const unsigned skip = static_cast<unsigned>(words % 4);
    if (skip) {
      refill();
      used_ = skip;
    }
  }

  /// Checkpoint protocol (see <dtrain/core/state.hpp>).
  template <class V>
  void visit_state(V& v) {
    std::int64_t seed = static_cast<std::int64_t>(seed_),
                 stream = static_cast<std::int64_t>(stream_);
    std::int64_t pos = static_cast<std::int64_t>(position());
    v.scalar("seed", seed);
    v.scalar("stream", stream);
    v.scalar("position", pos);
    if (v.loading()) {
      *this = RngStream(static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(stream));
      seek(static_cast<std::uint64_t>(pos));
    }
  }

 private:
  void refill() noexcept {
    block_ = gen_(stream_, counter_++);
    used_ = 0;
  }
  std::uint64_t seed_, stream_;
  Philox gen_;
  std::uint64_t counter_ = 0;
  Philox::Block block_{};
  unsigned used_ = 4;
};

}  // namespace dtrain
