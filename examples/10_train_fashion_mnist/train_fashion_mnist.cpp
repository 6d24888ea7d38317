// Example 10: data-parallel training of an MLP on Fashion-MNIST, one process per MPI rank.
//
// The whole dtrain loop: every rank reads only its shard of an HDF5 file (parallel HDF5), runs
// forward and backward on the CPU, averages gradients in buckets that start while backward is
// still running, applies the same AdamW step, and saves verified HDF5 checkpoints from which a
// restarted run continues exactly.
//
// What a person sees: rank 0 draws a progress line (epoch, step, loss, samples/s, ETA; redrawn in
// place on a terminal, plain lines in a log) and the distributed test accuracy after every epoch.
// With --run-dir the directory holds, besides the checkpoints, metrics.csv (one row per interval
// and per epoch, appended across restarts without duplicates), timing-rank-NNNNN.csv (every rank's
// compute, data-wait and sync-wait seconds per interval; the progress line names a rank that lags
// the median by more than 10%), metrics.png (loss and accuracy against step, when gnuplot is
// installed) and a lock held while the job runs. --json-summary FILE writes the results as JSON.
//
// Bad input is an error, not a result: every rank's options must agree; labels of the training and
// the test set are checked against the 10 classes and features for NaN/Inf when the data is opened
// (errors name the file row); train and test must have the same sample shape and storage type; a
// restart whose schedule options disagree with the checkpoint's stops unless --override-schedule.
//
// Self-check: exits non-zero unless the test accuracy after training reaches --target (default
// 0.80) and the replicas' parameters are bit-identical on every rank at the end.
//
//   mpiexec.mpich -n 2 train_fashion_mnist --data fashion_mnist.h5 [--epochs 2] [--batch 64]
//       [--hidden 256] [--lr 2e-3] [--run-dir DIR] [--ckpt-every 200] [--max-steps N]
//       [--device auto|cpu|cuda|hip] ...
// --device cuda|hip needs the GPU build of this file (train_fashion_mnist_cuda / _hip, compiled by
// nvcc / hipcc): the model, gradients and optimizer state then live on the GPU of the rank's
// node-local index; gradients are staged through pinned host memory for the all-reduce.
//   (--help lists every option)
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/hdf5.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/train/csv_log.hpp>
#include <dtrain/train/json_summary.hpp>
#include <dtrain/train/metrics_plot.hpp>
#include <dtrain/train/progress_line.hpp>
#include <dtrain/train/run_lock.hpp>
#include <dtrain/train/straggler_monitor.hpp>
#include <dtrain/transports/mpi.hpp>
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
#include <dtrain/kernels/host/blas_exec.hpp>
#endif
#include <dtrain/transports/mpi_abort.hpp>

#include "common/cli_mpi.hpp"
#include "common/device.hpp"

