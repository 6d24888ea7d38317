// Data loading on real MPI ranks (mpiexec -n 1..4): shards are disjoint and cover the epoch, every
// rank agrees on the order, a checkpoint resumes on a different number of ranks, and parallel
// HDF5 reads (MPI-IO, independent and collective, from the loader's thread) equal IDX reads.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/data/hdf5.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/loader.hpp>

#include "support/watchdog.hpp"
#include "unit/data_hdf5_helpers.hpp"
#include "unit/data_helpers.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_data_mpi_test {

using namespace dtrain;

namespace {

int world_rank(MPI_Comm c = MPI_COMM_WORLD) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int world_size(MPI_Comm c = MPI_COMM_WORLD) {
  int s = 0;
  MPI_Comm_size(c, &s);
  return s;
}

// Every rank's vector, concatenated on every rank.
std::vector<std::int64_t> allgather(const std::vector<std::int64_t>& mine, MPI_Comm c) {
  const int p = world_size(c);
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(p), displs(p);
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, c);
  int total = 0;
  for (int i = 0; i < p; ++i) {
    displs[i] = total;
    total += counts[i];
  }
  std::vector<std::int64_t> all(static_cast<std::size_t>(total));
  MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T,
                 c);
  return all;
}

// Rank 0 writes synthetic IDX and HDF5 files; every rank gets the directory.
struct SharedFiles {
  std::unique_ptr<test::TempDir> dir;
  std::string path;
  SharedFiles(std::size_t n, std::uint32_t rows, std::uint32_t cols) {
    char buf[4096] = {0};
    if (world_rank() == 0) {
      dir = std::make_unique<test::TempDir>();
      test::write_synthetic_idx(*dir, "d", n, rows, cols, false);
      std::vector<std::uint8_t> images(n * rows * cols), labels(n);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < rows * cols; ++k)
          images[i * rows * cols + k] = test::synth_pixel(i, k);
        labels[i] = test::synth_label(i, 10);
      }
      const Shape shape{static_cast<std::int64_t>(n), rows, cols};
      test::write_h5(
          dir->file("d.h5"),
          {test::H5Spec{"train/images", H5T_STD_U8LE, H5T_NATIVE_UINT8, shape, images.data()},
           test::H5Spec{"train/labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, Shape{shape[0]},
                        labels.data(), 0, 0, 10}});
      test::write_h5(dir->file("chunked.h5"),
                     {test::H5Spec{"train/images", H5T_STD_U8LE, H5T_NATIVE_UINT8, shape,
                                   images.data(), 32, 1},
                      test::H5Spec{"train/labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, Shape{shape[0]},
                                   labels.data(), 32, 0, 10}});
      std::strncpy(buf, dir->path().c_str(), sizeof buf - 1);
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~SharedFiles() { MPI_Barrier(MPI_COMM_WORLD); }  // nobody reads when rank 0 removes them
  std::string file(const std::string& n) const { return path + "/" + n; }
};

}  // namespace

