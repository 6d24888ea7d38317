#include <doctest/doctest.h>

#include <dtrain/core/rng.hpp>

#include <cmath>
#include <set>
#include <vector>

using dtrain::Philox;
using dtrain::RngStream;

// Known-answer vectors for Philox4x32-10 from Random123's tests/kat_vectors (counter words
// c0..c3, key words k0 k1, expected output words).
TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  struct Kat {
    std::uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    const std::uint64_t seed = (std::uint64_t(k.key[1]) << 32) | k.key[0];
    const std::uint64_t lo = (std::uint64_t(k.ctr[1]) << 32) | k.ctr[0];
    const std::uint64_t hi = (std::uint64_t(k.ctr[3]) << 32) | k.ctr[2];
    const auto out = Philox(seed)(hi, lo);
    for (int i = 0; i < 4; ++i) CHECK(out[i] == k.out[i]);
  }
}

TEST_CASE("RngStream is reproducible, seekable and separates streams") {
  RngStream a(42, 7), b(42, 7), c(42, 8);
  std::vector<std::uint32_t> va, vc;
  for (int i = 0; i < 103; ++i) {
    va.push_back(a.next_u32());
    CHECK(b.next_u32() == va.back());
    vc.push_back(c.next_u32());
  }
  CHECK(va != vc);
  for (std::uint64_t pos : {0ull, 1ull, 3ull, 4ull, 5ull, 57ull, 100ull}) {
    RngStream s(42, 7);
    s.seek(pos);
    CHECK(s.position() == pos);
    CHECK(s.next_u32() == va[pos]);
  }
  RngStream d(42, 7);
  for (int i = 0; i < 13; ++i) d.next_u32();
  CHECK(d.position() == 13);
}

TEST_CASE("RngStream distributions are in range and roughly right") {
  RngStream s(1, 0);
  double sum = 0, sumsq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = s.uniform();
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
  }
  CHECK(std::abs(sum / n - 0.5) < 0.005);
  sum = 0;
  for (int i = 0; i < n; ++i) {
    const double z = s.normal();
    sum += z;
    sumsq += z * z;
  }
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(sumsq / n - 1.0) < 0.02);
  std::vector<int> hist(7, 0);
  for (int i = 0; i < 70000; ++i) hist[s.below(7)]++;
  for (int h : hist) CHECK(std::abs(h - 10000) < 500);
  std::set<std::uint64_t> wide;
  for (int i = 0; i < 100; ++i) {
    const auto v = s.below((1ull << 40) + 3);
    CHECK(v < (1ull << 40) + 3);
    wide.insert(v);
  }
  CHECK(wide.size() > 95);
}