namespace {

constexpr std::int64_t kClasses = 10;

// On the CPU the layers' GEMM is the host policy's: CBLAS when this build links it. With
// --device cuda|hip (a build by nvcc / hipcc, DTRAIN_EXAMPLE_GPU) the model, gradients and
// optimizer state live on the GPU (dtrain::GpuBlasExec, or GpuExec without the vendor BLAS).
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
using HostPolicy = dtrain::HostBlasExec;
#else
using HostPolicy = dtrain::HostExec;
#endif
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
// On the GPU likewise: the vendor BLAS (cuBLAS / hipBLAS) where the build has it, else dtrain's
// tiled kernel (on an H200 it ran the MLP's GEMMs at 0.12-0.63x cuBLAS: benchmarks/RESULTS.md).
#if defined(DTRAIN_GPU_VENDOR_BLAS)
using GpuPolicy = dtrain::GpuBlasExec;
#else
using GpuPolicy = dtrain::GpuExec;
#endif
#endif

struct Config {
  std::string data = "fashion_mnist.h5";
  std::string run_dir;
  std::string json_summary;
  int epochs = 2;
  std::int64_t batch = 64;
  std::int64_t hidden = 256;
  double lr = 2e-3;
  std::int64_t ckpt_every = 0;
  std::int64_t max_steps = -1;
  std::int64_t log_every = 100;
  std::int64_t stop_after = -1;
  double target = 0.80;
  std::uint64_t seed = 1;
  std::int64_t bucket_kib = 256;
  bool override_schedule = false;
  bool plot = true;
  std::string device = "auto";
  std::string step_mode = "separate";
  std::string ckpt_strategy = "automatic";
};

// Returns -1 to continue, otherwise the exit code every rank returns.
int parse(int argc, char** argv, Config& c) {
  CLI::App app(
      "Example 10: data-parallel training of an MLP 784-H-H-10 on Fashion-MNIST (HDF5 from example "
      "01), one process per MPI rank. Run under mpiexec; every rank needs the same options.",
      "train_fashion_mnist");
  app.add_option("--data", c.data, "HDF5 file written by convert_idx_to_hdf5")
      ->type_name("FILE")
      ->capture_default_str();
  dtrain_cli::add_run_dir(app, c.run_dir);
  dtrain_cli::add_json_summary(app, c.json_summary);
  dtrain_cli::add_epochs(app, c.epochs);
  dtrain_cli::add_batch(app, c.batch);
  dtrain_cli::add_hidden(app, c.hidden);
  dtrain_cli::add_lr(app, c.lr);
  dtrain_cli::add_max_steps(app, c.max_steps);
  dtrain_cli::add_seed(app, c.seed);
  dtrain_cli::add_int(app, "--ckpt-every", c.ckpt_every,
                      "save a checkpoint every N steps (0: only at the end; needs --run-dir)", 0,
                      dtrain_cli::kMaxInt);
  dtrain_cli::add_int(app, "--log-every", c.log_every,
                      "steps per progress line, metrics row and per-rank timing row", 1, 1000000);
  dtrain_cli::add_int(app, "--stop-after", c.stop_after,
                      "end this invocation after N steps with a checkpoint, as when an allocation "
                      "ends; a restart with the same options continues (-1: run to the end)",
                      -1, dtrain_cli::kMaxInt);
  dtrain_cli::add_real(app, "--target", c.target,
                       "exit 1 unless the final test accuracy reaches this", 0.0, 1.0);
  dtrain_cli::add_int(app, "--bucket-kib", c.bucket_kib, "gradient bucket size in KiB", 1, 1 << 20);
  app.add_flag("--override-schedule", c.override_schedule,
               "on restart, continue under the schedule these options give even when it differs "
               "from the checkpoint's");
  app.add_flag("!--no-plot", c.plot, "do not draw RUN_DIR/metrics.png at the end");
  dtrain_cli::add_device(app, c.device);
  app.add_option("--step", c.step_mode,
                 "how the AdamW step meets the gradient sync: separate (every bucket averaged, "
                 "then one step), fused (each bucket updated as soon as its average arrives), "
                 "sharded (each bucket reduce-scattered, each rank updating its 1/p part and "
                 "keeping the moments of that part only, the parameters all-gathered); the same "
                 "parameters in all three (on 2 ranks, or with DTRAIN_COMM_REPRODUCIBLE=1, bit "
                 "for bit). sharded needs host gradients (--device cpu)")
      ->check(CLI::IsMember({"separate", "fused", "sharded"}))
      ->capture_default_str();
  app.add_option("--ckpt-strategy", c.ckpt_strategy,
                 "who writes a checkpoint: rank0 (rank 0 alone; what automatic chooses), "
                 "parallel_rank0 or parallel_slices (one MPI-IO file; a sharded step's AdamW "
                 "moments written in place by every rank, never assembled on rank 0)")
      ->check(CLI::IsMember({"automatic", "rank0", "parallel_rank0", "parallel_slices"}))
      ->capture_default_str();
  const int code = dtrain_cli::run_parser_mpi(app, argc, argv);
  if (code >= 0) return code;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* problem = nullptr;
  if (c.max_steps == 0) problem = "--max-steps 0 leaves nothing to train (-1: no limit)";
  if (c.ckpt_every > 0 && c.run_dir.empty()) problem = "--ckpt-every needs --run-dir";
  if (c.stop_after >= 0 && c.run_dir.empty()) problem = "--stop-after needs --run-dir";
  if (c.stop_after == 0) problem = "--stop-after 0 leaves nothing to train (-1: no limit)";
  if (problem) {
    if (rank == 0) std::fprintf(stderr, "train_fashion_mnist: %s\n", problem);
    return 2;
  }
  return -1;
}

// An error every rank agreed on: each rank throws it, rank 0 alone prints it.
struct JobError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Collective: runs `f` on every rank; if it threw anywhere, every rank throws JobError with the
// message of the lowest failing rank, so that a local problem (a bad row in one rank's shard) ends
// the whole job at once with one clear message instead of leaving the others in a collective.
template <class Comm, class F>
void agreed(Comm& comm, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
  }
  std::int64_t first = err.empty() ? INT64_MAX : comm.rank();
  comm.allreduce(dtrain::BufferView(&first, 1, dtrain::DType::i64), dtrain::ReduceOp::min);
  if (first == INT64_MAX) return;
  std::int64_t len = static_cast<std::int64_t>(err.size());
  comm.broadcast(dtrain::BufferView(&len, 1, dtrain::DType::i64), static_cast<int>(first));
  std::vector<std::int64_t> words((static_cast<std::size_t>(len) + 7) / 8 + 1, 0);
  std::memcpy(words.data(), err.data(), err.size());
  comm.broadcast(dtrain::BufferView(words.data(), words.size(), dtrain::DType::i64),
                 static_cast<int>(first));
  throw JobError(
      std::string(reinterpret_cast<const char*>(words.data()), static_cast<std::size_t>(len)));
}

// Collective: every rank's configuration must be rank 0's (MPMD launches or scripts that pass
// different options to different ranks would otherwise train different models in lockstep).
template <class Comm>
void agree_on_config(Comm& comm, const Config& c) {
  auto bits = [](double d) {
    std::int64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
  };
  auto text_hash = [](const std::string& s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return static_cast<std::int64_t>(h >> 1);
  };
  const char* names[] = {"--batch",      "--hidden",    "--seed",         "--epochs",
                         "--lr",         "--max-steps", "--bucket-kib",   "--ckpt-every",
                         "--log-every",  "--data",      "--run-dir",      "--override-schedule",
                         "--stop-after", "--device",    "--ckpt-strategy"};
  const std::vector<std::int64_t> mine{c.batch,
                                       c.hidden,
                                       static_cast<std::int64_t>(c.seed),
                                       c.epochs,
                                       bits(c.lr),
                                       c.max_steps,
                                       c.bucket_kib,
                                       c.ckpt_every,
                                       c.log_every,
                                       text_hash(c.data),
                                       text_hash(c.run_dir),
                                       c.override_schedule ? 1 : 0,
                                       c.stop_after,
                                       text_hash(c.device),
                                       text_hash(c.ckpt_strategy)};
  const std::size_t k = mine.size(), p = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> all(k * p);
  comm.allgather(dtrain::BufferView(const_cast<std::int64_t*>(mine.data()), k, dtrain::DType::i64),
                 dtrain::BufferView(all.data(), all.size(), dtrain::DType::i64));
  auto show = [&](std::size_t field, std::int64_t v) -> std::string {
    if (field == 4) {
      double d;
      std::memcpy(&d, &v, sizeof d);
      char b[32];
      std::snprintf(b, sizeof b, "%g", d);
      return b;
    }
    if (field == 9 || field == 10) return "(a different path)";
    if (field == 13 || field == 14) return "(a different value)";
    return std::to_string(v);
  };
  for (std::size_t r = 1; r < p; ++r)
    for (std::size_t f = 0; f < k; ++f)
      if (all[r * k + f] != all[f])
        throw JobError("train_fashion_mnist: every rank must run with the same options, but rank " +
                       std::to_string(r) + " has " + names[f] + " " + show(f, all[r * k + f]) +
                       " and rank 0 has " + names[f] + " " + show(f, all[f]) +
                       " (check the mpiexec command line)");
}

