// ckpt_bench: checkpoint save bandwidth against a plain sequential write + fsync of the same
// bytes to the same directory, restore time, and the cost of saving on the training step time.
//
//   ckpt_bench --dir DIR [--mb N] [--saves K] [--keep K] [--compare] [--steps S] [--passes P]
//   (--help lists the options and their ranges)
//   mpiexec.mpich -n 2 ckpt_bench --dir DIR --mb 100 --saves 5 --compare
//
// Writes K checkpoints of about N MiB into DIR through the Checkpointer (automatic strategy,
// keep-last policy) and leaves them there. --compare also times every other write strategy (in
// DIR/compare-<strategy>, removed afterwards). --parts also times saves of the model held in parts
// over the ranks (a sharded optimizer state's layout) against saves of it held whole, with every
// write strategy, and reports what rank 0 keeps for the next save. Restores are timed with both
// restore strategies (rank 0 reads, every rank reads its share), alternately; --cold drops the
// page cache before each. Then the checkpoint interval that the measured save and restore
// times advise for a job MTBF of --mtbf-hours (Young/Daly). --levels LOCALDIR last times what a
// step is blocked by a multi-level save (node-local in LOCALDIR, partner copy, background flush
// to DIR) against a save to DIR, and prints the interval advice per level. --xor-probe (with
// --levels) measures only the redundancy of per-rank node-local parts: partner copy against an
// XOR parity over the ranks as fake nodes.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/ckpt/interval.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/mpi.hpp>

#include "ckpt/mpi_comm.hpp"
#include "common/cli_mpi.hpp"

namespace {

using Comm = dtrain::test::MpiTestComm;

/// About `mib` MiB of f32 parameters as 4 MiB matrices plus a bias each (a stand-in for a model).
struct BenchModel {
  std::vector<dtrain::Tensor> w, b;
  explicit BenchModel(double mib) {
    const auto total = static_cast<std::int64_t>(mib * 1048576.0 / 4.0);
    const std::int64_t rows = 1024, cols = 1024;  // 4 MiB
    std::int64_t left = total;
    dtrain::RngStream rng(3, 0);
    while (left > 0) {
      const std::int64_t r = std::max<std::int64_t>(1, std::min<std::int64_t>(rows, left / cols));
      w.emplace_back(dtrain::Shape{r, cols}, dtrain::DType::f32);
      b.emplace_back(dtrain::Shape{r}, dtrain::DType::f32);
      for (auto& x : w.back().as<float>()) x = rng.uniform();
      left -= r * cols + r;
    }
  }
  std::size_t bytes() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < w.size(); ++i) n += w[i].bytes() + b[i].bytes();
    return n;
  }
  template <class V>
  void visit_state(V& v) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      v.tensor("layer" + std::to_string(i) + "/weight", w[i].view(), w[i].shape());
      v.tensor("layer" + std::to_string(i) + "/bias", b[i].view(), b[i].shape());
    }
  }
  /// `passes` sweeps over every parameter: a stand-in for a step's compute.
  void step(int passes = 1) {
    for (int k = 0; k < passes; ++k)
      for (auto& t : w)
        for (auto& x : t.as<float>()) x = x * 0.9999f + 1e-5f;
  }
};

/// The model's tensors as a sharded optimizer state holds them: rank r keeps block r of each
/// tensor's elements only (copied from `m`), saved through the state protocol's tensor_parts.
struct PartsModel {
  const BenchModel* whole = nullptr;
  std::vector<dtrain::Tensor> held;
  std::vector<dtrain::StateParts> parts;
  PartsModel(const BenchModel& m, int rank, int p) : whole(&m) {
    auto add = [&](const dtrain::Tensor& t) {
      const std::size_t n = t.size(), r = static_cast<std::size_t>(rank);
      const std::size_t first = n * r / static_cast<std::size_t>(p);
      const std::size_t count = n * (r + 1) / static_cast<std::size_t>(p) - first;
      parts.push_back({{first, count}});
      held.emplace_back(dtrain::Shape{static_cast<std::int64_t>(count)}, dtrain::DType::f32);
      std::memcpy(held.back().raw(), static_cast<const float*>(t.raw()) + first,
                  count * sizeof(float));
    };
    for (std::size_t i = 0; i < m.w.size(); ++i) {
      add(m.w[i]);
      add(m.b[i]);
    }
  }
  template <class V>
  void visit_state(V& v) {
    for (std::size_t i = 0; i < whole->w.size(); ++i) {
      v.tensor_parts("layer" + std::to_string(i) + "/weight", held[2 * i].view(),
                     whole->w[i].shape(), parts[2 * i]);
      v.tensor_parts("layer" + std::to_string(i) + "/bias", held[2 * i + 1].view(),
                     whole->b[i].shape(), parts[2 * i + 1]);
    }
  }
};

