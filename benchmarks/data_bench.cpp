// data_bench: loader throughput for IDX, HDF5 (contiguous / chunked / gzip; sequential and
// shuffled; POSIX and MPI-IO independent / collective) and the in-memory store, against a plain
// read() of the same bytes measured in the same run; then the loader's share of a training step
// (an MLP 784-512-10 forward+backward with CBLAS standing in for the model).
//
// Usage: mpiexec.mpich -n P data_bench [--src DIR] [--work DIR] [--batch B] [--epochs E]
//                                       [--depth D] [--step-only] [--only SUBSTRING]  (--help)
// Prints one row per configuration: samples/s and MB/s per rank (slowest rank), and the ratio to
// the plain read() baseline. Bytes count the raw sample bytes delivered (784 per Fashion-MNIST
// image); all files are freshly written, so every variant reads from the page cache alike.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef DTRAIN_HAVE_CBLAS
#include <cblas.h>
#endif

#include <dtrain/core/rng.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/hdf5.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/data/loader.hpp>

#include "common/cli_mpi.hpp"

namespace {

struct Args {
  std::string src = "/usr/share/datasets/fashion-mnist";
  std::string work;
  std::size_t batch = 128;
  int epochs = 2;
  std::size_t depth = dtrain::LoaderOptions{}.prefetch_depth;
  std::string only;  // run only the rows whose name contains this
};

int g_rank = 0, g_size = 1;

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& header,
                 const unsigned char* data, std::size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(data, 1, n, f);
  std::fclose(f);
}

std::vector<unsigned char> idx_header(const dtrain::Shape& s) {
  std::vector<unsigned char> h{0, 0, 0x08, static_cast<unsigned char>(s.size())};
  for (auto d : s)
    for (int k = 3; k >= 0; --k)
      h.push_back(static_cast<unsigned char>((static_cast<std::uint32_t>(d) >> (8 * k)) & 0xff));
  return h;
}

void write_h5(const std::string& path, const dtrain::IdxArray& images,
              const dtrain::IdxArray& labels, hsize_t chunk, int gzip) {
  auto put = [&](hid_t file, const char* name, const dtrain::IdxArray& a) {
    std::vector<hsize_t> dims(a.shape.begin(), a.shape.end());
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (chunk) {
      std::vector<hsize_t> c = dims;
      c[0] = chunk;
      H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
      if (gzip) H5Pset_deflate(dcpl, static_cast<unsigned>(gzip));
    }
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t d = H5Dcreate2(file, name, H5T_STD_U8LE, space, lcpl, dcpl, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data.data());
    if (std::string(name).find("labels") != std::string::npos) {
      long long nc = 10;
      hid_t as = H5Screate(H5S_SCALAR);
      hid_t at = H5Acreate2(d, "num_classes", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(at, H5T_NATIVE_LLONG, &nc);
      H5Aclose(at);
      H5Sclose(as);
    }
    H5Dclose(d);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
    H5Sclose(space);
  };
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot create " + path);
  put(f, "train/images", images);
  put(f, "train/labels", labels);
  H5Fclose(f);
}

struct Row {
  std::string name;
  double samples_per_s, mb_per_s;
};

void print_header(double read_mb_s, double pread_mb_s, std::size_t n, std::size_t elems,
                  const Args& a) {
  if (g_rank != 0) return;
  std::printf(
      "# data_bench: p=%d ranks, %zu samples of %zu B, batch %zu per rank, prefetch depth %zu, %d "
      "epoch(s) per row\n",
      g_size, n, elems, a.batch, a.depth, a.epochs);
  std::printf(
      "# baseline, same bytes, same run: read() sequential %.0f MB/s per rank; pread() per sample, "
      "shuffled %.0f MB/s per rank\n",
      read_mb_s, pread_mb_s);
  std::printf("# %-48s %12s %10s %10s %10s\n", "configuration", "samples/s", "MB/s", "vs read()",
              "vs pread()");
}

void print_row(const Row& r, double read_base, double pread_base) {
  if (g_rank == 0)
    std::printf("  %-48s %12.0f %10.1f %10.3f %10.2f\n", r.name.c_str(), r.samples_per_s,
                r.mb_per_s, r.mb_per_s / read_base, r.mb_per_s / pread_base);
}

// One or more epochs through a Loader; returns per-rank throughput of the slowest rank.
template <class D>
Row run_loader(const std::string& name, D& ds, bool shuffle, const Args& a, std::size_t elems) {
  if (!a.only.empty() && name.find(a.only) == std::string::npos) return Row{"", 0, 0};
  dtrain::SamplerOptions so;
  so.shuffle = shuffle;
  dtrain::DistributedSampler sampler(ds.size(), g_rank, g_size, 7, so);
  dtrain::LoaderOptions lo;
  lo.prefetch_depth = a.depth;
  lo.transform = dtrain::Normalize::from_unit_range(0.2860f, 0.3530f);
  dtrain::Loader<D> loader(ds, sampler, a.batch, lo);
  dtrain::Batch b;
  std::size_t samples = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const dtrain::Timer t;
  for (int e = 0; e < a.epochs; ++e) {
    sampler.set_epoch(e);
    while (loader.next(b)) samples += b.size;
  }
  const double s = max_over_ranks(t.seconds());
  return Row{name, samples / s, samples * static_cast<double>(elems) / s / 1e6};
}

#ifdef DTRAIN_HAVE_CBLAS
// Stand-in for the training step of the MLP example: 784-512-10, forward and backward.
struct MlpStep {
  std::size_t B, in = 784, hid = 512, out = 10;
  std::vector<float> w1, w2, h, o, dh, dw1, dw2;
  explicit MlpStep(std::size_t b)
      : B(b),
        w1(in * hid, 0.01f),
        w2(hid * out, 0.01f),
        h(b * hid),
        o(b * out),
        dh(b * hid),
        dw1(in * hid),
        dw2(hid * out) {}
  void run(const float* x) {
    const int b = static_cast<int>(B), i = static_cast<int>(in), hd = static_cast<int>(hid),
              ou = static_cast<int>(out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, hd, i, 1.f, x, i, w1.data(), hd, 0.f,
                h.data(), hd);
    for (auto& v : h) v = v > 0 ? v : 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, ou, hd, 1.f, h.data(), hd, w2.data(),
                ou, 0.f, o.data(), ou);
    // dO = O (stand-in for softmax - onehot): same shapes and flops as the real gradient.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hd, ou, b, 1.f, h.data(), hd, o.data(), ou,
                0.f, dw2.data(), ou);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, hd, ou, 1.f, o.data(), ou, w2.data(),
                ou, 0.f, dh.data(), hd);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i, hd, b, 1.f, x, i, dh.data(), hd, 0.f,
                dw1.data(), hd);
    for (std::size_t k = 0; k < w1.size(); ++k) w1[k] -= 1e-6f * dw1[k];
    for (std::size_t k = 0; k < w2.size(); ++k) w2[k] -= 1e-6f * dw2[k];
  }
};