// Statistics of one rank's share of a features dataset, gathered while validating it.
struct FeatureStats {
  double sum = 0, sumsq = 0, count = 0;
};

// Local: reads this rank's contiguous share of `d` once, raw (no normalisation), and checks every
// label against the class count and every feature for NaN/Inf. Throws IoError naming the file,
// the dataset and the row. Adds the features' sum and sum of squares to `stats`.
void validate_share(dtrain::Hdf5Dataset& d, const std::string& group, int rank, int world,
                    FeatureStats& stats) {
  const char* op = "train_fashion_mnist: checking the data";
  const std::size_t n = d.size(), p = static_cast<std::size_t>(world),
                    r = static_cast<std::size_t>(rank);
  const std::size_t begin = n * r / p, end = n * (r + 1) / p, chunk = 1000;
  const std::size_t e = dtrain::element_count(d.sample_shape());
  std::vector<std::int64_t> idx;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::size_t s = begin; s < end; s += chunk) {
    const std::size_t b = std::min(chunk, end - s);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::int64_t>(s + i);
    x.resize(b * e);
    y.resize(b);
    d.read(dtrain::span<const std::int64_t>(idx.data(), b), dtrain::span<float>(x.data(), x.size()),
           dtrain::span<std::int32_t>(y.data(), b), dtrain::Normalize{});
    for (std::size_t i = 0; i < b; ++i) {
      if (y[i] < 0 || y[i] >= kClasses)
        dtrain::raise<dtrain::IoError>(
            op, "'" + d.file() + "' dataset '" + group + "/labels': row " + std::to_string(s + i) +
                    " has label " + std::to_string(y[i]) + ", outside [0, " +
                    std::to_string(kClasses) + ") for this " + std::to_string(kClasses) +
                    "-class model");
      const float* row = x.data() + i * e;
      for (std::size_t j = 0; j < e; ++j)
        if (!std::isfinite(row[j]))
          dtrain::raise<dtrain::IoError>(op, "'" + d.file() + "' dataset '" + group +
                                                 "/images': row " + std::to_string(s + i) +
                                                 " holds " + (std::isnan(row[j]) ? "NaN" : "Inf") +
                                                 " at element " + std::to_string(j));
      if (!d.stored_as_bytes())
        for (std::size_t j = 0; j < e; ++j) {
          stats.sum += row[j];
          stats.sumsq += static_cast<double>(row[j]) * row[j];
        }
    }
    stats.count += static_cast<double>(b * e);
  }
}

// Fraction of rows [0, limit) of `d` classified correctly: each rank evaluates its contiguous
// share, the counts are summed over ranks. Collective.
template <class Comm, class Model>
double evaluate(Comm& comm, Model& model, dtrain::Hdf5Dataset& d, const dtrain::Normalize& norm,
                std::size_t limit) {
  const std::size_t n = std::min(limit, d.size());
  const std::size_t p = static_cast<std::size_t>(comm.size()),
                    r = static_cast<std::size_t>(comm.rank());
  const std::size_t begin = n * r / p, end = n * (r + 1) / p;
  const std::size_t chunk = 1000;
  const std::size_t features = dtrain::element_count(d.sample_shape());
  std::vector<std::int64_t> idx;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::int64_t counts[2] = {0, static_cast<std::int64_t>(end - begin)};
  for (std::size_t s = begin; s < end; s += chunk) {
    const std::size_t b = std::min(chunk, end - s);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::int64_t>(s + i);
    x.resize(b * features);
    y.resize(b);
    d.read(dtrain::span<const std::int64_t>(idx.data(), b), dtrain::span<float>(x.data(), x.size()),
           dtrain::span<std::int32_t>(y.data(), b), norm);
    counts[0] += model.count_correct(x.data(), y.data(), static_cast<std::int64_t>(b));
  }
  comm.allreduce(dtrain::BufferView(counts, 2, dtrain::DType::i64), dtrain::ReduceOp::sum);
  return counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
}

// Every rank's parameters must be bit-identical: compare each with rank 0's by max/min of a hash
// (of a host copy made through the model's execution policy: they may live on a GPU).
template <class Comm, class Model>
bool replicas_identical(Comm& comm, Model& model) {
  const dtrain::BufferView params = model.parameters();
  std::vector<unsigned char> bytes(params.bytes());
  auto& exec = model.exec();
  exec.copy_d2h(exec.compute_stream(), bytes.data(), params.data, params.bytes());
  dtrain::exec_synchronize(exec, exec.compute_stream(), dtrain::exec_timeout_s(),
                           "train_fashion_mnist: parameter download");
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the parameter bytes
  for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  std::int64_t lo = static_cast<std::int64_t>(h >> 1), hi = lo;
  comm.allreduce(dtrain::BufferView(&lo, 1, dtrain::DType::i64), dtrain::ReduceOp::min);
  comm.allreduce(dtrain::BufferView(&hi, 1, dtrain::DType::i64), dtrain::ReduceOp::max);
  return lo == hi;
}

