// CRC32C: published check values, hardware path against the portable table path.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/core/rng.hpp>

// Bit-at-a-time reference, written from the definition (reflected polynomial 0x82F63B78).
static std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST_CASE("crc32c matches published check values") {
  const char* nine = "123456789";
  CHECK(dtrain::crc32c(nine, 9) == 0xE3069283u);
  CHECK(dtrain::crc32c_portable(nine, 9) == 0xE3069283u);
  // RFC 3720 (iSCSI) appendix B.4 vectors.
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
    dec[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  CHECK(dtrain::crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(dtrain::crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(dtrain::crc32c(inc.data(), 32) == 0x46DD794Eu);
  CHECK(dtrain::crc32c(dec.data(), 32) == 0x113FDB5Cu);
  CHECK(dtrain::crc32c(nullptr, 0) == 0u);
}

TEST_CASE("crc32c: fast paths agree with the bitwise definition at every length and alignment") {
  dtrain::RngStream rng(5, 1);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng.next_u32());
  for (std::size_t off = 0; off < 9; ++off)
    for (std::size_t n : {0ul, 1ul, 3ul, 7ul, 8ul, 9ul, 15ul, 63ul, 64ul, 65ul, 1000ul, 4096ul}) {
      const auto* p = buf.data() + off;
      const std::uint32_t ref = crc32c_bitwise(p, n);
      CHECK(dtrain::crc32c(p, n) == ref);
      CHECK(dtrain::crc32c_portable(p, n) == ref);
    }
}

TEST_CASE("crc32c continues across split buffers") {
  std::string s = "The quick brown fox jumps over the lazy dog, twice: the quick brown fox.";
  const std::uint32_t whole = dtrain::crc32c(s.data(), s.size());
  for (std::size_t cut = 0; cut <= s.size(); cut += 5) {
    const std::uint32_t a = dtrain::crc32c(s.data(), cut);
    CHECK(dtrain::crc32c(s.data() + cut, s.size() - cut, a) == whole);
    CHECK(dtrain::crc32c_portable(s.data() + cut, s.size() - cut, a) == whole);
  }
}

TEST_CASE("crc32c_combine joins the checksums of two pieces") {
  // Pieces of every length up to 70 bytes, and of a 3 MiB buffer at cuts of many magnitudes.
  std::string s = "The quick brown fox jumps over the lazy dog, twice: the quick brown fox.";
  const std::uint32_t whole = dtrain::crc32c(s.data(), s.size());
  for (std::size_t cut = 0; cut <= s.size(); ++cut) {
    CAPTURE(cut);
    const std::uint32_t a = dtrain::crc32c(s.data(), cut);
    const std::uint32_t b = dtrain::crc32c(s.data() + cut, s.size() - cut);
    CHECK(dtrain::crc32c_combine(a, b, s.size() - cut) == whole);
  }
  std::vector<unsigned char> big(3u << 20);
  std::uint32_t x = 12345;
  for (auto& c : big) c = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  const std::uint32_t all = dtrain::crc32c(big.data(), big.size());
  for (std::size_t cut :
       {std::size_t{1}, std::size_t{4095}, std::size_t{65536}, big.size() / 3, big.size() - 7}) {
    CAPTURE(cut);
    CHECK(dtrain::crc32c_combine(dtrain::crc32c(big.data(), cut),
                                 dtrain::crc32c(big.data() + cut, big.size() - cut),
                                 big.size() - cut) == all);
  }
  // Three pieces, combined left to right.
  const std::size_t c1 = 1000, c2 = 2u << 20;
  std::uint32_t acc = dtrain::crc32c(big.data(), c1);
  acc = dtrain::crc32c_combine(acc, dtrain::crc32c(big.data() + c1, c2 - c1), c2 - c1);
  acc = dtrain::crc32c_combine(acc, dtrain::crc32c(big.data() + c2, big.size() - c2),
                               big.size() - c2);
  CHECK(acc == all);
}
