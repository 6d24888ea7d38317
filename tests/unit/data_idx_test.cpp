// IDX reading: plain and gzip give the same data, every kind of bad input is a clear IoError,
// and the real Fashion-MNIST files (when installed) match an independent gzip decompression.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <dtrain/data/idx.hpp>

#include "unit/data_helpers.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_data_idx_test {

using dtrain::IdxDataset;
using dtrain::IoError;
using dtrain::Normalize;
using dtrain::test::idx_bytes;
using dtrain::test::TempDir;
using dtrain::test::write_file;

namespace {

std::vector<float> read_all(IdxDataset& ds, const std::vector<std::int64_t>& idx,
                            const Normalize& t, std::vector<std::int32_t>& labels) {
  std::vector<float> f(idx.size() * dtrain::sample_elements(ds));
  labels.assign(idx.size(), -1);
  ds.read(dtrain::span<const std::int64_t>(idx.data(), idx.size()), dtrain::span<float>(f),
          dtrain::span<std::int32_t>(labels), t);
  return f;
}

// Expects an IoError whose message contains every fragment.
template <class F>
void expect_io_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL("no exception");
  } catch (const IoError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.rfind("dtrain: rank ", 0) == 0);
    for (const auto& frag : fragments) CHECK(msg.find(frag) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("idx: plain and gzip files give the same samples, transformed as specified") {
  TempDir dir;
  auto plain = dtrain::test::write_synthetic_idx(dir, "plain", 37, 5, 3, false);
  auto gz = dtrain::test::write_synthetic_idx(dir, "gz", 37, 5, 3, true);
  IdxDataset a(plain.images, plain.labels), b(gz.images, gz.labels);
  CHECK(a.size() == 37);
  CHECK(a.sample_shape() == dtrain::Shape{5, 3});
  CHECK(b.sample_shape() == dtrain::Shape{5, 3});
  const Normalize t = Normalize::from_unit_range(0.25f, 0.5f);
  const std::vector<std::int64_t> idx{36, 0, 5, 5, 17, 1};
  std::vector<std::int32_t> la, lb;
  auto fa = read_all(a, idx, t, la), fb = read_all(b, idx, t, lb);
  CHECK(fa == fb);
  CHECK(la == lb);
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const std::size_t s = static_cast<std::size_t>(idx[i]);
    CHECK(la[i] == dtrain::test::synth_label(s, 10));
    for (std::size_t k = 0; k < 15; ++k) {
      const double raw = dtrain::test::synth_pixel(s, k);
      const float want = static_cast<float>((raw / 255.0 - 0.25) / 0.5);
      CHECK(fa[i * 15 + k] == doctest::Approx(want).epsilon(1e-6));
    }
  }
  auto arr = dtrain::read_idx(gz.images);
  CHECK(arr.type == 0x08);
  CHECK(arr.shape == dtrain::Shape{37, 5, 3});
  CHECK(arr.data[14] == dtrain::test::synth_pixel(0, 14));
}

TEST_CASE("idx: read_idx converts multi-byte elements to host order") {
  TempDir dir;
  write_file(dir.file("i32"), idx_bytes(0x0C, {2}, {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe}));
  auto a = dtrain::read_idx(dir.file("i32"));
  std::int32_t v[2];
  std::memcpy(v, a.data.data(), 8);
  CHECK(v[0] == 258);
  CHECK(v[1] == -2);
}