// What `automatic` all-reduce runs per message size, as "min_bytes:algorithm" rows ("0:rd
// 256:ring"; one row when DTRAIN_ALLREDUCE_ALGO pins it). Runs that choose differently add in
// different orders and end on different bits (README: "Which all-reduce runs, and bit-identical
// runs"). Collective the first time (it may calibrate): every rank calls it at the same point.
template <class Comm>
std::string allreduce_choice(Comm& comm) {
  if (comm.size() == 1) return "none (1 rank)";
  if (comm.config().reproducible) return "reproducible (every algorithm adds in rank order)";
  std::string rows;
  for (const auto& d : comm.allreduce_decisions())
    rows += (rows.empty() ? "" : " ") + std::to_string(d.min_bytes) + ":" + dtrain::name_of(d.algo);
  return rows;
}

}  // namespace

// Outside the unnamed namespace: the library's test for a visit_state member declares it for
// a probe visitor that never calls it, and nvcc warns about such a declaration in a type with
// internal linkage.
namespace ex10 {

// What the run was started with, stored in every checkpoint next to the model ("run/..."), so that
// a restart can tell whether its options continue the same schedule.
struct RunRecord {
  double lr = 0, min_lr = 0;
  std::int64_t epochs = 0, max_steps = -1, batch = 0, hidden = 0, seed = 0, world_size = 0;
  std::int64_t warmup = 0, total_steps = 0;
  std::string schedule;

  dtrain::Schedule make_schedule() const {
    return dtrain::Schedule::warmup_cosine(lr, warmup, total_steps, min_lr);
  }
  template <class V>
  void visit_state(V& v) {
    v.scalar("lr", lr);
    v.scalar("min_lr", min_lr);
    v.scalar("epochs", epochs);
    v.scalar("max_steps", max_steps);
    v.scalar("batch", batch);
    v.scalar("hidden", hidden);
    v.scalar("seed", seed);
    v.scalar("world_size", world_size);
    v.scalar("warmup_steps", warmup);
    v.scalar("total_steps", total_steps);
    v.scalar("schedule", schedule);
  }
};

}  // namespace ex10

