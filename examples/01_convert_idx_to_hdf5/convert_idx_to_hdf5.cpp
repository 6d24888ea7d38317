// Converts Fashion-MNIST (IDX files, plain or gzip) into one HDF5 file that Hdf5Dataset reads:
//   /train/images  uint8 [60000, 28, 28]    /train/labels  uint8 [60000]
//   /test/images   uint8 [10000, 28, 28]    /test/labels   uint8 [10000]
// with attributes describing each dataset (num_classes and class_names on labels; layout, value
// range, pixel mean/std in [0, 1] on images; format and provenance on the file). Pixels stay uint8
// on disk: normalisation happens in the loader (Normalize::from_unit_range(mean, std)).
//
// Usage: convert_idx_to_hdf5 --out FILE [--src DIR] [--chunk ROWS] [--gzip LEVEL] [--skip-missing]
//   --src    folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
//            (default: /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist)
//   --chunk  store the datasets chunked by ROWS samples (default: contiguous, best for shuffled
//            reads); --gzip compresses chunks (needs --chunk)
//   --skip-missing  exit 77 ("skipped") instead of 2 when the source files are absent (tests)
// The file is written under a temporary name and renamed when complete, then read back with
// Hdf5Dataset and compared sample by sample with the IDX files; exit 0 only if all match.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <dtrain/data/hdf5.hpp>
#include <dtrain/data/idx.hpp>

#include "common/cli.hpp"