TEST_CASE("mpi data: shards are disjoint, cover the epoch and agree on the order") {
  const int p = world_size(), r = world_rank();
  for (std::size_t n : {1u, 7u, 1000u}) {
    DistributedSampler s(n, r, p, 2024, SamplerOptions{true, SamplerTail::drop, false});
    s.set_epoch(3);
    std::vector<std::int64_t> mine;
    std::size_t batches = 0;
    for (auto idx = s.next_indices(10); !idx.empty(); s.advance(10), idx = s.next_indices(10)) {
      mine.insert(mine.end(), idx.begin(), idx.end());
      ++batches;
    }
    auto all = allgather(mine, MPI_COMM_WORLD);
    std::set<std::int64_t> distinct(all.begin(), all.end());
    CHECK(distinct.size() == all.size());
    CHECK(all.size() == n / static_cast<std::size_t>(p) * static_cast<std::size_t>(p));
    long long b = static_cast<long long>(batches), bmin = 0, bmax = 0;
    MPI_Allreduce(&b, &bmin, 1, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&b, &bmax, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    CHECK(bmin == bmax);
    // Every rank computed the same permutation.
    unsigned long long h = 1469598103934665603ull;
    for (std::size_t k = 0; k < n; ++k)
      h = (h ^ static_cast<unsigned long long>(s.permuted(k))) * 1099511628211ull;
    unsigned long long hmin = 0, hmax = 0;
    MPI_Allreduce(&h, &hmin, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hmax, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    CHECK(hmin == hmax);
  }
}

TEST_CASE("mpi data: a checkpoint resumes on fewer ranks with the same global order") {
  const int p = world_size(), r = world_rank();
  const std::size_t n = 997, B = 9;
  DistributedSampler s(n, r, p, 5);
  s.set_epoch(1);
  std::vector<std::int64_t> consumed;
  for (int k = 0; k < 6; ++k) {
    auto idx = s.next_indices(B);
    consumed.insert(consumed.end(), idx.begin(), idx.end());
    s.advance(B);
  }
  auto state = test::save_state(s);  // identical on every rank (global state)
  auto all_consumed = allgather(consumed, MPI_COMM_WORLD);
  // Continue on ranks [0, q) with q = max(1, p - 1).
  const int q = p > 1 ? p - 1 : 1;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, r < q ? 0 : MPI_UNDEFINED, r, &sub);
  if (sub != MPI_COMM_NULL) {
    DistributedSampler t(n, world_rank(sub), world_size(sub), 0);
    test::load_state(state, t);
    t.set_epoch(1);
    std::vector<std::int64_t> rest;
    for (auto idx = t.next_indices(B); !idx.empty(); t.advance(B), idx = t.next_indices(B))
      rest.insert(rest.end(), idx.begin(), idx.end());
    auto all_rest = allgather(rest, sub);
    std::multiset<std::int64_t> both(all_consumed.begin(), all_consumed.end());
    both.insert(all_rest.begin(), all_rest.end());
    // Every sample appears; repeats only from the padding of the two tails.
    CHECK(std::set<std::int64_t>(both.begin(), both.end()).size() == n);
    CHECK(both.size() < n + static_cast<std::size_t>(p + q));
    MPI_Comm_free(&sub);
  }
}

TEST_CASE("mpi data: parallel HDF5 reads equal IDX reads, independent and collective") {
  const int p = world_size(), r = world_rank();
  const std::size_t n = 613;
  SharedFiles files(n, 7, 4);
  IdxDataset ref(files.file("d-images"), files.file("d-labels"));
  const Normalize t = Normalize::from_unit_range(0.5f, 0.25f);
  for (const char* name : {"d.h5", "chunked.h5"})
    for (Hdf5Driver driver : {Hdf5Driver::automatic, Hdf5Driver::posix})
      for (int mode :
           {0, 1, 2}) {  // 0: independent, pread/MPI_File_read_at; 1: H5Dread; 2: collective
        const bool collective = mode == 2;
        if (collective && driver == Hdf5Driver::posix) continue;
        CAPTURE(name);
        CAPTURE(mode);
        Hdf5Options opt;
        opt.driver = driver;
        opt.collective = collective;
        opt.direct_reads = mode == 0;
        Hdf5Dataset ds(files.file(name), "train/images", "train/labels", MPI_COMM_WORLD, opt);
        // The test main asks for MPI_THREAD_MULTIPLE, so automatic means MPI-IO.
        CHECK(ds.driver() == (driver == Hdf5Driver::posix ? Hdf5Driver::posix : Hdf5Driver::mpio));
        DistributedSampler sa(n, r, p, 31), sb(n, r, p, 31);
        sa.set_epoch(2);
        sb.set_epoch(2);
        LoaderOptions lo;
        lo.transform = t;
        Loader la(ds, sa, 25, lo);  // background thread: MPI-IO from a second thread
        Loader lb(ref, sb, 25, lo);
        Batch ba, bb;
        std::size_t batches = 0;
        while (la.next(ba)) {
          REQUIRE(lb.next(bb));
          CHECK(ba.indices == bb.indices);
          CHECK(std::memcmp(ba.features.raw(), bb.features.raw(), ba.features.bytes()) == 0);
          CHECK(std::memcmp(ba.labels.raw(), bb.labels.raw(), ba.labels.bytes()) == 0);
          ++batches;
        }
        CHECK(!lb.next(bb));
        CHECK(batches == sa.num_batches(25));
      }
}

TEST_CASE(
    "mpi data: a rank stalled before a collective open or read: the others' deadline names it") {
  // Rank 1 comes 1.5 s late to the collective file open and again to the first collective read;
  // the other ranks wait in MPI-IO. With a 0.4 s deadline each waiting rank's watchdog fires once
  // per section (the expiry hook records the message instead of ending the job), and once rank 1
  // arrives the open and the read complete with the right rows.
  const int p = world_size(), r = world_rank();
  if (p < 2) {
    MESSAGE("skipped: needs 2 or more ranks");
    return;
  }
  const std::size_t n = 101;
  SharedFiles files(n, 7, 4);
  IdxDataset ref(files.file("d-images"), files.file("d-labels"));
  test::ExpiryRecorder recorder;
  Hdf5Options opt;
  opt.driver = Hdf5Driver::mpio;
  opt.collective = true;
  opt.collective_timeout_s = 0.4;
  const auto late = [&] {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  };
  const std::string file = files.file("d.h5");
  {
    MPI_Barrier(MPI_COMM_WORLD);
    late();
    Hdf5Dataset ds(file, "train/images", "train/labels", MPI_COMM_WORLD, opt);
    const std::vector<std::int64_t> idx{static_cast<std::int64_t>(3 * r), 50, 100 - r};
    std::vector<float> f(idx.size() * 28), g(idx.size() * 28);
    std::vector<std::int32_t> l(idx.size()), k(idx.size());
    MPI_Barrier(MPI_COMM_WORLD);
    late();
    ds.read(span<const std::int64_t>(idx.data(), idx.size()), span<float>(f.data(), f.size()),
            span<std::int32_t>(l.data(), l.size()), Normalize{});
    ref.read(span<const std::int64_t>(idx.data(), idx.size()), span<float>(g.data(), g.size()),
             span<std::int32_t>(k.data(), k.size()), Normalize{});
    CHECK(f == g);
    CHECK(l == k);
    // A read on time: no message.
    ds.read(span<const std::int64_t>(idx.data(), idx.size()), span<float>(f.data(), f.size()),
            span<std::int32_t>(l.data(), l.size()), Normalize{});
  }
  recorder.stop();
  const std::vector<std::string> fired = recorder.messages();
  if (r == 1) {
    CHECK(fired.empty());
    return;
  }
  REQUIRE(fired.size() == 2);
  const std::string head = "dtrain: rank " + std::to_string(r) + ": Hdf5Dataset: ";
  for (const std::string& msg : fired) {
    CAPTURE(msg);
    CHECK(msg.find("did not finish within 0.4 s") != std::string::npos);
    CHECK(msg.find("collective over " + std::to_string(p) + " ranks") != std::string::npos);
    CHECK(msg.find("Hdf5Options::collective_timeout_s") != std::string::npos);
  }
  CHECK(fired[0].rfind(head + "opening '" + file + "'", 0) == 0);
  CHECK(fired[1].rfind(head + "reading batch 0 (3 rows) '" + file + "'", 0) == 0);
}

}  // namespace dtrain_test_data_mpi_test