struct Cursor {
  std::int64_t epoch = 0, position = 0;
  template <class V>
  void visit_state(V& v) {
    v.scalar("epoch", epoch);
    v.scalar("position", position);
  }
};

double max_over_ranks(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

/// Rank 0 writes the model's bytes to a new file with write(2), then fsyncs it and the
/// directory; the others wait. Files are kept `keep` deep like checkpoints, so both see the same
/// pattern of deletions.
double plain_write(const std::string& dir, const BenchModel& m, int rank, int k, int keep) {
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::Timer t;
  const std::string path = dir + "/plain-write-" + std::to_string(k) + ".bin";
  if (rank == 0) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      std::perror("open");
      std::exit(1);
    }
    auto put = [&](const dtrain::Tensor& x) {
      const char* p = static_cast<const char*>(x.raw());
      std::size_t left = x.bytes();
      while (left) {
        const ssize_t n = ::write(fd, p, left);
        if (n <= 0) {
          std::perror("write");
          std::exit(1);
        }
        p += n;
        left -= static_cast<std::size_t>(n);
      }
    };
    for (std::size_t i = 0; i < m.w.size(); ++i) {
      put(m.w[i]);
      put(m.b[i]);
    }
    ::fsync(fd);
    ::close(fd);
    const std::string d = dir;
    const int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
    ::fsync(dfd);
    ::close(dfd);
    std::filesystem::remove(dir + "/plain-write-" + std::to_string(k - keep) + ".bin");
  }
  const double s = max_over_ranks(t.seconds());
  MPI_Barrier(MPI_COMM_WORLD);
  return s;
}

/// This process's resident set (VmRSS, or with `peak` VmHWM) in MiB from /proc/self/status;
/// 0 where it cannot be read.
double resident_mib(bool peak) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  const char* key = peak ? "VmHWM:" : "VmRSS:";
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, std::strlen(key)) == 0) kib = std::atof(line + std::strlen(key));
  std::fclose(f);
  return kib / 1024.0;
}

