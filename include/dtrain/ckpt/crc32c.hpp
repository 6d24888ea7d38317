// SPDX-License-Identifier: BSD-3-Clause
// dtrain: CRC32C (Castagnoli), the checksum stored with every checkpoint dataset.
//
// Software path: slicing-by-8 over tables built at compile time. Hardware path: the SSE4.2 crc32
// instruction (x86-64, chosen at run time) or the ARMv8 CRC extension (when compiled in). Both
// give identical results; tests compare them with each other and with published check values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
#include <nmmintrin.h>
#define DTRAIN_CRC32C_X86 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define DTRAIN_CRC32C_ARM 1
#endif

namespace dtrain {

namespace detail {

struct Crc32cTables {
  std::uint32_t t[8][256];
};

constexpr Crc32cTables make_crc32c_tables() {
  Crc32cTables tab{};
  // Reflected Castagnoli polynomial 0x1EDC6F41.
  constexpr std::uint32_t poly = 0x82F63B78u;
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ poly : (c >> 1);
    tab.t[0][i] = c;
  }
  // t[k][i] advances t[k-1][i] by one more zero byte, so eight lookups consume eight bytes.
  for (int k = 1; k < 8; ++k)
    for (std::uint32_t i = 0; i < 256; ++i) {
      const std::uint32_t prev = tab.t[k - 1][i];
      tab.t[k][i] = (prev >> 8) ^ tab.t[0][prev & 0xffu];
    }
  return tab;
}

inline constexpr Crc32cTables crc32c_tables = make_crc32c_tables();

/// Software CRC32C on the raw (pre/post-inverted) register. Local, pure.
inline std::uint32_t crc32c_sw_raw(std::uint32_t crc, const unsigned char* p,
                                   std::size_t n) noexcept {
  const auto& t = crc32c_tables.t;
  while (n && (reinterpret_cast<std::uintptr_t>(p) & 7u)) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
    --n;
  }
  while (n >= 8) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    // The tables assume little-endian word loads.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    lo = __builtin_bswap32(lo);
    hi = __builtin_bswap32(hi);
#endif
    lo ^= crc;
    crc = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return crc;
}

#if defined(DTRAIN_CRC32C_X86)
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_raw(std::uint32_t crc,
                                                                     const unsigned char* p,
                                                                     std::size_t n) noexcept {
  while (n && (reinterpret_cast<std::uintptr_t>(p) & 7u)) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  crc = static_cast<std::uint32_t>(c);
  while (n--) crc = _mm_crc32_u8(crc, *p++);
  return crc;
}
inline bool crc32c_hw_available() noexcept {
  static const bool ok = __builtin_cpu_supports("sse4.2");
  return ok;
}
#elif defined(DTRAIN_CRC32C_ARM)
inline std::uint32_t crc32c_hw_raw(std::uint32_t crc, const unsigned char* p,
                                   std::size_t n) noexcept {
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    crc = __crc32cd(crc, w);
    p += 8;
    n -= 8;
  }
  while (n--) crc = __crc32cb(crc, *p++);
  return crc;
}
inline bool crc32c_hw_available() noexcept { return true; }
#else
inline std::uint32_t crc32c_hw_raw(std::uint32_t crc, const unsigned char* p,
                                   std::size_t n) noexcept {
  return crc32c_sw_raw(crc, p, n);
}
inline bool crc32c_hw_available() noexcept { return false; }
#endif

}  // namespace detail

/// CRC32C of `n` bytes at `data`, continuing from `crc` (the value returned for the preceding
/// bytes; 0 to start). Local, pure, thread-safe. crc32c("123456789") == 0xE3069283.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint32_t raw = ~crc;
  return ~(detail::crc32c_hw_available() ? detail::crc32c_hw_raw(raw, p, n)
                                         : detail::crc32c_sw_raw(raw, p, n));
}

namespace detail {
/// a * b modulo the CRC32C polynomial, in the reflected bit order of the CRC register (bit 31
/// is x^0). Pure.
inline std::uint32_t crc32c_mulmod(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ 0x82F63B78u : b >> 1;  // b * x
  }
  return product;
}
}  // namespace detail

/// The CRC32C of A followed by B from crc32c(A), crc32c(B) and B's length in bytes: lets ranks
/// checksum their own parts of a tensor and one rank combine them. Local, pure; O(log len_b).
inline std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                                    std::size_t len_b) noexcept {
  // crc(A B) = crc(A) * x^(8 len_b) + crc(B) (the pre- and post-inversions cancel).
  std::uint32_t shift = 1u << 31;  // x^0
  std::uint32_t power = 1u << 23;  // x^8, squared for each bit of len_b
  for (std::size_t n = len_b; n != 0; n >>= 1) {
    if (n & 1u) shift = detail::crc32c_mulmod(shift, power);
    power = detail::crc32c_mulmod(power, power);
  }
  return detail::crc32c_mulmod(crc_a, shift) ^ crc_b;
}

/// Same as crc32c() but always on the portable table path (for tests and odd platforms).
inline std::uint32_t crc32c_portable(const void* data, std::size_t n,
                                     std::uint32_t crc = 0) noexcept {
  return ~detail::crc32c_sw_raw(~crc, static_cast<const unsigned char*>(data), n);
}

}  // namespace dtrain