namespace {

const char* const kClassNames[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                     "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

struct Args {
  std::string out, src = "/usr/share/datasets/fashion-mnist";
  unsigned long chunk = 0;
  int gzip = 0;
  bool skip_missing = false;
};

// Returns -1 to continue, or the exit code (0 after --help, 2 after a bad option).
int parse(int argc, char** argv, Args& a) {
  CLI::App app(
      "Converts Fashion-MNIST IDX files (plain or gzip) into one HDF5 file for Hdf5Dataset, "
      "then reads it back and compares every sample.",
      "convert_idx_to_hdf5");
  app.add_option("--out", a.out, "HDF5 file to write (written as FILE.tmp, renamed when complete)")
      ->required()
      ->type_name("FILE");
  app.add_option("--src", a.src,
                 "folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (Debian: "
                 "dataset-fashion-mnist)")
      ->type_name("DIR");
  dtrain_cli::add_int(app, "--chunk", a.chunk,
                      "store the datasets chunked by this many rows (0: contiguous, best for "
                      "shuffled reads)",
                      0, 1 << 30);
  dtrain_cli::add_int(app, "--gzip", a.gzip, "gzip level of the chunks (needs --chunk)", 0, 9);
  app.add_flag("--skip-missing", a.skip_missing,
               "exit 77 (skipped) instead of 2 when the source files are absent (tests)");
  const int code = dtrain_cli::run_parser(app, argc, argv);
  if (code >= 0) return code;
  if (a.gzip > 0 && a.chunk == 0) {
    std::fprintf(stderr, "convert_idx_to_hdf5: --gzip needs --chunk\n");
    return 2;
  }
  return -1;
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// "<dir>/<stem>" with or without ".gz", whichever exists (the gzip one preferred).
std::string find_source(const std::string& dir, const std::string& stem) {
  if (exists(dir + "/" + stem + ".gz")) return dir + "/" + stem + ".gz";
  if (exists(dir + "/" + stem)) return dir + "/" + stem;
  return "";
}

#define CHECK_H5(call, what) DTRAIN_CHECK_H5(call, "convert_idx_to_hdf5", what)

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  dtrain::detail::H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  CHECK_H5(H5Tset_size(type.get(), value.size() + 1), name);
  dtrain::detail::H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  dtrain::detail::H5Handle attr(
      H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  CHECK_H5(attr.get(), name);
  CHECK_H5(H5Awrite(attr.get(), type.get(), value.c_str()), name);
}

template <class T>
void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                const std::vector<T>& v) {
  const hsize_t n = v.size();
  dtrain::detail::H5Handle space(n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr),
                                 H5Sclose);
  dtrain::detail::H5Handle attr(
      H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  CHECK_H5(attr.get(), name);
  CHECK_H5(H5Awrite(attr.get(), mem_type, v.data()), name);
}

void write_class_names(hid_t obj) {
  dtrain::detail::H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  CHECK_H5(H5Tset_size(type.get(), H5T_VARIABLE), "class_names");
  CHECK_H5(H5Tset_cset(type.get(), H5T_CSET_UTF8), "class_names");
  const hsize_t n = 10;
  dtrain::detail::H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  dtrain::detail::H5Handle attr(
      H5Acreate2(obj, "class_names", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  CHECK_H5(attr.get(), "class_names");
  CHECK_H5(H5Awrite(attr.get(), type.get(), kClassNames), "class_names");
}

// Writes one IDX array as a uint8 dataset; returns it open for attributes.
dtrain::detail::H5Handle write_dataset(hid_t file, const std::string& name,
                                       const dtrain::IdxArray& a, const Args& args) {
  std::vector<hsize_t> dims(a.shape.begin(), a.shape.end());
  dtrain::detail::H5Handle space(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  dtrain::detail::H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  CHECK_H5(H5Pset_create_intermediate_group(lcpl.get(), 1), name);
  dtrain::detail::H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (args.chunk > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min<hsize_t>(args.chunk, dims[0] ? dims[0] : 1);
    CHECK_H5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), name);
    if (args.gzip > 0) CHECK_H5(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(args.gzip)), name);
  }
  dtrain::detail::H5Handle d(H5Dcreate2(file, name.c_str(), H5T_STD_U8LE, space.get(), lcpl.get(),
                                        dcpl.get(), H5P_DEFAULT),
                             H5Dclose);
  CHECK_H5(d.get(), name);
  CHECK_H5(H5Dwrite(d.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data.data()), name);
  return d;
}

struct Split {
  const char* group;  // "train" / "test"
  const char* stem;   // "train" / "t10k"
  std::string images, labels;
};

// Reads every sample back through Hdf5Dataset and compares it with IdxDataset. Returns mismatches.
std::size_t verify(const std::string& file, const Split& s) {
  dtrain::IdxDataset idx(s.images, s.labels);
  dtrain::Hdf5Options opt;
  opt.driver = dtrain::Hdf5Driver::posix;
  dtrain::Hdf5Dataset h5(file, std::string(s.group) + "/images", std::string(s.group) + "/labels",
                         opt);
  if (h5.size() != idx.size() || h5.sample_shape() != idx.sample_shape() ||
      h5.num_classes() != 10) {
    std::fprintf(stderr, "%s: shape or class count differs\n", s.group);
    return 1;
  }
  const std::size_t n = idx.size(), e = dtrain::sample_elements(idx), step = 1000;
  std::vector<std::int64_t> rows;
  std::vector<float> fa, fb;
  std::vector<std::int32_t> la, lb;
  std::size_t bad = 0;
  for (std::size_t start = 0; start < n; start += step) {
    const std::size_t m = std::min(step, n - start);
    rows.resize(m);
    for (std::size_t i = 0; i < m; ++i) rows[i] = static_cast<std::int64_t>(start + i);
    fa.resize(m * e);
    fb.resize(m * e);
    la.resize(m);
    lb.resize(m);
    const dtrain::span<const std::int64_t> r(rows.data(), m);
    h5.read(r, dtrain::span<float>(fa), dtrain::span<std::int32_t>(la), dtrain::Normalize{});
    idx.read(r, dtrain::span<float>(fb), dtrain::span<std::int32_t>(lb), dtrain::Normalize{});
    for (std::size_t i = 0; i < m; ++i)
      if (la[i] != lb[i] ||
          std::memcmp(fa.data() + i * e, fb.data() + i * e, e * sizeof(float)) != 0)
        ++bad;
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int code = parse(argc, argv, args); code >= 0) return code;
  std::vector<Split> splits{{"train", "train", "", ""}, {"test", "t10k", "", ""}};
  for (auto& s : splits) {
    s.images = find_source(args.src, std::string(s.stem) + "-images-idx3-ubyte");
    s.labels = find_source(args.src, std::string(s.stem) + "-labels-idx1-ubyte");
    if (s.images.empty() || s.labels.empty()) {
      std::printf(
          "%s: Fashion-MNIST %s files not found in %s (Debian: apt-get install "
          "dataset-fashion-mnist)\n",
          args.skip_missing ? "SKIPPED" : "error", s.stem, args.src.c_str());
      return args.skip_missing ? 77 : 2;
    }
  }
  // Every failure removes the temporary file (and a written file that does not read back).
  const std::string tmp = args.out + ".tmp";
  try {
    {
      dtrain::detail::H5Session h5;  // HDF5 lock, error printing off until the file is done
      dtrain::detail::H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                    H5Fclose);
      CHECK_H5(file.get(), "creating '" << tmp << "'");
      write_string_attr(file.get(), "format", "dtrain-dataset");
      write_attr<long long>(file.get(), "format_version", H5T_STD_I64LE, H5T_NATIVE_LLONG, {1});
      write_string_attr(
          file.get(), "source",
          "Fashion-MNIST (Zalando Research), converted from IDX files in " + args.src);
      for (const auto& s : splits) {
        const dtrain::IdxArray images = dtrain::read_idx(s.images);
        const dtrain::IdxArray labels = dtrain::read_idx(s.labels);
        // Same validation as the loader: counts, element type, label range.
        const dtrain::IdxDataset check(s.images, s.labels);
        if (images.type != 0x08 || labels.type != 0x08)
          throw dtrain::make_error<dtrain::IoError>("convert_idx_to_hdf5",
                                                    "expected unsigned-byte IDX files");
        double sum = 0, sq = 0;
        for (unsigned char v : images.data) {
          sum += v / 255.0;
          sq += (v / 255.0) * (v / 255.0);
        }
        const double count = static_cast<double>(images.data.size());
        const double mean = count > 0 ? sum / count : 0.0;
        const double stddev = count > 0 ? std::sqrt(std::max(0.0, sq / count - mean * mean)) : 0.0;

        auto di = write_dataset(file.get(), std::string(s.group) + "/images", images, args);
        write_string_attr(di.get(), "description",
                          std::string("Fashion-MNIST ") + s.group + " images, 28x28 grey levels");
        write_string_attr(di.get(), "layout", "NHW");
        write_string_attr(di.get(), "source_file", s.images);
        write_attr<long long>(di.get(), "value_range", H5T_STD_I64LE, H5T_NATIVE_LLONG, {0, 255});
        write_attr<double>(di.get(), "mean", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {mean});
        write_attr<double>(di.get(), "std", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {stddev});
        auto dl = write_dataset(file.get(), std::string(s.group) + "/labels", labels, args);
        write_string_attr(dl.get(), "description",
                          std::string("Fashion-MNIST ") + s.group + " class labels");
        write_string_attr(dl.get(), "source_file", s.labels);
        write_attr<long long>(dl.get(), "num_classes", H5T_STD_I64LE, H5T_NATIVE_LLONG, {10});
        write_class_names(dl.get());
        std::printf("%-5s images %s labels %s  pixel mean %.4f std %.4f\n", s.group,
                    dtrain::to_string(images.shape).c_str(),
                    dtrain::to_string(labels.shape).c_str(), mean, stddev);
      }
      CHECK_H5(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing '" << tmp << "'");
    }
    if (std::rename(tmp.c_str(), args.out.c_str()) != 0)
      throw dtrain::make_error<dtrain::IoError>(
          "convert_idx_to_hdf5",
          "cannot rename '" + tmp + "' to '" + args.out + "': " + std::strerror(errno));
    std::size_t bad = 0;
    for (const auto& s : splits) bad += verify(args.out, s);
    std::printf("wrote %s (%s); read back through Hdf5Dataset: %zu mismatching samples\n",
                args.out.c_str(),
                args.chunk ? (args.gzip ? "chunked, gzip" : "chunked") : "contiguous", bad);
    if (bad != 0) {
      std::remove(args.out.c_str());
      std::fprintf(stderr, "convert_idx_to_hdf5: removed %s: it does not read back as written\n",
                   args.out.c_str());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
