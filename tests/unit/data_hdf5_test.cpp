// Hdf5Dataset without MPI (POSIX driver): reads equal IdxDataset reads of the same bytes, for
// contiguous, chunked and compressed layouts and float storage; every kind of bad file is an
// IoError naming the file, the dataset and what was expected.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <dtrain/data/hdf5.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/loader.hpp>

#include "unit/data_hdf5_helpers.hpp"
#include "unit/data_helpers.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_data_hdf5_test {

using namespace dtrain;
using dtrain::test::H5Spec;
using dtrain::test::TempDir;

namespace {

constexpr std::size_t kN = 257, kR = 6, kC = 5;

struct Synthetic {
  std::vector<std::uint8_t> images;
  std::vector<std::uint8_t> labels;
  Synthetic() : images(kN * kR * kC), labels(kN) {
    for (std::size_t i = 0; i < kN; ++i) {
      for (std::size_t k = 0; k < kR * kC; ++k)
        images[i * kR * kC + k] = dtrain::test::synth_pixel(i, k);
      labels[i] = dtrain::test::synth_label(i, 10);
    }
  }
};

template <class D>
void read_batch(D& ds, const std::vector<std::int64_t>& idx, std::vector<float>& f,
                std::vector<std::int32_t>& l, const Normalize& t) {
  f.assign(idx.size() * sample_elements(ds), -1.0f);
  l.assign(idx.size(), -1);
  ds.read(span<const std::int64_t>(idx.data(), idx.size()), span<float>(f), span<std::int32_t>(l),
          t);
}

template <class F>
void expect_io_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL("no exception");
  } catch (const IoError& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& frag : fragments) CHECK(msg.find(frag) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("hdf5: reads equal IDX reads of the same data for every layout") {
  TempDir dir;
  Synthetic s;
  auto idx = dtrain::test::write_synthetic_idx(dir, "ref", kN, kR, kC, false);
  IdxDataset ref(idx.images, idx.labels);
  const Shape shape{static_cast<std::int64_t>(kN), kR, kC};
  struct Layout {
    const char* name;
    hsize_t chunk;
    int gzip;
    std::size_t cache;
    bool direct;
  };
  const Normalize t = Normalize::from_unit_range(0.2860f, 0.3530f);
  const std::size_t big = std::size_t(64) << 20;
  // The last layout's cache is smaller than one chunk (the dataset raises it to one chunk).
  // "contiguous" is read with pread at the dataset's offset, "contiguous_h5" through H5Dread.
  for (Layout layout :
       {Layout{"contiguous", 0, 0, big, true}, Layout{"contiguous_h5", 0, 0, big, false},
        Layout{"chunked", 16, 0, big, true}, Layout{"gzip", 7, 4, big, true},
        Layout{"gzip_small_cache", 64, 1, 100, true}}) {
    CAPTURE(layout.name);
    const std::string path = dir.file(std::string(layout.name) + ".h5");
    dtrain::test::write_h5(
        path, {H5Spec{"train/images", H5T_STD_U8LE, H5T_NATIVE_UINT8, shape, s.images.data(),
                      layout.chunk, layout.gzip},
               H5Spec{"train/labels", H5T_STD_U8LE, H5T_NATIVE_UINT8,
                      Shape{static_cast<std::int64_t>(kN)}, s.labels.data(), layout.chunk, 0, 10}});
    Hdf5Options options;
    options.chunk_cache_bytes = layout.cache;
    options.direct_reads = layout.direct;
    if (layout.cache < 1000) options.label_cache_bytes = 0;  // labels read per batch too
    Hdf5Dataset ds(path, "train/images", "train/labels", options);
    CHECK(ds.driver() == Hdf5Driver::posix);  // MPI is not initialised in this test
    CHECK(ds.size() == kN);
    CHECK(ds.sample_shape() == Shape{kR, kC});
    CHECK(ds.num_classes() == 10);  // from the attribute
    CHECK(ds.stored_as_bytes());
    CHECK(ds.chunked() == (layout.chunk > 0));
    // Shuffled, with repeats, runs and single rows, crossing chunk boundaries.
    const std::vector<std::int64_t> rows{200, 3,  4, 5,   6,   256, 0,  17,
                                         16,  15, 3, 100, 101, 255, 128};
    std::vector<float> fa, fb;
    std::vector<std::int32_t> la, lb;
    read_batch(ds, rows, fa, la, t);
    read_batch(ref, rows, fb, lb, t);
    CHECK(std::memcmp(fa.data(), fb.data(), fa.size() * 4) == 0);
    CHECK(la == lb);
    // Whole epochs through a loader agree too.
    DistributedSampler sa(kN, 0, 1, 9), sb(kN, 0, 1, 9);
    LoaderOptions opt;
    opt.transform = t;
    Loader la_loader(ds, sa, 32, opt);
    Loader lb_loader(ref, sb, 32, opt);
    Batch ba, bb;
    std::size_t n = 0;
    while (la_loader.next(ba)) {
      REQUIRE(lb_loader.next(bb));
      CHECK(std::memcmp(ba.features.raw(), bb.features.raw(), ba.features.bytes()) == 0);
      CHECK(std::memcmp(ba.labels.raw(), bb.labels.raw(), ba.labels.bytes()) == 0);
      ++n;
    }
    CHECK(!lb_loader.next(bb));
    CHECK(n == 9);
  }
}

TEST_CASE("hdf5: float and wide-integer features are converted, then transformed") {
  TempDir dir;
  std::vector<double> f64(20 * 3);
  std::vector<std::int16_t> i16(20 * 3);
  std::vector<std::int64_t> labels(20);
  for (std::size_t i = 0; i < f64.size(); ++i) {
    f64[i] = 0.25 * static_cast<double>(i) - 3.0;
    i16[i] = static_cast<std::int16_t>(1000 - 37 * static_cast<int>(i));
  }
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i % 4);
  const std::string path = dir.file("f.h5");
  dtrain::test::write_h5(
      path, {H5Spec{"x64", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, Shape{20, 3}, f64.data()},
             H5Spec{"x16", H5T_STD_I16BE, H5T_NATIVE_INT16, Shape{20, 3}, i16.data()},
             H5Spec{"y", H5T_STD_I64LE, H5T_NATIVE_INT64, Shape{20}, labels.data()}});
  const Normalize t{2.0f, 1.0f, 4.0f};
  const std::vector<std::int64_t> rows{19, 0, 7};
  {
    Hdf5Dataset ds(path, "x64", "y");
    CHECK(!ds.stored_as_bytes());
    std::vector<float> f;
    std::vector<std::int32_t> l;
    read_batch(ds, rows, f, l, t);
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (std::size_t k = 0; k < 3; ++k) {
        const float raw = static_cast<float>(f64[static_cast<std::size_t>(rows[i]) * 3 + k]);
        CHECK(f[i * 3 + k] == doctest::Approx((raw * 2.0 - 1.0) / 4.0).epsilon(1e-6));
      }
    CHECK(l == std::vector<std::int32_t>{3, 0, 3});
  }
  {
    Hdf5Dataset ds(path, "x16", "y");
    std::vector<float> f;
    std::vector<std::int32_t> l;
    read_batch(ds, rows, f, l, t);
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (std::size_t k = 0; k < 3; ++k) {
        const double raw = i16[static_cast<std::size_t>(rows[i]) * 3 + k];
        CHECK(f[i * 3 + k] == doctest::Approx((raw * 2.0 - 1.0) / 4.0).epsilon(1e-6));
      }
  }
}