namespace {

using ex10::RunRecord;

RunRecord plan_run(const Config& c, std::int64_t total_steps, int world) {
  RunRecord r;
  r.lr = c.lr;
  r.min_lr = c.lr * 0.05;
  r.epochs = c.epochs;
  r.max_steps = c.max_steps;
  r.batch = c.batch;
  r.hidden = c.hidden;
  r.seed = static_cast<std::int64_t>(c.seed);
  r.world_size = world;
  r.total_steps = std::max<std::int64_t>(total_steps, 2);
  r.warmup = std::min<std::int64_t>(100, r.total_steps / 10 + 1);
  r.schedule = r.make_schedule().describe();
  return r;
}

// The options of `now` that change the schedule or the model, where they differ from `then`.
std::string schedule_differences(const RunRecord& then, const RunRecord& now) {
  std::string d;
  auto add = [&](const char* name, const std::string& a, const std::string& b) {
    if (a != b) d += std::string(d.empty() ? "" : ", ") + name + " " + a + " (now " + b + ")";
  };
  auto real = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  add("--lr", real(then.lr), real(now.lr));
  add("--epochs", std::to_string(then.epochs), std::to_string(now.epochs));
  add("--max-steps", std::to_string(then.max_steps), std::to_string(now.max_steps));
  add("--batch", std::to_string(then.batch), std::to_string(now.batch));
  return d;
}

// The node-shared segments: as the environment says, and on the CPU a node-shared heap for the
// model (unless DTRAIN_SHM_HEAP_MIB sets one): parameters, gradients, AdamW's moments, the
// activations of a batch, and room for the all-reduce calibration's buffers.
dtrain::SharedSegmentConfig shared_segments(const Config& cfg, bool host) {
  dtrain::SharedSegmentConfig seg = dtrain::SharedSegmentConfig::from_env();
  if (host && seg.heap_bytes == 0) {
    const std::size_t h = static_cast<std::size_t>(cfg.hidden),
                      b = static_cast<std::size_t>(cfg.batch);
    const std::size_t c = static_cast<std::size_t>(kClasses);
    const std::size_t params = 784 * h + h + h * h + h + h * c + c;
    seg.heap_bytes = 4 * (4 * params + 4 * b * (784 + 2 * h + c)) + (24u << 20);
  }
  return seg;
}

template <class Exec>
int run(const Config& cfg, Exec& given_exec, const dtrain_cli::DeviceChoice& device) {
  constexpr bool host = std::is_constructible_v<Exec, dtrain::Allocator&>;
  dtrain::MpiTransport transport(MPI_COMM_WORLD, shared_segments(cfg, host));
  // Without DTRAIN_TUNING_FILE, the run directory keeps the all-reduce calibration: a resumed
  // run then picks the same algorithm per message size as the run it continues, so it goes on
  // bit for bit (a resume on another world size finds the file stale and recalibrates).
  dtrain::CommConfig comm_config = dtrain::CommConfig::from_env();
  if (comm_config.tuning_file.empty() && !cfg.run_dir.empty())
    comm_config.tuning_file = cfg.run_dir + "/allreduce_tuning.txt";
  dtrain::Communicator comm(transport, comm_config);
  // On the CPU the model lives in the node-shared heap, so the shm all-reduce (hier inside each
  // node over several) reads its gradient buckets in place (host memory where a rank is alone).
  std::unique_ptr<Exec> heap_exec;
  if constexpr (host) heap_exec = std::make_unique<Exec>(comm.shared_allocator());
  Exec& exec = heap_exec ? *heap_exec : given_exec;
  const int rank = comm.rank(), world = comm.size();
  dtrain::detail::RankScope scope(rank);
  const dtrain::Timer wall;

  agree_on_config(comm, cfg);

  // The run directory belongs to this job while it runs (rank 0 holds the lock).
  std::unique_ptr<dtrain::RunDirLock> lock;
  if (!cfg.run_dir.empty())
    agreed(comm, [&] {
      if (rank == 0) lock = std::make_unique<dtrain::RunDirLock>(cfg.run_dir);
    });

  // 1. Shard: each rank reads only the rows its sampler hands it, on the loader's background
  //    thread (double buffering), through parallel HDF5 (MPI-IO at MPI_THREAD_MULTIPLE).
  std::unique_ptr<dtrain::Hdf5Dataset> train_p, test_p;
  agreed(comm, [&] {
    train_p = std::make_unique<dtrain::Hdf5Dataset>(cfg.data, "train/images", "train/labels",
                                                    comm.transport().mpi_comm());
  });
  agreed(comm, [&] {
    test_p = std::make_unique<dtrain::Hdf5Dataset>(cfg.data, "test/images", "test/labels",
                                                   comm.transport().mpi_comm());
  });
  dtrain::Hdf5Dataset& train = *train_p;
  dtrain::Hdf5Dataset& test = *test_p;
  FeatureStats stats;
  agreed(comm, [&] {
    const char* op = "train_fashion_mnist: checking the data";
    const std::string f = "'" + cfg.data + "': ";
    if (train.size() == 0) dtrain::raise<dtrain::IoError>(op, f + "the training set is empty");
    if (test.size() == 0) dtrain::raise<dtrain::IoError>(op, f + "the test set is empty");
    for (const auto* d : {&train, &test})
      if (d->num_classes() != 0 && d->num_classes() != kClasses)
        dtrain::raise<dtrain::IoError>(
            op, f + "the labels declare " + std::to_string(d->num_classes()) +
                    " classes (attribute num_classes) but the model has " +
                    std::to_string(kClasses));
    if (train.sample_shape() != test.sample_shape())
      dtrain::raise<dtrain::IoError>(
          op, f + "train images have shape " + dtrain::to_string(train.sample_shape()) +
                  " but test images " + dtrain::to_string(test.sample_shape()));
    if (train.stored_as_bytes() != test.stored_as_bytes())
      dtrain::raise<dtrain::IoError>(
          op, f + "train images are stored as " +
                  (train.stored_as_bytes() ? "unsigned bytes" : "another type") +
                  " but test images as " +
                  (test.stored_as_bytes() ? "unsigned bytes" : "another type") +
                  "; convert both the same way");
    FeatureStats unused;
    validate_share(train, "train", rank, world, stats);
    validate_share(test, "test", rank, world, unused);
  });
  // Bytes hold Fashion-MNIST's grey levels (statistics quoted in [0, 1]); other storage types are
  // normalised by the training set's own mean and standard deviation.
  dtrain::Normalize norm = dtrain::Normalize::from_unit_range(0.2860f, 0.3530f);
  if (!train.stored_as_bytes()) {
    double s[3] = {stats.sum, stats.sumsq, stats.count};
    comm.allreduce(dtrain::BufferView(s, 3, dtrain::DType::f64), dtrain::ReduceOp::sum);
    const double mean = s[0] / s[2], var = std::max(0.0, s[1] / s[2] - mean * mean);
    norm = dtrain::Normalize{1.0f, static_cast<float>(mean),
                             static_cast<float>(var > 0 ? std::sqrt(var) : 1.0)};
  }

  dtrain::DistributedSampler sampler(train.size(), comm, cfg.seed);
  dtrain::LoaderOptions lopt;
  lopt.prefetch_depth = 2;
  lopt.transform = norm;
  lopt.flatten = true;
  const std::size_t batch_size = static_cast<std::size_t>(cfg.batch);
  dtrain::Loader loader(train, sampler, batch_size, lopt);
  const std::int64_t in = static_cast<std::int64_t>(dtrain::element_count(train.sample_shape()));

  // 2. Model: identical initialisation on every rank from the seed, no communication.
  dtrain::BasicSequential<float, Exec> model(
      {dtrain::Linear(in, cfg.hidden), dtrain::Relu(), dtrain::Linear(cfg.hidden, cfg.hidden),
       dtrain::Relu(), dtrain::Linear(cfg.hidden, kClasses)},
      exec);
  model.init(cfg.seed);
  const std::int64_t steps_per_epoch = static_cast<std::int64_t>(sampler.num_batches(batch_size));
  auto cap = [&](std::int64_t n) { return cfg.max_steps >= 0 ? std::min(n, cfg.max_steps) : n; };
  RunRecord record = plan_run(cfg, cap(steps_per_epoch * cfg.epochs), world);

  // 5. Save: verified HDF5 checkpoints; a restarted run continues from the newest valid one. The
  //    run record is read first, so that the optimizer is built with the schedule it continues.
  std::unique_ptr<dtrain::Checkpointer<decltype(comm)>> ckpt;
  std::int64_t step = 0;
  std::optional<std::int64_t> resumed;
  RunRecord saved;
  std::string resume_note;
  if (!cfg.run_dir.empty()) {
    dtrain::CheckpointOptions copt;
    copt.every_steps = cfg.ckpt_every;
    copt.keep_last = 2;
    for (auto st :
         {dtrain::CheckpointStrategy::automatic, dtrain::CheckpointStrategy::rank0,
          dtrain::CheckpointStrategy::parallel_rank0, dtrain::CheckpointStrategy::parallel_slices})
      if (cfg.ckpt_strategy == dtrain::name_of(st)) copt.strategy = st;
    copt.config = "model=mlp-784-" + std::to_string(cfg.hidden) + "-" + std::to_string(cfg.hidden) +
                  "-10 batch=" + std::to_string(cfg.batch) + " lr=" + std::to_string(cfg.lr);
    ckpt = std::make_unique<dtrain::Checkpointer<decltype(comm)>>(comm, cfg.run_dir, copt);
    resumed = ckpt->restore_latest(dtrain::named("run", saved));
    if (resumed) {
      if (saved.hidden != cfg.hidden || saved.seed != static_cast<std::int64_t>(cfg.seed))
        throw JobError("train_fashion_mnist: the run in " + cfg.run_dir +
                       " trains a model with --hidden " + std::to_string(saved.hidden) +
                       " --seed " + std::to_string(saved.seed) + "; this restart has --hidden " +
                       std::to_string(cfg.hidden) + " --seed " + std::to_string(cfg.seed) +
                       ". Restart with those options or choose another --run-dir.");
      const std::string diff = schedule_differences(saved, record);
      if (!diff.empty() && !cfg.override_schedule)
        throw JobError(
            "train_fashion_mnist: the run in " + cfg.run_dir + " was started with " + diff +
            "; its schedule is " + saved.schedule +
            ". Restart with the original options, pass --override-schedule to continue from step " +
            std::to_string(*resumed) +
            " under the new options' schedule, or choose another --run-dir.");
      if (diff.empty()) {
        record.total_steps = saved.total_steps;  // the schedule continues as planned
        record.warmup = saved.warmup;
        record.schedule = saved.schedule;
      } else {
        resume_note = "continuing under a new schedule (--override-schedule; was " + diff + ")";
      }
    }
  }
  dtrain::BasicAdamW<Exec> opt(model, record.make_schedule());
  // 3. Reconcile: gradient buckets all-reduce while backward is still running.
  dtrain::BasicGradientSync<Exec> sync(exec, comm, model.gradients(),
                                       static_cast<std::size_t>(cfg.bucket_kib) * 1024);
  // Sharded steps need gradients reduced where they are: a GPU build that stages them through host
  // memory refuses, on every rank alike (an agreed error, not a fail-fast abort). The optimizer's
  // state is sharded at once: it never exists whole, and the restore below loads its parts.
  if (cfg.step_mode == "sharded")
    agreed(comm, [&] { sync.shard_updates(model.parameters(), opt); });
  if (resumed) {
    // The file whose run record was checked above (restore_latest chose it and reported it).
    step = ckpt->restore(ckpt->path_for(*resumed), dtrain::named("model", model),
                         dtrain::named("optimizer", opt), dtrain::named("sampler", sampler),
                         dtrain::named("run", saved));
    opt.set_schedule(record.make_schedule());
  }

  // The steps this run takes: what is left of the current epoch at this world size, then whole
  // epochs (a checkpoint written by another number of ranks continues its epoch where it stopped).
  std::int64_t total_steps = record.total_steps;
  if (resumed) {
    const std::int64_t left_in_epoch =
        sampler.epoch() < cfg.epochs
            ? static_cast<std::int64_t>(sampler.remaining_batches(batch_size))
            : 0;
    const std::int64_t later =
        std::max<std::int64_t>(0, cfg.epochs - sampler.epoch() - 1) * steps_per_epoch;
    total_steps = cap(step + left_in_epoch + later);
    if (saved.world_size != world && resume_note.empty())
      resume_note = "the checkpoint was written by " + std::to_string(saved.world_size) +
                    " ranks: the epoch continues at sample " + std::to_string(sampler.position()) +
                    " of " + std::to_string(train.size()) + " on " + std::to_string(world) +
                    "; the schedule keeps its " + std::to_string(record.total_steps) + " steps";
  }
  record.world_size = world;
  if (resumed && record.schedule != saved.schedule) {
    // --override-schedule: the new schedule ends where this run ends.
    record.total_steps = std::max<std::int64_t>(total_steps, 2);
    record.warmup = std::min<std::int64_t>(100, record.total_steps / 10 + 1);
    record.schedule = record.make_schedule().describe();
    opt.set_schedule(record.make_schedule());
  }

  // What rank 0 writes: progress, metrics; every rank: its own timing file.
  const bool keep = resumed.has_value();
  dtrain::CsvLog metrics;
  if (rank == 0 && !cfg.run_dir.empty())
    metrics = dtrain::CsvLog(cfg.run_dir + "/metrics.csv",
                             {"step", "epoch", "loss", "lr", "train_accuracy", "test_accuracy",
                              "samples_per_s", "data_s", "compute_s", "sync_s", "optimizer_s"},
                             keep ? step : -1);
  char timing_name[64];
  std::snprintf(timing_name, sizeof timing_name, "/timing-rank-%05d.csv", rank);
  dtrain::StragglerMonitor<decltype(comm)> stragglers(
      comm, cfg.run_dir.empty() ? std::string() : cfg.run_dir + timing_name, keep ? step : -1);
  dtrain::ProgressLine progress;

  if (rank == 0) {
    std::printf(
        "dtrain %s: %d ranks, %zu parameters, batch %lld per rank (%lld global), %lld steps/epoch, "
        "%lld steps, on %s\n",
        dtrain::version_string(), world, model.parameter_count(), static_cast<long long>(cfg.batch),
        static_cast<long long>(cfg.batch * world), static_cast<long long>(steps_per_epoch),
        static_cast<long long>(total_steps), device.describe().c_str());
    if (resumed && step < total_steps)
      std::printf("resuming from step %lld (epoch %lld, sample %llu of %zu) in %s\n",
                  static_cast<long long>(step), static_cast<long long>(sampler.epoch() + 1),
                  static_cast<unsigned long long>(sampler.position()), train.size(),
                  cfg.run_dir.c_str());
    if (!resume_note.empty()) std::printf("%s\n", resume_note.c_str());
    std::fflush(stdout);
  }
  const std::int64_t first_step = step;
  const bool already_complete = resumed && step >= total_steps;

  dtrain::Batch batch;
  double t_data = 0, t_compute = 0, t_sync = 0, t_opt = 0;  // whole run, this rank
  double i_data = 0, i_compute = 0, i_sync = 0, i_opt = 0, loss_sum = 0, epoch_loss = 0;
  std::int64_t loss_n = 0, epoch_loss_n = 0, samples = 0, i_samples = 0, i_steps = 0;
  double last_loss = NAN, test_acc = NAN, train_acc = NAN;
  std::int64_t epochs_done = 0;
  const dtrain::Timer train_time;
  dtrain::Timer interval;
  std::string straggler_note;
  bool done = step >= total_steps;
  for (std::int64_t epoch = sampler.epoch(); !done && epoch < cfg.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    bool epoch_ended = false;
    for (;;) {
      if (step >= total_steps || (cfg.stop_after > 0 && step - first_step >= cfg.stop_after)) {
        done = true;
        break;
      }
      dtrain::Timer t;
      if (!loader.next(batch)) {
        epoch_ended = true;
        break;
      }
      i_data += t.seconds();
      t.reset();
      model.zero_grad();
      dtrain::PassOptions pass;
      pass.step = step;
      pass.sample_ids = batch.indices.data();
      const double loss =
          model.forward_backward(batch, sync, dtrain::Loss::softmax_cross_entropy, pass);
      i_compute += t.seconds();
      t.reset();
      if (cfg.step_mode == "separate") {
        sync.wait();
        i_sync += t.seconds();
        t.reset();
        opt.step();
        i_opt += t.seconds();
      } else {
        sync.wait(opt);  // the buckets' updates run inside the wait
        i_sync += t.seconds();
      }
      ++step;
      ++i_steps;
      i_samples += static_cast<std::int64_t>(batch.size);
      loss_sum += loss;
      ++loss_n;
      epoch_loss += loss;
      ++epoch_loss_n;
      // After sharded steps each rank holds its parts of the moments: the checkpointer
      // assembles them on rank 0 (no gather into whole-sized moments on every rank).
      if (ckpt)
        ckpt->maybe_save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
                         dtrain::named("sampler", sampler), dtrain::named("run", record));
      // Every rank reaches the same steps, so the interval's exchange is collective-safe.
      if (step % cfg.log_every == 0 || step == total_steps) {
        const auto report = stragglers.exchange(
            step, i_steps, dtrain::PhaseTimes{i_compute + i_opt, i_data, i_sync});
        straggler_note = report.describe();
        const double secs = interval.seconds();
        const double sps = secs > 0 ? static_cast<double>(i_samples * world) / secs : NAN;
        last_loss = loss_sum / static_cast<double>(loss_n);
        if (rank == 0) {
          dtrain::ProgressState ps;
          ps.epoch = epoch;
          ps.epochs = cfg.epochs;
          ps.step = step;
          ps.total_steps = total_steps;
          ps.loss = last_loss;
          ps.samples_per_s = sps;
          ps.note = straggler_note;
          progress.update(ps);
          if (metrics.is_open())
            metrics.row({static_cast<double>(step), static_cast<double>(epoch), last_loss,
                         opt.current_lr(), NAN, NAN, sps, i_data, i_compute, i_sync, i_opt});
        }
        t_data += i_data;
        t_compute += i_compute;
        t_sync += i_sync;
        t_opt += i_opt;
        samples += i_samples;
        i_data = i_compute = i_sync = i_opt = 0;
        i_samples = i_steps = 0;
        loss_sum = 0;
        loss_n = 0;
        interval.reset();
      }
    }
    if (epoch_ended || (done && sampler.remaining_batches(batch_size) == 0)) {
      // End of an epoch: distributed accuracy on the test set and on up to 10000 training rows.
      test_acc = evaluate(comm, model, test, norm, test.size());
      train_acc = evaluate(comm, model, train, norm, 10000);
      ++epochs_done;
      if (rank == 0) {
        char b[200];
        std::snprintf(b, sizeof b,
                      "epoch %lld/%d done at step %lld: test accuracy %.4f, train accuracy %.4f "
                      "(first 10000 rows), mean loss %.4f",
                      static_cast<long long>(epoch + 1), cfg.epochs, static_cast<long long>(step),
                      test_acc, train_acc,
                      epoch_loss_n ? epoch_loss / static_cast<double>(epoch_loss_n) : NAN);
        progress.message(b);
        if (metrics.is_open())
          metrics.row({static_cast<double>(step), static_cast<double>(epoch), NAN, opt.current_lr(),
                       train_acc, test_acc, NAN, NAN, NAN, NAN, NAN});
      }
      epoch_loss = 0;
      epoch_loss_n = 0;
    }
  }
  t_data += i_data;
  t_compute += i_compute;
  t_sync += i_sync;
  t_opt += i_opt;
  samples += i_samples;
  const double train_s = train_time.seconds();
  // The last step, unless maybe_save has just written it (--ckpt-every dividing the step).
  if (ckpt && step > first_step && ckpt->last_step() != step) {
    ckpt->save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
               dtrain::named("sampler", sampler), dtrain::named("run", record));
  }

  if (std::isnan(test_acc)) test_acc = evaluate(comm, model, test, norm, test.size());
  const bool same = replicas_identical(comm, model);
  // The gradient sync has fixed the choice by now: nothing is measured here.
  const std::string choice = step > first_step ? allreduce_choice(comm) : std::string();
  if (rank == 0) {
    progress.end_line();
    if (already_complete)
      std::printf(
          "the run in %s is complete (step %lld of %lld); to start a fresh run, remove that "
          "directory or pass another --run-dir (scripts/demo: DTRAIN_DEMO_FRESH=1)\n",
          cfg.run_dir.c_str(), static_cast<long long>(step), static_cast<long long>(total_steps));
    const double per = samples ? train_s / static_cast<double>(samples) * 1e6 : 0;
    if (step > first_step) {
      std::printf(
          "trained %lld steps in %.1f s: %.0f samples/s over %d ranks (%.1f us/sample/rank)\n",
          static_cast<long long>(step - first_step), train_s,
          train_s > 0 ? static_cast<double>(samples * world) / train_s : 0.0, world, per);
      const double tot = t_data + t_compute + t_sync + t_opt;
      if (tot > 0 && cfg.step_mode == "separate")
        std::printf(
            "rank 0 time split: data %.0f%%, forward+backward %.0f%%, gradient sync wait %.0f%%, "
            "optimizer %.0f%%\n",
            100 * t_data / tot, 100 * t_compute / tot, 100 * t_sync / tot, 100 * t_opt / tot);
      else if (tot > 0)
        std::printf(
            "rank 0 time split: data %.0f%%, forward+backward %.0f%%, gradient sync wait and "
            "%s updates %.0f%%\n",
            100 * t_data / tot, 100 * t_compute / tot, cfg.step_mode.c_str(), 100 * t_sync / tot);
      const auto* heap = dynamic_cast<const dtrain::SharedHeapAllocator*>(&comm.shared_allocator());
      std::printf("all-reduce per message size (bytes:algorithm): %s; gradients %s\n",
                  choice.c_str(),
                  heap && heap->owns(model.gradients().data)
                      ? "in the node-shared heap (the node's ranks read them in place)"
                      : "in private memory");
    }
    if (step < total_steps)
      std::printf(
          "stopped after %lld steps as asked (--stop-after): step %lld of %lld is saved; "
          "run the same command again to continue\n",
          static_cast<long long>(step - first_step), static_cast<long long>(step),
          static_cast<long long>(total_steps));
    std::printf("test accuracy %.4f (target %.2f), replicas %s, wall %.1f s\n", test_acc,
                cfg.target, same ? "bit-identical" : "DIFFER", wall.seconds());
    if (!cfg.run_dir.empty()) {
      std::string plot = "not drawn (--no-plot)";
      if (cfg.plot) {
        try {
          plot = dtrain::plot_metrics(cfg.run_dir + "/metrics.csv", cfg.run_dir + "/metrics.png",
                                      "Fashion-MNIST MLP, " + std::to_string(world) + " ranks",
                                      {"loss"}, {"train_accuracy", "test_accuracy"})
                     ? cfg.run_dir + "/metrics.png"
                 : dtrain::gnuplot_available()
                     ? "not drawn (no rows in metrics.csv yet)"
                     : "not drawn (gnuplot is not installed; Debian: gnuplot-nox)";
        } catch (const std::exception& e) {
          plot = std::string("failed: ") + e.what();
        }
      }
      std::printf(
          "run directory: %s\n  metrics:     %s/metrics.csv\n  plot:        %s\n  per-rank "
          "timings: %s/timing-rank-*.csv\n  checkpoints: %s/ckpt-*.h5 (a restart with the same "
          "options continues from the newest)\n",
          cfg.run_dir.c_str(), cfg.run_dir.c_str(), plot.c_str(), cfg.run_dir.c_str(),
          cfg.run_dir.c_str());
    }
    if (!cfg.json_summary.empty()) {
      dtrain::JsonSummary js;
      js.add("test_accuracy", test_acc)
          .add("train_accuracy", train_acc)
          .add("train_loss", last_loss)
          .add("epochs", static_cast<std::int64_t>(sampler.epoch() +
                                                   (sampler.remaining_batches(batch_size) == 0)))
          .add("epochs_this_run", epochs_done)
          .add("steps", step)
          .add("total_steps", total_steps)
          .add("samples_per_s", train_s > 0 ? static_cast<double>(samples * world) / train_s : 0.0)
          .add("wall_s", wall.seconds())
          .add("world_size", world)
          .add("batch_per_rank", cfg.batch)
          .add("schedule", record.schedule)
          .add("allreduce_choice", choice)
          .add("step_mode", cfg.step_mode)
          .add("replicas_identical", same)
          .add("target", cfg.target)
          .add("complete", step >= total_steps)
          .add("passed", same && test_acc >= cfg.target);
      if (resumed)
        js.add("resumed_from_step", first_step);
      else
        js.add_raw("resumed_from_step", "null");
      js.write(cfg.json_summary);
    }
    std::fflush(stdout);
  }
  if (!same) return 1;
  return test_acc >= cfg.target ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  // Fail fast: an error on one rank prints that rank's message and ends the job with MPI_Abort,
  // without unwinding the stack into collectives (README: "When a rank fails").
  dtrain::install_mpi_fail_fast(MPI_COMM_WORLD);
  Config cfg;
  if (const int code = parse(argc, argv, cfg); code >= 0) {
    MPI_Finalize();
    return code;
  }
  int code = 0;
  try {
    dtrain_cli::DeviceChoice device;
    try {
      device = dtrain_cli::resolve_device(cfg.device);
    } catch (const std::runtime_error& e) {
      throw JobError(std::string("train_fashion_mnist: ") + e.what());  // same on every rank
    }
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
    if (device.kind != dtrain_cli::DeviceKind::cpu) {
      GpuPolicy exec(device.index);
      code = run(cfg, exec, device);
    } else
#endif
    {
      HostPolicy exec;
      code = run(cfg, exec, device);
    }
  } catch (const JobError& e) {
    // Every rank threw the same error after agreeing on it: rank 0 reports, all exit together.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fprintf(stderr, "%s\n", e.what());
    code = 1;
  }
  // No catch-all: any other error finds no handler, so std::terminate runs without unwinding and
  // the handler installed above prints it and aborts the job.
  dtrain::finalize_mpi();  // skipped if this rank failed: MPI_Finalize would wait for peers
  return code;
}