TEST_CASE("idx: bad input is an IoError naming the file and what was expected") {
  TempDir dir;
  auto good = dtrain::test::write_synthetic_idx(dir, "good", 10, 4, 4, false);
  auto good_gz = dtrain::test::write_synthetic_idx(dir, "goodgz", 10, 4, 4, true);
  std::vector<unsigned char> img(10 * 16, 1), lab(10, 1);

  SUBCASE("missing file") {
    expect_io_error([&] { IdxDataset(dir.file("nope"), good.labels); },
                    {dir.file("nope"), "cannot open", "No such file"});
  }
  SUBCASE("wrong magic") {
    auto bytes = idx_bytes(0x08, {10, 4, 4}, img);
    bytes[0] = 0x12;
    write_file(dir.file("magic"), bytes);
    expect_io_error([&] { IdxDataset(dir.file("magic"), good.labels); },
                    {dir.file("magic"), "not an IDX file", "0x12"});
    write_file(dir.file("typecode"), idx_bytes(0x07, {10}, lab));
    expect_io_error([&] { IdxDataset(good.images, dir.file("typecode")); },
                    {dir.file("typecode"), "not an IDX file"});
  }
  SUBCASE("truncated plain and gzip files") {
    auto bytes = idx_bytes(0x08, {10, 4, 4}, img);
    bytes.resize(bytes.size() - 5);
    write_file(dir.file("short"), bytes);
    expect_io_error([&] { IdxDataset(dir.file("short"), good.labels); },
                    {dir.file("short"), "truncated", "160 data bytes", "holds 155"});
    write_file(dir.file("short.gz"), bytes, true);
    expect_io_error([&] { IdxDataset(dir.file("short.gz"), good.labels); },
                    {dir.file("short.gz"), "truncated", "holds 155"});
    // A gzip stream cut short (the compressed file itself truncated).
    FILE* f = std::fopen(good_gz.images.c_str(), "rb");
    std::vector<unsigned char> z(4096);
    z.resize(std::fread(z.data(), 1, z.size(), f));
    std::fclose(f);
    z.resize(z.size() / 2);
    write_file(dir.file("cut.gz"), z);
    expect_io_error([&] { IdxDataset(dir.file("cut.gz"), good.labels); }, {dir.file("cut.gz")});
    // A small gzip file whose header claims 2^40 bytes: truncated, without allocating them.
    write_file(dir.file("huge.gz"), idx_bytes(0x08, {1u << 20, 1u << 10, 1u << 10}, img), true);
    expect_io_error([&] { IdxDataset(dir.file("huge.gz"), good.labels); },
                    {dir.file("huge.gz"), "truncated", "1099511627776 data bytes", "holds 160"});
    write_file(dir.file("header"), {0, 0, 8, 3, 0, 0});
    expect_io_error([&] { IdxDataset(dir.file("header"), good.labels); },
                    {dir.file("header"), "truncated inside its header"});
  }
  SUBCASE("trailing bytes") {
    auto bytes = idx_bytes(0x08, {10, 4, 4}, img);
    bytes.push_back(0);
    write_file(dir.file("long"), bytes);
    expect_io_error([&] { IdxDataset(dir.file("long"), good.labels); },
                    {dir.file("long"), "1 bytes after"});
  }
  SUBCASE("mismatched image and label counts") {
    write_file(dir.file("lab9"), idx_bytes(0x08, {9}, std::vector<unsigned char>(9, 1)));
    expect_io_error([&] { IdxDataset(good.images, dir.file("lab9")); },
                    {good.images, dir.file("lab9"), "10 samples", "hold 9"});
  }
  SUBCASE("labels out of range") {
    std::vector<unsigned char> bad = lab;
    bad[6] = 10;
    write_file(dir.file("lab_range"), idx_bytes(0x08, {10}, bad));
    expect_io_error([&] { IdxDataset(good.images, dir.file("lab_range")); },
                    {dir.file("lab_range"), "label 10 of sample 6", "[0, 10)"});
    IdxDataset wide(good.images, dir.file("lab_range"), dtrain::IdxOptions{11});
    CHECK(wide.label(6) == 10);
  }
  SUBCASE("wrong element type or rank") {
    write_file(dir.file("f32"), idx_bytes(0x0D, {10, 4}, std::vector<unsigned char>(160, 0)));
    expect_io_error([&] { IdxDataset(dir.file("f32"), good.labels); },
                    {dir.file("f32"), "f32", "expected unsigned bytes"});
    write_file(dir.file("flat"), idx_bytes(0x08, {10}, lab));
    expect_io_error([&] { IdxDataset(dir.file("flat"), good.labels); },
                    {dir.file("flat"), "at least 2 dimensions"});
    expect_io_error([&] { IdxDataset(good.images, good.images); },
                    {good.images, "expected unsigned bytes (type code 0x08) of shape [samples]"});
  }
  SUBCASE("indices out of range are InvalidArgument") {
    IdxDataset ds(good.images, good.labels);
    std::vector<std::int64_t> idx{3, 10};
    std::vector<std::int32_t> l;
    CHECK_THROWS_WITH_AS(read_all(ds, idx, Normalize{}, l), doctest::Contains("sample index 10"),
                         dtrain::InvalidArgument);
  }
}

TEST_CASE("idx: Fashion-MNIST matches an independent gzip decompression") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  const std::string images = dir + "/t10k-images-idx3-ubyte.gz",
                    labels = dir + "/t10k-labels-idx1-ubyte.gz";
  if (FILE* f = std::fopen(images.c_str(), "rb")) {
    std::fclose(f);
  } else {
    MESSAGE("SKIPPED: Fashion-MNIST not installed (" << images
                                                     << "); apt-get install dataset-fashion-mnist");
    return;
  }
  IdxDataset ds(images, labels);
  REQUIRE(ds.size() == 10000);
  REQUIRE(ds.sample_shape() == dtrain::Shape{28, 28});
  // Reference: the gzip tool's output, parsed by hand (16-byte image header, 8-byte label header).
  auto gunzip = [](const std::string& path) {
    std::vector<unsigned char> out;
    FILE* p = popen(("gzip -dc '" + path + "'").c_str(), "r");
    REQUIRE(p);
    unsigned char buf[65536];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.insert(out.end(), buf, buf + n);
    pclose(p);
    return out;
  };
  const auto raw_images = gunzip(images), raw_labels = gunzip(labels);
  REQUIRE(raw_images.size() == 16 + 10000u * 784u);
  REQUIRE(raw_labels.size() == 8 + 10000u);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < 10000; ++i) {
    if (ds.label(i) != raw_labels[8 + i]) ++mismatches;
    if (std::memcmp(ds.image(i), raw_images.data() + 16 + i * 784, 784) != 0) ++mismatches;
  }
  CHECK(mismatches == 0);
}

}  // namespace dtrain_test_data_idx_test