/// Resets this process's VmHWM to its current resident set (Linux 4.0 and later); false where
/// the kernel refuses.
/// Rank 0 writes back dirty pages and drops the page cache (the ranks share the node here), so
/// that the next reads come from the disk. Needs root.
void drop_page_cache(int rank) {
  if (rank == 0) {
    ::sync();
    FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
    if (!f || std::fputs("3\n", f) < 0 || std::fclose(f) != 0)
      dtrain::raise<dtrain::Error>("ckpt_bench --cold",
                                   "cannot write /proc/sys/vm/drop_caches (needs root)");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

bool reset_peak_resident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void row(int rank, const char* what, const char* strategy, std::size_t bytes, double seconds,
         double base_seconds) {
  if (rank != 0) return;
  const double mbs = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0;
  if (base_seconds > 0)
    std::printf("  %-22s %-16s %12zu %10.1f %9.1f %7.2f\n", what, strategy, bytes, seconds * 1e3,
                mbs, base_seconds / seconds);
  else
    std::printf("  %-22s %-16s %12zu %10.1f %9.1f %7s\n", what, strategy, bytes, seconds * 1e3, mbs,
                "-");
}

// Writes n bytes to `path` and fsyncs it; removes it again (only the time counts).
void write_fsync(const std::string& path, const unsigned char* data, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open " + path);
  for (std::size_t at = 0; at < n;) {
    const ssize_t put = ::write(fd, data + at, n - at);
    if (put <= 0) {
      ::close(fd);
      throw std::runtime_error("write " + path);
    }
    at += static_cast<std::size_t>(put);
  }
  ::fsync(fd);
  ::close(fd);
  std::filesystem::remove(path);
}

// n bytes from `src` to `dst` in messages of at most 8 MiB (MPI counts are int), both at once.
void sendrecv_bytes(const unsigned char* out, int to, unsigned char* in, int from, std::size_t n) {
  const std::size_t chunk = std::size_t{8} << 20;
  for (std::size_t at = 0; at < n; at += chunk) {
    const int k = static_cast<int>(std::min(chunk, n - at));
    MPI_Sendrecv(out + at, k, MPI_BYTE, to, 7, in + at, k, MPI_BYTE, from, 7, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
  }
}

// The redundancy of per-rank node-local parts, measured on its own (every rank a node, one group
// of all p ranks, N bytes of part per rank, each stored file written + fsynced into LOCALDIR):
// the partner copy (each rank sends its N bytes to the next rank and stores the previous one's)
// against an XOR parity as SCR computes it (each rank cuts its N bytes into p - 1 segments, sends
// segment j to rank r + 1 + j, and stores the XOR of the p - 1 segments it receives, N / (p - 1)
// bytes); then the rebuild of a lost rank 0's N bytes: from its partner (one message of N bytes),
// or from the group (each parity holder XORs its parity with the segments the other survivors
// send it again, and sends rank 0 its segment), checked against rank 0's bytes.
void xor_probe(const std::string& local, std::size_t n, int reps, int rank, int p) {
  if (p < 3) {
    if (rank == 0)
      std::printf("# --xor-probe needs at least 3 ranks (an XOR group of 2 is a mirror)\n");
    return;
  }
  const std::string d = local + "/node" + std::to_string(rank);
  std::filesystem::create_directories(d);
  const std::size_t seg = (n + static_cast<std::size_t>(p) - 2) / static_cast<std::size_t>(p - 1);
  std::vector<unsigned char> mine(seg * static_cast<std::size_t>(p - 1), 0), in(n), parity(seg),
      tmp(seg);
  for (std::size_t i = 0; i < n; ++i)
    mine[i] = static_cast<unsigned char>((i * 2654435761u + static_cast<std::size_t>(rank)) >> 13);
  auto segment = [&](int c, int q) { return static_cast<std::size_t>((q - c - 1 + 2 * p) % p); };
  std::vector<double> t_partner, t_xor, r_partner, r_xor;
  std::size_t wrong_partner = 0, wrong_xor = 0;
  for (int k = 0; k < reps; ++k) {
    MPI_Barrier(MPI_COMM_WORLD);
    dtrain::Timer t;
    sendrecv_bytes(mine.data(), (rank + 1) % p, in.data(), (rank + p - 1) % p, n);
    write_fsync(d + "/partner.bin", in.data(), n);
    t_partner.push_back(max_over_ranks(t.seconds()));

    MPI_Barrier(MPI_COMM_WORLD);
    t.reset();
    std::fill(parity.begin(), parity.end(), 0);
    for (int j = 0; j < p - 1; ++j) {
      const int to = (rank + 1 + j) % p, from = (rank - 1 - j + 2 * p) % p;
      sendrecv_bytes(mine.data() + static_cast<std::size_t>(j) * seg, to, tmp.data(), from, seg);
      for (std::size_t i = 0; i < seg; ++i) parity[i] ^= tmp[i];
    }
    write_fsync(d + "/parity.bin", parity.data(), seg);
    t_xor.push_back(max_over_ranks(t.seconds()));

    // Rank 0 lost: from its partner (rank 1 holds rank 0's bytes in `in`).
    MPI_Barrier(MPI_COMM_WORLD);
    t.reset();
    std::vector<unsigned char> back(rank == 0 ? seg * static_cast<std::size_t>(p - 1) : 0);
    const std::size_t chunk = std::size_t{8} << 20;
    for (std::size_t at = 0; at < n; at += chunk) {
      const int c = static_cast<int>(std::min(chunk, n - at));
      if (rank == 1) MPI_Send(in.data() + at, c, MPI_BYTE, 0, 8, MPI_COMM_WORLD);
      if (rank == 0)
        MPI_Recv(back.data() + at, c, MPI_BYTE, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (rank == 0) write_fsync(d + "/rebuilt.bin", back.data(), n);
    r_partner.push_back(max_over_ranks(t.seconds()));
    if (rank == 0)
      wrong_partner +=
          !std::equal(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(n), mine.begin());

    // From the XOR group: holder q keeps rank 0's segment q - 1 in its parity with one segment of
    // every other rank c, which c sends q again.
    MPI_Barrier(MPI_COMM_WORLD);
    t.reset();
    std::vector<MPI_Request> reqs;
    std::vector<std::vector<unsigned char>> got;
    if (rank != 0) {
      got.assign(static_cast<std::size_t>(p), {});
      for (int c = 1; c < p; ++c) {
        if (c == rank) continue;
        got[static_cast<std::size_t>(c)].resize(seg);
        for (std::size_t at = 0; at < seg; at += chunk) {
          reqs.emplace_back();
          MPI_Irecv(got[static_cast<std::size_t>(c)].data() + at,
                    static_cast<int>(std::min(chunk, seg - at)), MPI_BYTE, c, 9, MPI_COMM_WORLD,
                    &reqs.back());
        }
      }
      for (int q = 1; q < p; ++q) {
        if (q == rank) continue;
        const unsigned char* s = mine.data() + segment(rank, q) * seg;
        for (std::size_t at = 0; at < seg; at += chunk) {
          reqs.emplace_back();
          MPI_Isend(s + at, static_cast<int>(std::min(chunk, seg - at)), MPI_BYTE, q, 9,
                    MPI_COMM_WORLD, &reqs.back());
        }
      }
      MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
      tmp = parity;
      for (int c = 1; c < p; ++c)
        if (c != rank)
          for (std::size_t i = 0; i < seg; ++i) tmp[i] ^= got[static_cast<std::size_t>(c)][i];
      for (std::size_t at = 0; at < seg; at += chunk)
        MPI_Send(tmp.data() + at, static_cast<int>(std::min(chunk, seg - at)), MPI_BYTE, 0, 10,
                 MPI_COMM_WORLD);
    } else {
      for (int q = 1; q < p; ++q)
        for (std::size_t at = 0; at < seg; at += chunk)
          MPI_Recv(back.data() + segment(0, q) * seg + at,
                   static_cast<int>(std::min(chunk, seg - at)), MPI_BYTE, q, 10, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      write_fsync(d + "/rebuilt.bin", back.data(), n);
    }
    r_xor.push_back(max_over_ranks(t.seconds()));
    if (rank == 0)
      wrong_xor +=
          !std::equal(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(n), mine.begin());
  }
  std::filesystem::remove_all(d);
  if (rank != 0) return;
  const double mib = 1.0 / (1 << 20);
  std::printf(
      "# redundancy of per-rank parts: %d ranks = %d nodes, one group, part %.2f MiB per "
      "rank, files in %s, median of %d\n",
      p, p, n * mib, local.c_str(), reps);
  std::printf("  %-16s %12s %12s %12s %12s %7s\n", "scheme", "sent(MiB)", "stored(MiB)",
              "encode(ms)", "rebuild(ms)", "#wrong");
  std::printf("  %-16s %12.2f %12.2f %12.1f %12.1f %7zu\n", "partner copy", n * mib, n * mib,
              median(t_partner) * 1e3, median(r_partner) * 1e3, wrong_partner);
  std::printf("  %-16s %12.2f %12.2f %12.1f %12.1f %7zu\n", "XOR parity", seg * (p - 1) * mib,
              seg * mib, median(t_xor) * 1e3, median(r_xor) * 1e3, wrong_xor);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  std::string dir;
  double mib = 100;
  int saves = 5, keep = 3, steps = 20, passes = 10, restores = 3;
  double mtbf_hours = 24;
  bool compare = false, parts = false, cold = false;
  std::string levels_dir;
  double local_fraction = 0.85;
  bool xor_only = false;
  {
    CLI::App app(
        "ckpt_bench: checkpoint save bandwidth against a plain write + fsync of the same bytes, "
        "restore time, and the cost of saving on the step time.",
        "ckpt_bench");
    app.add_option("--dir", dir, "folder for the checkpoints (left there)")
        ->required()
        ->type_name("DIR");
    dtrain_cli::add_real(app, "--mb", mib, "checkpoint size in MiB", 1e-3, 1e6);
    dtrain_cli::add_int(app, "--saves", saves, "checkpoints written", 1, 100000);
    dtrain_cli::add_int(app, "--keep", keep, "checkpoints kept (keep-last)", 1, 100000);
    dtrain_cli::add_int(app, "--steps", steps, "steps timed per save mode (no save, sync, async)",
                        1, 1000000);
    dtrain_cli::add_int(app, "--passes", passes,
                        "sweeps over the parameters per step (stand-in for compute)", 1, 100000);
    app.add_flag("--compare", compare, "also time every other write strategy");
    dtrain_cli::add_int(app, "--restores", restores,
                        "restores timed per restore strategy (rank0, distributed), alternating", 1,
                        1000);
    dtrain_cli::add_real(app, "--mtbf-hours", mtbf_hours,
                         "the job's mean time between failures for the interval advice", 1e-3, 1e6);
    app.add_flag("--cold", cold,
                 "drop the page cache before each restore (root: /proc/sys/vm/drop_caches)");
    app.add_flag("--parts", parts,
                 "also time saves of the model held in parts (rank r keeps block r of every "
                 "tensor, as a sharded optimizer state), interleaved with saves of the whole "
                 "model, with every write strategy");
    app.add_option("--levels", levels_dir,
                   "also time multi-level saves with this node-local directory (e.g. /dev/shm/x): "
                   "the step's blocked time against a save to --dir, and the interval advice per "
                   "level")
        ->type_name("LOCALDIR");
    app.add_flag("--xor-probe", xor_only,
                 "only measure the redundancy of per-rank node-local parts of --mb / p MiB each "
                 "in --levels: partner copy against an XOR parity over all ranks as fake nodes "
                 "(encode, store, rebuild of rank 0), then exit");
    dtrain_cli::add_real(app, "--local-fraction", local_fraction,
                         "share of failures the node-local and partner levels recover from (the "
                         "rest need the shared level)",
                         0, 1);
    if (const int code = dtrain_cli::run_parser_mpi(app, argc, argv); code >= 0) {
      MPI_Finalize();
      return code;
    }
  }
  int code = 0;
  double restore_seconds = 0;  // the faster restore strategy's median, for the interval advice
  try {
    if (xor_only) {
      if (levels_dir.empty()) throw std::runtime_error("--xor-probe needs --levels LOCALDIR");
      xor_probe(levels_dir, static_cast<std::size_t>(mib * (1 << 20) / p), saves, rank, p);
      MPI_Finalize();
      return 0;
    }
    Comm comm(MPI_COMM_WORLD);
    BenchModel model(mib);
    Cursor cursor;
    cursor.position = rank;
    const std::size_t bytes = model.bytes();
    if (rank == 0) std::filesystem::create_directories(dir);
    MPI_Barrier(MPI_COMM_WORLD);

    auto run_saves = [&](const std::string& d, dtrain::CheckpointStrategy s, int n,
                         std::vector<double>& base, std::vector<double>& save) {
      dtrain::CheckpointOptions o;
      o.read_env = false;  // what is measured is what the command line says
      o.keep_last = keep;
      o.strategy = s;
      o.config = "ckpt_bench --mb " + std::to_string(mib);
      dtrain::Checkpointer<Comm> ckpt(comm, d, o);
      for (int k = 1; k <= n; ++k) {
        base.push_back(plain_write(d, model, rank, k, keep));  // interleaved: same disk, same noise
        MPI_Barrier(MPI_COMM_WORLD);
        dtrain::Timer t;
        ckpt.save(k, dtrain::named("model", model), dtrain::per_rank("cursor", cursor));
        save.push_back(max_over_ranks(t.seconds()));
        model.step();
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0)
        for (int k = std::max(1, n - keep + 1); k <= n; ++k)
          std::filesystem::remove(d + "/plain-write-" + std::to_string(k) + ".bin");
      return ckpt.strategy();
    };

    if (rank == 0) {
      std::printf(
          "# ckpt_bench: p=%d transport=mpi dir=%s model=%.1f MiB (%zu tensors) saves=%d "
          "keep_last=%d\n",
          p, dir.c_str(), static_cast<double>(bytes) / 1048576.0, model.w.size() * 2, saves, keep);
      std::printf(
          "# MB/s = 1e6 B/s of model bytes; ratio = plain write time / this time "
          "(median of the runs, plain write measured interleaved)\n");
      std::printf("  %-22s %-16s %12s %10s %9s %7s\n", "what", "strategy", "bytes", "time(ms)",
                  "MB/s", "ratio");
    }
    std::vector<double> base, save;
    const auto used = run_saves(dir, dtrain::CheckpointStrategy::automatic, saves, base, save);
    row(rank, "plain write+fsync", "-", bytes, median(base), 0);
    row(rank, "save", dtrain::name_of(used), bytes, median(save), median(base));

    if (compare) {
      for (auto s : {dtrain::CheckpointStrategy::rank0, dtrain::CheckpointStrategy::parallel_rank0,
                     dtrain::CheckpointStrategy::parallel_slices}) {
        const std::string d = dir + "/compare-" + dtrain::name_of(s);
        std::vector<double> b2, s2;
        run_saves(d, s, saves, b2, s2);
        row(rank, "plain write+fsync", "-", bytes, median(b2), 0);
        row(rank, "save", dtrain::name_of(s), bytes, median(s2), median(b2));
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) std::filesystem::remove_all(d);
      }
    }

    if (parts) {
      // The same bytes held whole on every rank and held in parts, saved alternately (same
      // disk, same noise) with each strategy; the model does not change between the saves.
      // rank0 assembles the parts on rank 0 (a host buffer as large as the model, kept for the
      // next save); the parallel strategies write each rank's parts in place.
      PartsModel held(model, rank, p);
      std::size_t held_bytes = 0;
      for (const auto& x : held.held) held_bytes += x.bytes();
      for (auto s : {dtrain::CheckpointStrategy::rank0, dtrain::CheckpointStrategy::parallel_rank0,
                     dtrain::CheckpointStrategy::parallel_slices}) {
        const std::string d = dir + "/parts-" + dtrain::name_of(s);
        dtrain::CheckpointOptions o;
        o.read_env = false;  // what is measured is what the command line says
        o.keep_last = 2;
        o.strategy = s;
        dtrain::Checkpointer<Comm> ckpt(comm, d, o);
        std::vector<double> whole_s, parts_s;
        double kept = 0;  // rank 0's host buffers after the last save held in parts
        for (int k = 1; k <= saves; ++k) {
          MPI_Barrier(MPI_COMM_WORLD);
          dtrain::Timer t;
          ckpt.save(2 * k - 1, dtrain::named("model", model));
          whole_s.push_back(max_over_ranks(t.seconds()));
          MPI_Barrier(MPI_COMM_WORLD);
          t.reset();
          ckpt.save(2 * k, dtrain::named("model", held));
          parts_s.push_back(max_over_ranks(t.seconds()));
          kept = static_cast<double>(ckpt.buffer_bytes());
        }
        row(rank, "save, held whole", dtrain::name_of(s), bytes, median(whole_s), 0);
        row(rank, "save, held in parts", dtrain::name_of(s), bytes, median(parts_s),
            median(whole_s));
        if (rank == 0)
          std::printf("  %-22s %-16s %12.0f  (rank 0's host buffers after a save in parts)\n",
                      "kept for the next save", dtrain::name_of(s), kept);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) std::filesystem::remove_all(d);
      }
      if (rank == 0)
        std::printf(
            "# held in parts: %.1f MiB per rank (1/%d), ratio = whole-held save time / this "
            "time\n",
            static_cast<double>(held_bytes) / 1048576.0, p);
    }

    {  // Restore: newest valid checkpoint into a fresh model, by rank 0 and distributed,
      // alternately (files in the page cache, or dropped from it before each with --cold).
      // Also each rank's peak resident set during the restore above what it held before it
      // (the fresh model already in place): the restore's own memory.
      const dtrain::RestoreStrategy kinds[] = {dtrain::RestoreStrategy::rank0,
                                               dtrain::RestoreStrategy::distributed};
      std::vector<double> times[2], rise[2];
      bool peak_known = true;
      for (int k = 0; k < restores; ++k)
        for (int which = 0; which < 2; ++which) {
          BenchModel fresh(mib);
          Cursor c2;
          dtrain::CheckpointOptions o;
          o.read_env = false;  // what is measured is what the command line says
          o.restore = kinds[which];
          dtrain::Checkpointer<Comm> ckpt(comm, dir, o);
          if (cold) drop_page_cache(rank);
          MPI_Barrier(MPI_COMM_WORLD);
          peak_known = reset_peak_resident() && peak_known;
          const double before = resident_mib(false);
          dtrain::Timer t;
          auto step =
              ckpt.restore_latest(dtrain::named("model", fresh), dtrain::per_rank("cursor", c2));
          times[which].push_back(max_over_ranks(t.seconds()));
          rise[which].push_back(max_over_ranks(resident_mib(true) - before));
          if (!step || *step != saves || c2.position != rank)
            dtrain::raise<dtrain::Error>("ckpt_bench", "restore returned the wrong checkpoint");
        }
      restore_seconds = std::min(median(times[0]), median(times[1]));
      for (int which = 0; which < 2; ++which) {
        row(rank, cold ? "restore_latest, cold" : "restore_latest", dtrain::name_of(kinds[which]),
            bytes, median(times[which]), median(times[0]));
        if (rank == 0 && peak_known)
          std::printf(
              "  %-22s %-16s %12.1f  (MiB, the largest rank's peak during the restore "
              "above its resident set before it, median of %d)\n",
              "restore: peak rise", dtrain::name_of(kinds[which]), median(rise[which]), restores);
      }
      if (rank == 0)
        std::printf(
            "# restore: ratio = rank0's restore time / this time (median of %d each, "
            "alternating)\n",
            restores);
    }

    {  // Step time: no checkpoint, a synchronous save every 5 steps, an asynchronous one.
      const std::string d = dir + "/steps";
      struct Timing {
        double step = 0, blocked = 0;  // mean step time; time inside save calls per save
      };
      auto timed = [&](int mode) {
        dtrain::CheckpointOptions o;
        o.read_env = false;  // what is measured is what the command line says
        o.keep_last = 1;
        o.every_steps = 5;
        o.async = mode == 2;
        o.prefix = "step";
        dtrain::Checkpointer<Comm> ckpt(comm, d, o);
        MPI_Barrier(MPI_COMM_WORLD);
        dtrain::Timer t;
        double blocked = 0;
        int saved = 0;
        for (int s = 1; s <= steps; ++s) {
          model.step(passes);
          MPI_Allreduce(MPI_IN_PLACE, &cursor.position, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
          if (mode > 0) {
            dtrain::Timer in_save;
            saved += ckpt.maybe_save(s, dtrain::named("model", model),
                                     dtrain::per_rank("cursor", cursor));
            blocked += in_save.seconds();
          }
        }
        dtrain::Timer in_wait;
        ckpt.wait();
        blocked += in_wait.seconds();
        Timing r;
        r.step = max_over_ranks(t.seconds()) / steps;
        r.blocked = saved ? max_over_ranks(blocked) / saved : 0;
        return r;
      };
      const Timing none = timed(0), sync = timed(1), async = timed(2);
      if (rank == 0) {
        std::printf(
            "# step time over %d steps (%d passes over the parameters per step), a save "
            "every 5 steps; blocked = time the caller spent in save calls, per save\n",
            steps, passes);
        std::printf("  %-22s %10.2f ms\n", "no checkpoint", none.step * 1e3);
        std::printf("  %-22s %10.2f ms  (%+.1f%%)  blocked %.1f ms per save\n", "sync save",
                    sync.step * 1e3, 100.0 * (sync.step - none.step) / none.step,
                    sync.blocked * 1e3);
        std::printf("  %-22s %10.2f ms  (%+.1f%%)  blocked %.1f ms per save\n", "async save",
                    async.step * 1e3, 100.0 * (async.step - none.step) / none.step,
                    async.blocked * 1e3);
        // How often to save: Young/Daly with the measured cost of a save to the step (the
        // time the caller is blocked) and the measured restore.
        std::printf(
            "# interval advice (Young/Daly, include/dtrain/ckpt/interval.hpp): job MTBF %.1f h, "
            "restart = restore %.2f s\n",
            mtbf_hours, restore_seconds);
        for (const auto& [name, cost] :
             {std::pair{"sync save", sync.blocked}, std::pair{"async save", async.blocked}}) {
          if (cost <= 0) continue;
          const auto a =
              dtrain::optimal_checkpoint_interval(cost, restore_seconds, mtbf_hours * 3600);
          std::printf(
              "  %-22s save every %.0f s of work (%.0f steps): %.2f s lost per failure, "
              "overhead %.4f%%\n",
              name, a.interval, a.interval / none.step, a.lost_per_failure, 100 * a.overhead);
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) std::filesystem::remove_all(d);
    }
    if (!levels_dir.empty()) {
      // Multi-level saves: what a step is blocked by a save to the shared level (--dir) against
      // a node-local save (--levels), alone and with the partner copy (every rank a node of its
      // own), and with the background flush to --dir running; alternated, so that the same
      // noise falls on each. Over dtrain's MPI communicator, as a training job has it: the
      // partner copy travels as point-to-point messages.
      dtrain::MpiTransport transport(MPI_COMM_WORLD);
      dtrain::Communicator lcomm(transport);
      using LComm = decltype(lcomm);
      const std::string d = dir + "/levels-shared";
      auto level_opts = [&](bool partner, int shared_every) {
        dtrain::CheckpointOptions o;
        o.read_env = false;  // what is measured is what the command line says
        o.keep_last = 2;
        o.levels.local_dir = levels_dir + "/node" + std::to_string(rank);
        o.levels.node = rank;
        o.levels.partner = partner;
        o.levels.shared_every = shared_every;
        return o;
      };
      dtrain::CheckpointOptions so;
      so.read_env = false;  // what is measured is what the command line says
      so.keep_last = 2;
      dtrain::Checkpointer<LComm> shared_only(lcomm, d + "-only", so);
      dtrain::Checkpointer<LComm> local(lcomm, d + "-unused", level_opts(false, 0));
      dtrain::Checkpointer<LComm> partner(lcomm, d + "-unused", level_opts(true, 0));
      dtrain::Checkpointer<LComm> flushed(lcomm, d, level_opts(true, 1));
      std::vector<double> t_shared, t_local, t_partner, t_flushed, t_flush;
      auto timed = [&](dtrain::Checkpointer<LComm>& c, std::int64_t k, std::vector<double>& out) {
        MPI_Barrier(MPI_COMM_WORLD);
        dtrain::Timer t;
        c.save(k, dtrain::named("model", model), dtrain::per_rank("cursor", cursor));
        out.push_back(max_over_ranks(t.seconds()));
      };
      for (int k = 1; k <= saves; ++k) {
        timed(shared_only, k, t_shared);
        timed(local, k, t_local);
        timed(partner, k, t_partner);
        timed(flushed, k, t_flushed);
        dtrain::Timer t;  // the flush itself, after the save returned
        flushed.wait();
        t_flush.push_back(max_over_ranks(t.seconds()) + t_flushed.back());
        model.step();
      }
      const double shared_s = median(t_shared), local_s = median(t_local),
                   partner_s = median(t_partner), flushed_s = median(t_flushed),
                   flush_s = median(t_flush);
      if (rank == 0) {
        std::printf("# levels: node-local %s, shared %s, %d ranks = %d nodes, median of %d\n",
                    levels_dir.c_str(), dir.c_str(), p, p, saves);
        std::printf("  %-44s %10s %8s\n", "blocked per save", "time(ms)", "/shared");
        auto line = [&](const char* what, double v) {
          std::printf("  %-44s %10.1f %8.3f\n", what, v * 1e3, v / shared_s);
        };
        line("shared level (run directory), synchronous", shared_s);
        line("node-local", local_s);
        line("node-local + partner copy", partner_s);
        line("node-local + partner + shared flush started", flushed_s);
        line("  (save + background flush until done)", flush_s);
        // Young/Daly per level: the node-local + partner level recovers from the share
        // --local-fraction of the failures (one node lost), the shared level from the rest; each
        // level's save cost is what it costs the step (the flush: its own duration, the bound on
        // how often it can run).
        std::printf(
            "# interval advice per level (Young/Daly): job MTBF %.1f h; %.0f%% of failures "
            "recoverable from node-local/partner, the rest from shared; restart = restore %.2f "
            "s\n",
            mtbf_hours, 100 * local_fraction, restore_seconds);
        const double m = mtbf_hours * 3600;
        double local_interval = 0;
        for (const auto& [name, cost, share] :
             {std::tuple{"node-local + partner", partner_s, local_fraction},
              std::tuple{"shared (flush)", flush_s, 1 - local_fraction},
              std::tuple{"shared only (no levels)", shared_s, 1.0}}) {
          if (cost <= 0 || share <= 0) continue;
          const auto a = dtrain::optimal_checkpoint_interval(cost, restore_seconds, m / share);
          std::printf(
              "  %-26s cost %.3f s, MTBF %.1f h: save every %.0f s of work: %.2f s lost per "
              "failure, overhead %.4f%%",
              name, cost, m / share / 3600, a.interval, a.lost_per_failure, 100 * a.overhead);
          if (local_interval > 0 && share < 1)
            std::printf(" (shared_every = %.0f)", std::max(1.0, a.interval / local_interval));
          std::printf("\n");
          if (local_interval == 0) local_interval = a.interval;
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) {
        std::filesystem::remove_all(d);
        std::filesystem::remove_all(d + "-only");
        std::filesystem::remove_all(d + "-unused");
      }
      std::filesystem::remove_all(levels_dir + "/node" + std::to_string(rank));
    }
    if (rank == 0) std::printf("# checkpoints left in %s\n", dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_bench: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
