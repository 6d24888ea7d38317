#include <doctest/doctest.h>

#include <dtrain/core/tensor.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace dtrain;

TEST_CASE("Tensor owns zeroed, aligned memory and moves") {
  Tensor t({3, 5}, DType::f32);
  CHECK(t.size() == 15);
  CHECK(t.bytes() == 60);
  CHECK(reinterpret_cast<std::uintptr_t>(t.raw()) % 64 == 0);
  auto v = t.as<float>();
  for (float x : v) CHECK(x == 0.0f);
  v[14] = 2.5f;
  Tensor u = std::move(t);
  CHECK(u.as<float>()[14] == 2.5f);
  CHECK(t.size() == 0);
  Tensor c = u.clone();
  c.as<float>()[14] = 1.0f;
  CHECK(u.as<float>()[14] == 2.5f);
  u.reshape({15});
  CHECK(u.shape() == Shape{15});
  CHECK_THROWS_AS(u.reshape({4, 4}), InvalidArgument);
  Tensor empty({0, 7}, DType::f64);
  CHECK(empty.size() == 0);
}

TEST_CASE("host allocator: large blocks start at staggered offsets within a page") {
  HostAllocator a;
  // Four blocks of example 10's arena size, as a model, its gradients and AdamW's moments take
  // them: aligned, zeroed, writable to the last byte, and no two at the same offset in a page
  // (from the C heap directly all four were, and AdamW over them ran 3-4x slower).
  const std::size_t bytes = 269322 * sizeof(float);
  std::vector<unsigned char*> blocks;
  std::vector<std::size_t> offsets;
  for (int k = 0; k < 4; ++k) {
    auto* p = static_cast<unsigned char*>(a.allocate(bytes, 64));
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    CHECK(p[0] == 0);
    CHECK(p[bytes - 1] == 0);
    p[0] = p[bytes - 1] = 1;
    const std::size_t off = reinterpret_cast<std::uintptr_t>(p) % 4096;
    for (std::size_t o : offsets) CHECK(o != off);
    offsets.push_back(off);
    blocks.push_back(p);
  }
  // A larger alignment is kept; small blocks come from the heap as they are.
  auto* page = static_cast<unsigned char*>(a.allocate(1 << 20, 4096));
  CHECK(reinterpret_cast<std::uintptr_t>(page) % 4096 == 0);
  auto* small = static_cast<unsigned char*>(a.allocate(100, 64));
  CHECK(reinterpret_cast<std::uintptr_t>(small) % 64 == 0);
  a.deallocate(small, 100);
  a.deallocate(page, 1 << 20);
  for (auto* p : blocks) a.deallocate(p, bytes);  // the sanitizer builds check these frees
  a.deallocate(nullptr, bytes);
}

TEST_CASE("a view of the wrong dtype is refused with the rank and operation in the message") {
  detail::RankScope scope(3);
  Tensor t({4}, DType::f32);
  try {
    (void)t.as<double>("allreduce");
    FAIL("expected InvalidArgument");
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    CHECK(m.find("dtrain: rank 3: allreduce") == 0);
    CHECK(m.find("f32") != std::string::npos);
    CHECK(m.find("f64") != std::string::npos);
  }
}

TEST_CASE("span and BufferView bounds are checked") {
  std::vector<int> v(10);
  span<int> s(v);
  CHECK(s.size() == 10);
  CHECK(s.subspan(8, 2).size() == 2);
  CHECK_THROWS_AS(s.subspan(8, 3), InvalidArgument);
  std::vector<std::int64_t> w(6, 7);
  BufferView b(span<std::int64_t>(w.data(), w.size()));
  CHECK(b.dtype == DType::i64);
  CHECK(b.bytes() == 48);
  CHECK(b.slice(2, 4).as<std::int64_t>()[0] == 7);
  CHECK_THROWS_AS(b.slice(5, 2), InvalidArgument);
  CHECK_THROWS_AS(b.as<std::int32_t>(), InvalidArgument);
  CHECK_THROWS_AS(Tensor({-1}, DType::f32), InvalidArgument);
}