TEST_CASE("hdf5: bad files are IoErrors naming the file, the dataset and what was expected") {
  TempDir dir;
  Synthetic s;
  const Shape shape{static_cast<std::int64_t>(kN), kR, kC};
  const Shape n1{static_cast<std::int64_t>(kN)};
  std::vector<float> flabels(kN, 1.0f);
  std::vector<std::uint8_t> two_d(kN * 2, 1);
  std::vector<std::uint8_t> bad_labels = s.labels;
  bad_labels[77] = 12;
  const std::string path = dir.file("bad.h5");
  dtrain::test::write_h5(
      path,
      {H5Spec{"images", H5T_STD_U8LE, H5T_NATIVE_UINT8, shape, s.images.data()},
       H5Spec{"labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, n1, s.labels.data()},
       H5Spec{"g/float_labels", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, n1, flabels.data()},
       H5Spec{"g/labels_2d", H5T_STD_U8LE, H5T_NATIVE_UINT8,
              Shape{static_cast<std::int64_t>(kN), 2}, two_d.data()},
       H5Spec{"g/short_labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, Shape{10}, s.labels.data()},
       H5Spec{"g/flat_images", H5T_STD_U8LE, H5T_NATIVE_UINT8, n1, s.labels.data()},
       H5Spec{"g/bad_labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, n1, bad_labels.data(), 0, 0, 10}});
  {  // a string dataset
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 4);
    const hsize_t d[2] = {kN, 2};
    const hid_t sp = H5Screate_simple(2, d, nullptr);
    const hid_t ds = H5Dcreate2(f, "strings", st, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Tclose(st);
    H5Fclose(f);
  }
  SUBCASE("missing file") {
    expect_io_error([&] { Hdf5Dataset(dir.file("none.h5"), "images", "labels"); },
                    {dir.file("none.h5"), "No such file"});
  }
  SUBCASE("not an HDF5 file") {
    dtrain::test::write_file(dir.file("text.h5"), {'h', 'e', 'l', 'l', 'o'});
    expect_io_error([&] { Hdf5Dataset(dir.file("text.h5"), "images", "labels"); },
                    {dir.file("text.h5"), "as an HDF5 file", "HDF5:"});
  }
  SUBCASE("missing dataset or group") {
    expect_io_error([&] { Hdf5Dataset(path, "train/images", "labels"); },
                    {path, "no features dataset 'train/images'", "'train' does not exist"});
    expect_io_error([&] { Hdf5Dataset(path, "images", "g/nothing"); },
                    {path, "no labels dataset 'g/nothing'"});
    expect_io_error([&] { Hdf5Dataset(path, "g", "labels"); }, {path, "'g' is not a dataset"});
  }
  SUBCASE("wrong dtype") {
    expect_io_error(
        [&] { Hdf5Dataset(path, "images", "g/float_labels"); },
        {path, "'g/float_labels' holds float data", "expected an integer labels dataset"});
    expect_io_error([&] { Hdf5Dataset(path, "strings", "labels"); },
                    {path, "'strings' holds string data", "expected an integer or float features"});
  }
  SUBCASE("wrong rank") {
    expect_io_error([&] { Hdf5Dataset(path, "images", "g/labels_2d"); },
                    {path, "'g/labels_2d' has shape [257, 2]", "expected rank 1"});
    expect_io_error([&] { Hdf5Dataset(path, "g/flat_images", "labels"); },
                    {path, "'g/flat_images' has shape [257]", "expected rank >= 2"});
  }
  SUBCASE("mismatched counts") {
    expect_io_error([&] { Hdf5Dataset(path, "images", "g/short_labels"); },
                    {path, "'images' holds 257 samples", "'g/short_labels' holds 10"});
  }
  SUBCASE("labels out of range") {
    Hdf5Dataset ds(path, "images", "g/bad_labels");
    CHECK(ds.num_classes() == 10);
    std::vector<float> f;
    std::vector<std::int32_t> l;
    read_batch(ds, {1, 2, 3}, f, l, Normalize{});  // fine
    expect_io_error(
        [&] {
          read_batch(ds, {5, 77}, f, l, Normalize{});
        },
        {path, "'g/bad_labels'", "label 12 of sample 77", "[0, 10)"});
    Hdf5Options opt;
    opt.num_classes = 3;
    Hdf5Dataset narrow(path, "images", "labels", opt);
    expect_io_error(
        [&] {
          read_batch(narrow, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, f, l, Normalize{});
        },
        {path, "outside [0, 3)"});
  }
  SUBCASE("driver choices that cannot work are InvalidArgument") {
    Hdf5Options opt;
    opt.collective = true;
    CHECK_THROWS_WITH_AS(Hdf5Dataset(path, "images", "labels", opt),
                         doctest::Contains("collective reads need the MPI-IO driver"),
                         InvalidArgument);
    opt.collective = false;
    opt.driver = Hdf5Driver::mpio;
    CHECK_THROWS_WITH_AS(Hdf5Dataset(path, "images", "labels", opt),
                         doctest::Contains("needs MPI to be initialised"), InvalidArgument);
  }
}

}  // namespace dtrain_test_data_hdf5_test
