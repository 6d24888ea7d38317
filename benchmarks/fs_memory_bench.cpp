// fs_memory_bench: the memory a rank of a deep MLP's training holds, replicated or fully sharded,
// measured, one mode per process so that the process's peak resident set is that mode's own.
//
//   OPENBLAS_NUM_THREADS=1 mpiexec.mpich -n 2|3|4 fs_memory_bench --mode fully-sharded
//       [--layers 16] [--hidden 512] [--batch 64] [--steps 6] [--fs-buffers 1]
//       [--reproducible] [--print-loss] [--ckpt-dir DIR]
//
// The model: Linear(784, H), then layers - 2 Linear(H, H), then Linear(H, 10), a ReLU between
// (one fully sharded unit per linear layer), AdamW. Every rank's batch of a step comes from
// (seed, rank, step), so two runs on the same ranks see the same data whatever their mode.
// Printed per run, the largest over the ranks: the peak of the bytes the model, its sync and its
// optimizer allocate through the policy (a counting allocator), the process's peak resident set
// (VmHWM, /proc/self/status: everything, the MPI library and the shared segments included), and
// the fully sharded bound 1.1 x (replicated state / p + the largest unit's parameters and
// gradients), replicated state = parameters, gradients and AdamW's two moments. With --ckpt-dir
// the run saves a checkpoint after step steps / 2 (CheckpointOptions from the environment:
// DTRAIN_CKPT_LOCAL_DIR turns the node-local, partner and shared levels on), restores it at the
// end and runs the second half again: the losses must repeat bit for bit (--reproducible); the
// save's and the restore's times (the slowest rank) are printed.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
#include <dtrain/kernels/host/blas_exec.hpp>
using HostPolicy = dtrain::HostBlasExec;
#else
using HostPolicy = dtrain::HostExec;
#endif

namespace {

constexpr std::int64_t kIn = 784, kClasses = 10;

// Counts the live and peak bytes allocated through it. Thread-safe; `inner` outlives it.
class CountingAllocator final : public dtrain::Allocator {
 public:
  explicit CountingAllocator(dtrain::Allocator& inner) : inner_(inner) {}
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = inner_.allocate(bytes, alignment);
    const std::lock_guard<std::mutex> lock(mutex_);
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    inner_.deallocate(p, bytes);
    const std::lock_guard<std::mutex> lock(mutex_);
    live_ -= bytes;
  }
  dtrain::Space space() const noexcept override { return inner_.space(); }
  std::size_t peak() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

 private:
  dtrain::Allocator& inner_;
  mutable std::mutex mutex_;
  std::size_t live_ = 0, peak_ = 0;
};

// A line of /proc/self/status in MiB (VmHWM: the peak resident set, VmRSS: the current one);
// -1 where /proc does not say.
double proc_status_mib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.rfind(k, 0) == 0) return std::stod(line.substr(k.size())) / 1024.0;
  return -1;
}