template <class D>
void step_share(const std::string& name, D& ds, const Args& a) {
  dtrain::DistributedSampler sampler(ds.size(), g_rank, g_size, 7);
  dtrain::LoaderOptions lo;
  lo.prefetch_depth = a.depth;
  lo.flatten = true;
  lo.transform = dtrain::Normalize::from_unit_range(0.2860f, 0.3530f);
  MlpStep mlp(a.batch);
  // Compute alone on one resident batch, for the same number of steps.
  const std::size_t steps = sampler.num_batches(a.batch);
  std::vector<float> x(a.batch * 784, 0.5f);
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::Timer tc;
  for (std::size_t s = 0; s < steps; ++s) mlp.run(x.data());
  const double compute = max_over_ranks(tc.seconds());
  dtrain::Loader<D> loader(ds, sampler, a.batch, lo);
  dtrain::Batch b;
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::Timer tt;
  std::size_t n = 0;
  double in_step = 0;
  while (loader.next(b)) {
    const dtrain::Timer ts;
    if (b.size == a.batch) mlp.run(b.features.as<float>().data());
    in_step += ts.seconds();
    ++n;
  }
  const double total_local = tt.seconds();
  // The rank that waited most, with its own total (shares are per rank, not mixed across ranks).
  struct {
    double share;
    int rank;
  } mine{loader.wait_seconds() / total_local, g_rank}, worst{0, 0};
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  double v[4] = {total_local, loader.wait_seconds(), in_step, loader.read_seconds()};
  MPI_Bcast(v, 4, MPI_DOUBLE, worst.rank, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf(
        "  %-26s steps %4zu  compute alone %6.3f s | loop: total %6.3f s, compute %6.3f s, "
        "reader busy %6.3f s (%4.1f%% of compute), waiting %6.3f s = %5.1f%% of step time "
        "(rank %d)\n",
        name.c_str(), n, compute, v[0], v[2], v[3], 100.0 * v[3] / v[2], v[1], 100.0 * worst.share,
        worst.rank);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  Args a;
  bool step_only = false;
  {
    CLI::App app(
        "data_bench: loader throughput (IDX, HDF5 layouts and drivers, in-memory) against read() "
        "of the same bytes, then the loader's share of a training step.",
        "data_bench");
    app.add_option("--src", a.src,
                   "folder with Fashion-MNIST's IDX files (synthetic data if absent)")
        ->type_name("DIR")
        ->capture_default_str();
    app.add_option("--work", a.work, "folder for the files written (default: a new /tmp folder)")
        ->type_name("DIR");
    dtrain_cli::add_batch(app, a.batch);
    dtrain_cli::add_epochs(app, a.epochs);
    dtrain_cli::add_int(app, "--depth", a.depth, "loader prefetch depth", 0, 64);
    app.add_flag("--step-only", step_only, "only the training-step share");
    app.add_option("--only", a.only, "run only the rows whose name contains this")
        ->type_name("TEXT");
    if (const int code = dtrain_cli::run_parser_mpi(app, argc, argv); code >= 0) {
      MPI_Finalize();
      return code;
    }
  }
  int code = 0;
  try {
    // Work directory (shared by the ranks; they run on one node here).
    char dirbuf[4096] = {0};
    if (g_rank == 0) {
      std::string d = a.work;
      if (d.empty()) {
        std::string tmpl = "/tmp/dtrain_data_bench_XXXXXX";
        if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        d = tmpl;
      }
      std::strncpy(dirbuf, d.c_str(), sizeof dirbuf - 1);
    }
    MPI_Bcast(dirbuf, sizeof dirbuf, MPI_CHAR, 0, MPI_COMM_WORLD);
    const std::string dir = dirbuf;
    const std::string gz_images = a.src + "/train-images-idx3-ubyte.gz",
                      gz_labels = a.src + "/train-labels-idx1-ubyte.gz";
    struct stat st {};
    const bool have_real = ::stat(gz_images.c_str(), &st) == 0;
    if (g_rank == 0) {
      dtrain::IdxArray images, labels;
      if (have_real) {
        images = dtrain::read_idx(gz_images);
        labels = dtrain::read_idx(gz_labels);
      } else {  // synthetic stand-in of the same size
        std::printf("# Fashion-MNIST not found in %s: using synthetic data of the same shape\n",
                    a.src.c_str());
        images.shape = {60000, 28, 28};
        labels.shape = {60000};
        images.data.resize(60000u * 784u);
        labels.data.resize(60000u);
        dtrain::RngStream rng(1, 0);
        for (auto& v : images.data) v = static_cast<unsigned char>(rng.next_u32());
        for (auto& v : labels.data) v = static_cast<unsigned char>(rng.below(10));
      }
      write_bytes(dir + "/images.idx", idx_header(images.shape), images.data.data(),
                  images.data.size());
      write_bytes(dir + "/labels.idx", idx_header(labels.shape), labels.data.data(),
                  labels.data.size());
      write_h5(dir + "/contiguous.h5", images, labels, 0, 0);
      write_h5(dir + "/chunked.h5", images, labels, 1024, 0);
      write_h5(dir + "/gzip.h5", images, labels, 1024, 4);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    dtrain::IdxDataset idx_plain(dir + "/images.idx", dir + "/labels.idx");
    const std::size_t n = idx_plain.size(), elems = dtrain::sample_elements(idx_plain);
    const std::size_t per_rank =
        (n + static_cast<std::size_t>(g_size) - 1) / static_cast<std::size_t>(g_size);

    if (!step_only) {
      // Baseline 1: read() of this rank's share of the image bytes, sequentially, 1 MiB at a time.
      std::vector<unsigned char> buf(1 << 20);
      const int fd = ::open((dir + "/images.idx").c_str(), O_RDONLY);
      const std::size_t share = per_rank * elems;
      const off_t first = static_cast<off_t>(16 + static_cast<std::size_t>(g_rank) * share);
      double best_read = 1e300;
      for (int rep = 0; rep < 3; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        const dtrain::Timer t;
        std::size_t done = 0;
        ::lseek(fd, first, SEEK_SET);
        for (int e = 0; e < a.epochs; ++e) {
          ::lseek(fd, first, SEEK_SET);
          std::size_t left = share;
          while (left > 0) {
            const ssize_t r = ::read(fd, buf.data(), std::min(left, buf.size()));
            if (r <= 0) break;
            left -= static_cast<std::size_t>(r);
            done += static_cast<std::size_t>(r);
          }
        }
        best_read = std::min(best_read, max_over_ranks(t.seconds()) / static_cast<double>(done));
      }
      const double read_mb_s = 1.0 / best_read / 1e6;
      // Baseline 2: pread() of each sample of a shuffled shard, 784 B at a time.
      dtrain::DistributedSampler ps(n, g_rank, g_size, 3);
      std::vector<std::int64_t> order;
      for (auto i = ps.next_indices(per_rank); !i.empty(); i.clear()) order = i;
      MPI_Barrier(MPI_COMM_WORLD);
      const dtrain::Timer tp;
      for (int e = 0; e < a.epochs; ++e)
        for (auto s : order)
          if (::pread(fd, buf.data(), elems,
                      static_cast<off_t>(16 + static_cast<std::size_t>(s) * elems)) < 0)
            break;
      const double pread_mb_s =
          static_cast<double>(order.size() * elems * static_cast<std::size_t>(a.epochs)) /
          max_over_ranks(tp.seconds()) / 1e6;
      ::close(fd);
      print_header(read_mb_s, pread_mb_s, n, elems, a);

      std::vector<Row> rows;
      rows.push_back(run_loader("idx plain (mmap), sequential", idx_plain, false, a, elems));
      rows.push_back(run_loader("idx plain (mmap), shuffled", idx_plain, true, a, elems));
      if (have_real &&
          (a.only.empty() || std::string("idx gzip").find(a.only) != std::string::npos)) {
        dtrain::IdxDataset idx_gz(gz_images, gz_labels);
        rows.push_back(
            run_loader("idx gzip (decompressed at open), shuffled", idx_gz, true, a, elems));
      }
      auto h5row = [&](const char* label, const char* file, bool shuffle, dtrain::Hdf5Driver drv,
                       bool coll, std::size_t cache, bool direct = true) {
        dtrain::Hdf5Options o;
        o.direct_reads = direct;
        o.driver = drv;
        o.collective = coll;
        o.chunk_cache_bytes = cache;
        dtrain::Hdf5Dataset ds(dir + "/" + file, "train/images", "train/labels", MPI_COMM_WORLD, o);
        rows.push_back(run_loader(label, ds, shuffle, a, elems));
      };
      using D = dtrain::Hdf5Driver;
      const std::size_t big = std::size_t(64) << 20, small = std::size_t(1) << 20;
      h5row("hdf5 contiguous, sequential, posix", "contiguous.h5", false, D::posix, false, big);
      h5row("hdf5 contiguous, shuffled, posix", "contiguous.h5", true, D::posix, false, big);
      h5row("hdf5 contiguous, shuffled, posix, H5Dread", "contiguous.h5", true, D::posix, false,
            big, false);
      h5row("hdf5 contiguous, sequential, mpio indep", "contiguous.h5", false, D::mpio, false, big);
      h5row("hdf5 contiguous, shuffled, mpio indep", "contiguous.h5", true, D::mpio, false, big);
      h5row("hdf5 contiguous, shuffled, mpio indep, H5Dread", "contiguous.h5", true, D::mpio, false,
            big, false);
      h5row("hdf5 contiguous, shuffled, mpio collective", "contiguous.h5", true, D::mpio, true,
            big);
      h5row("hdf5 chunk 1024, shuffled, cache 64 MiB", "chunked.h5", true, D::posix, false, big);
      h5row("hdf5 chunk 1024, shuffled, cache 1 MiB", "chunked.h5", true, D::posix, false, small);
      h5row("hdf5 chunk 1024+gzip, shuffled, cache 64 MiB", "gzip.h5", true, D::posix, false, big);
      h5row("hdf5 chunk 1024+gzip, shuffled, cache 1 MiB", "gzip.h5", true, D::posix, false, small);
      if (a.only.empty() || std::string("in-memory").find(a.only) != std::string::npos) {
        dtrain::InMemoryDataset mem(dtrain::Shape{28, 28}, n);
        std::vector<float> f(elems);
        for (std::size_t i = 0; i < n; ++i) {
          for (std::size_t k = 0; k < elems; ++k) f[k] = idx_plain.image(i)[k];
          mem.append(dtrain::span<const float>(f), idx_plain.label(i));
        }
        rows.push_back(run_loader("in-memory store (f32), shuffled", mem, true, a, elems));
      }
      for (const auto& r : rows)
        if (!r.name.empty()) print_row(r, read_mb_s, pread_mb_s);
    }
#ifdef DTRAIN_HAVE_CBLAS
    if (g_rank == 0)
      std::printf(
          "# loader share of a training step (MLP 784-512-10 fwd+bwd, CBLAS, batch %zu, one "
          "epoch)\n",
          a.batch);
    step_share("idx plain, shuffled", idx_plain, a);
    {
      dtrain::Hdf5Dataset h5(dir + "/contiguous.h5", "train/images", "train/labels");
      step_share("hdf5 contiguous, shuffled", h5, a);
    }
    {
      dtrain::Hdf5Dataset h5(dir + "/gzip.h5", "train/images", "train/labels");
      step_share("hdf5 chunk+gzip, shuffled", h5, a);
    }
#else
    if (g_rank == 0)
      std::printf("# step-share section skipped: built without CBLAS (dtrain::blas)\n");
#endif
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0 && a.work.empty()) {
      for (const char* f : {"images.idx", "labels.idx", "contiguous.h5", "chunked.h5", "gzip.h5"})
        std::remove((dir + "/" + f).c_str());
      ::rmdir(dir.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