struct Args {
  std::string mode = "fully-sharded";
  std::int64_t layers = 16, hidden = 512, batch = 64, steps = 6;
  int fs_buffers = 1;
  std::uint64_t seed = 1;
  double lr = 1e-3;
  bool reproducible = false, print_loss = false;
  std::string ckpt_dir;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Args a;
  CLI::App app(
      "fs_memory_bench: measured memory of a deep MLP's training per rank, replicated "
      "or fully sharded, against the fully sharded bound",
      "fs_memory_bench");
  app.add_option("--mode", a.mode, "replicated (GradientSync, overlapped) or fully-sharded")
      ->check(CLI::IsMember({"replicated", "fully-sharded"}))
      ->capture_default_str();
  app.add_option("--layers", a.layers, "linear layers (fully sharded units)")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden width")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--batch", a.batch, "samples per rank and step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--steps", a.steps, "training steps")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--fs-buffers", a.fs_buffers, "FullyShardedOptions::buffers")
      ->check(CLI::Range(1, 3))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the model and the data")->capture_default_str();
  app.add_flag("--reproducible", a.reproducible, "sums in rank order (CommConfig::reproducible)");
  app.add_flag("--print-loss", a.print_loss, "print the loss of every step (mean over the ranks)");
  app.add_option("--ckpt-dir", a.ckpt_dir,
                 "save after step steps/2 into this run directory, restore it at the end and "
                 "repeat the second half (levels from DTRAIN_CKPT_*)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
    MPI_Finalize();
    return code;
  }
  int code = 0;
  try {
    const bool sharded = a.mode == "fully-sharded";
    dtrain::CommConfig cc;
    cc.reproducible = a.reproducible;
    dtrain::MpiTransport transport(MPI_COMM_WORLD);
    dtrain::Communicator comm(transport, cc);
    using Comm = decltype(comm);
    // What the process holds before the model exists (MPI, BLAS, the shared segments).
    const double start_rss = proc_status_mib("VmRSS");
    CountingAllocator counting(dtrain::default_allocator());
    HostPolicy exec(counting);
    using Model = dtrain::BasicSequential<float, HostPolicy>;
    std::vector<Model::entry_type> layers{dtrain::Linear(kIn, a.hidden), dtrain::Relu()};
    for (std::int64_t l = 0; l + 2 < a.layers; ++l) {
      layers.push_back(dtrain::Linear(a.hidden, a.hidden));
      layers.push_back(dtrain::Relu());
    }
    layers.push_back(dtrain::Linear(a.hidden, kClasses));
    std::unique_ptr<Model> model;
    std::unique_ptr<dtrain::FullyShardedSync<Model>> fs;
    std::unique_ptr<dtrain::BasicGradientSync<HostPolicy>> sync;
    if (sharded) {
      model = std::make_unique<Model>(layers, exec, dtrain::deferred_arenas);
      dtrain::FullyShardedOptions fo;
      fo.buffers = a.fs_buffers;
      fs = std::make_unique<dtrain::FullyShardedSync<Model>>(comm, *model, fo);
      model->init(a.seed);
    } else {
      model = std::make_unique<Model>(layers, exec);
      model->init(a.seed);
      sync = std::make_unique<dtrain::BasicGradientSync<HostPolicy>>(exec, comm, model->gradients(),
                                                                     256 << 10);
    }
    dtrain::BasicAdamW<HostPolicy> opt(*model, a.lr);

    std::vector<float> x(static_cast<std::size_t>(a.batch * kIn));
    std::vector<std::int32_t> y(static_cast<std::size_t>(a.batch));
    auto step = [&](std::int64_t s) {
      dtrain::RngStream rng(
          a.seed, static_cast<std::uint64_t>(rank) * 1000003 + static_cast<std::uint64_t>(s));
      for (auto& v : x) v = static_cast<float>(rng.normal());
      for (auto& v : y) v = static_cast<std::int32_t>(rng.below(kClasses));
      model->zero_grad();
      double loss = 0;
      if (sharded) {
        loss = model->forward_backward(x.data(), y.data(), a.batch);
        fs->wait(opt);
      } else {
        loss = model->forward_backward(x.data(), y.data(), a.batch,
                                       dtrain::Loss::softmax_cross_entropy,
                                       [&](std::size_t o, std::size_t c) { sync->ready(o, c); });
        sync->wait();
        opt.step();
      }
      // The mean over the ranks, added in rank order.
      std::vector<double> all(static_cast<std::size_t>(world));
      MPI_Gather(&loss, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      double sum = 0;
      for (double v : all) sum += v;
      return sum / world;
    };
    std::vector<double> losses;
    std::unique_ptr<dtrain::Checkpointer<Comm>> ckpt;
    double save_s[2] = {0, 0}, restore_s = 0;  // save, save + wait; restore (the slowest rank)
    if (!a.ckpt_dir.empty()) ckpt = std::make_unique<dtrain::Checkpointer<Comm>>(comm, a.ckpt_dir);
    const std::int64_t half = a.steps / 2;
    for (std::int64_t s = 0; s < a.steps; ++s) {
      losses.push_back(step(s));
      if (ckpt && s + 1 == half) {
        MPI_Barrier(MPI_COMM_WORLD);
        dtrain::Timer t;
        ckpt->save(half, dtrain::named("model", *model), dtrain::named("optimizer", opt));
        save_s[0] = t.seconds();
        ckpt->wait();
        save_s[1] = t.seconds();
      }
    }
    if (rank == 0 && a.print_loss)
      for (std::size_t s = 0; s < losses.size(); ++s) std::printf("loss %zu %.9g\n", s, losses[s]);
    int repeated = -1;  // without --ckpt-dir: not checked
    std::string level;
    // The peaks of the training with its save, before the restore (the largest rank).
    double trained[2] = {static_cast<double>(counting.peak()), proc_status_mib("VmHWM")};
    MPI_Allreduce(MPI_IN_PLACE, trained, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const bool ckpt_ran = ckpt != nullptr;
    if (ckpt) {
      ckpt.reset();  // a fresh Checkpointer restores, as a restarted run would
      MPI_Barrier(MPI_COMM_WORLD);
      dtrain::Timer t;
      dtrain::Checkpointer<Comm> in(comm, a.ckpt_dir);
      const auto got =
          in.restore_latest(dtrain::named("model", *model), dtrain::named("optimizer", opt));
      restore_s = t.seconds();
      repeated = got && *got == half ? 1 : 0;
      level = in.options().levels.enabled() ? dtrain::name_of(in.restored_level())
                                            : std::string("run directory's");
      for (std::int64_t s = half; s < a.steps; ++s)
        if (step(s) != losses[static_cast<std::size_t>(s)]) repeated = 0;
    }
    MPI_Allreduce(MPI_IN_PLACE, save_s, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &restore_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    // Replicated state (parameters, gradients, two moments) and the bound's unit set.
    const double params = [&] {
      double n = 0;
      n += static_cast<double>(kIn * a.hidden + a.hidden);
      n += static_cast<double>(a.layers - 2) * static_cast<double>(a.hidden * a.hidden + a.hidden);
      n += static_cast<double>(a.hidden * kClasses + kClasses);
      return n;
    }();
    const double largest = fs ? static_cast<double>(fs->largest_unit()) : 0.0;
    double mine[3] = {static_cast<double>(counting.peak()), proc_status_mib("VmHWM"), start_rss};
    double most[3] = {0, 0, 0};
    MPI_Reduce(mine, most, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const double mib = 1.0 / (1 << 20), replicated = 16.0 * params;
      const double bound = 1.1 * (replicated / world + 8.0 * largest);
      std::printf(
          "fs_memory_bench: %s, %d ranks, %lld layers of %lld (%.0f parameters), batch %lld, "
          "%lld steps%s\n",
          a.mode.c_str(), world, static_cast<long long>(a.layers), static_cast<long long>(a.hidden),
          params, static_cast<long long>(a.batch), static_cast<long long>(a.steps),
          sharded ? (", buffers " + std::to_string(a.fs_buffers)).c_str() : "");
      std::printf("  replicated state %.2f MiB; largest unit %.0f elements\n", replicated * mib,
                  largest);
      std::printf(
          "  allocator peak %.2f MiB, VmHWM %.2f MiB, VmRSS before the model %.2f MiB "
          "(largest rank)\n",
          most[0] * mib, most[1], most[2]);
      if (sharded)
        std::printf(
            "  bound %.2f MiB: allocator peak %.3fx, VmHWM %.3fx, VmHWM less VmRSS before "
            "the model %.3fx the bound\n",
            bound * mib, most[0] / bound, most[1] / (bound * mib),
            (most[1] - most[2]) / (bound * mib));
      if (ckpt_ran)
        std::printf("  before the restore: allocator peak %.2f MiB, VmHWM %.2f MiB\n",
                    trained[0] * mib, trained[1]);
      if (repeated >= 0)
        std::printf("  checkpoint: save %.1f ms (%.1f ms with its wait()), restore %.1f ms\n",
                    save_s[0] * 1e3, save_s[1] * 1e3, restore_s * 1e3);
      if (repeated >= 0)
        std::printf(
            "  checkpoint: saved after step %lld, restored from the %s level; second half "
            "repeated %s\n",
            static_cast<long long>(half), level.c_str(), repeated ? "bit for bit" : "DIFFERENTLY");
    }
    if (repeated == 0) code = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
