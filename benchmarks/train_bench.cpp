// train_bench: training throughput of one model and per-rank batch on 1 and on 2 ranks in the same
// run, so the scaling efficiency is a ratio of figures measured side by side.
//
//   OPENBLAS_NUM_THREADS=1 mpiexec.mpich -n 2 train_bench [--hidden 256] [--batch 64]
//       [--optimizer adamw|sgd] [--steps 300] [--warmup 20] [--json FILE]
//       [--device auto|cpu|cuda|hip] [--modes overlap,fully-sharded,...] [--fs-buffers 1,2,3]
//       [--state-budget-mib N] [--reproducible] [--print-loss]
//
// The 1-rank figure runs on rank 0 alone (a one-rank sub-communicator) while rank 1 waits, asleep
// (non-blocking barrier polled every millisecond, so it does not compete for a core); then both
// ranks run the same loop on MPI_COMM_WORLD. More than 2 ranks (mpiexec -n p) run the same way,
// the p-rank figure in place of the 2-rank one: for the memory figures and the loss curves, since
// with more ranks than cores the throughput measures the scheduler. Data is synthetic (an in-memory
// dataset read through the prefetching Loader, as example 10 reads its HDF5 file), the model an MLP
// 784-H-H-10 with softmax cross-entropy. Each figure is measured in five modes:
//   overlap     gradient buckets all-reduce while backward runs; wait, then opt.step()
//   no-overlap  backward first, then all buckets (ready_all), wait, opt.step()
//   fused       as overlap, but each bucket is updated by the optimizer as soon as its average
//               has arrived (sync.wait(opt)); those updates run inside the sync wait, timed
//               apart and counted as optimizer time
//   sharded     as fused, with sharded steps (GradientSync::shard_updates): each bucket
//               reduce-scattered, each rank updating its part, the parameters all-gathered
//   fully-sharded  FullyShardedSync, a unit per linear layer: parameters, gradients and
//               optimizer state held in parts (the model built with deferred arenas, so the
//               whole ones never exist), each unit all-gathered before its forward and its
//               backward (the next one prefetched with --fs-buffers 2 or 3), its gradients
//               reduce-scattered; the updates inside sync.wait(opt) are timed as optimizer time
// A last figure has both ranks train alone at once (a communicator each, no communication, overlap
// mode): the 2-rank figure over it is the cost of communication alone, where the scaling
// efficiency above also counts what two ranks lose by sharing the machine (the 1-rank run had the
// other core free for its loader and progress threads).
// Per mode: samples/s, and rank 0's split of the step (data wait, forward, backward, sync wait,
// optimizer). Forward is timed on separate forward-only passes of the same batches (the fused
// forward_backward cannot be split), backward is the remainder. Also per mode, the CPU cores the
// figure used (getrusage of every participating process, all threads, over the timed wall time):
// under a competing load a fair scheduler leaves a job at most its share of the cores, so this
// bounds how much of its quiet throughput it can keep there. Memory per rank is reported against
// the training state (parameters, gradients, optimizer state, activations and their gradients
// for one batch, the loader's prefetch buffers) twice: the peak resident set (getrusage), which
// counts every node-shared page a rank touched (with the arenas in the node-shared heap, the
// other rank's gradients that the shm all-reduce reads and writes in place as well as its own),
// and the largest proportional set size (PSS, /proc/self/smaps_rollup) seen at the end of each
// 2-rank figure's timed steps, which splits a shared page between the ranks that touch it, so that
// the ranks' figures add up to the node's use; the PSS is also given per mode (the modes run one
// after the other, each with a model and optimizer of its own: sharded keeps half the state).
// Per mode the training state a rank holds, by its parts (parameters, gradients, optimizer state,
// working buffers, activations; the largest over the ranks), and the bytes a rank sends per step
// in its collectives. Every policy allocates through a counting allocator: its peak (the model's
// construction, and the training steps) is printed beside the parts. With --state-budget-mib it
// also caps what a rank may allocate through its policy (the training state and the per-batch
// activations and input staging): a mode that does not fit is refused with the error of the
// allocation that went over, and the other modes run. With --reproducible every communicator sums
// in rank order (CommConfig::reproducible), so the replicated and the fully sharded modes give the
// same bits on any number of ranks; --print-loss prints each mode's loss per step (warm-up and
// timed steps of the first round, the mean over the ranks added in rank order), to compare the
// loss curves of two runs.
#include <mpi.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/train/json_summary.hpp>
#include <dtrain/transports/mpi.hpp>
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
#include <dtrain/kernels/host/blas_exec.hpp>
#endif

#include "common/cli_mpi.hpp"
#include "common/device.hpp"

namespace {

struct Args {
  std::int64_t hidden = 256;
  std::int64_t batch = 64;
  std::string optimizer = "adamw";
  std::int64_t steps = 300;
  std::int64_t warmup = 20;
  std::int64_t bucket_kib = 256;
  std::int64_t rounds = 1;
  double lr = 1e-3;
  std::uint64_t seed = 1;
  std::string json;
  std::string device = "auto";
  std::int64_t shared_heap = 1;
  std::vector<std::string> modes;  // empty: every mode
  std::vector<int> fs_buffers{2};  // FullyShardedOptions::buffers: a fully-sharded figure each
  double state_budget_mib = 0;     // 0: no cap
  bool reproducible = false;
  bool print_loss = false;
};

enum class Mode { overlap, no_overlap, fused, sharded, fully_sharded };
constexpr int kModes = 5;

// One measured configuration: a mode, and for the fully sharded mode its working buffers.
struct Variant {
  Mode mode;
  int buffers = 0;
  std::string label;  // the mode's name; "fully-sharded-bN" when several buffer counts run
};
const char* name_of(Mode m) {
  return m == Mode::overlap      ? "overlap"
         : m == Mode::no_overlap ? "no-overlap"
         : m == Mode::fused      ? "fused"
         : m == Mode::sharded    ? "sharded"
                                 : "fully-sharded";
}

struct Phases {
  double data = 0, forward = 0, backward = 0, sync = 0, optimizer = 0;
  double total() const { return data + forward + backward + sync + optimizer; }
};

struct Result {
  double samples_per_s = 0;
  Phases split;  // rank 0, seconds per step
  // Rank 0's wait for the latest rank's gradients, seconds per step: how much later the last
  // rank finished its forward and backward pass than rank 0, whatever the all-reduce costs (a
  // floor under rank 0's sync wait); NaN where the ranks share no clock (several nodes).
  double lag = 0;
  // What the gradient buckets' all-reduce ran at the end, and how often the buckets' adaptive
  // plans changed algorithm during the run (CommConfig::adaptive).
  std::string bucket_algorithms;
  int algorithm_changes = 0;
  bool grads_in_heap = false;  // the gradient arena lay in the node-shared heap
  // CPU the group's processes used while timed (every thread: compute, progress, loader), over
  // the timed wall time: how many cores the figure took. Under a competing load, a job cannot
  // keep more of its quiet throughput than the cores a fair scheduler leaves it over these.
  double cpu_cores = 0;
  // PSS at the end of the 2-rank figure's timed steps, MiB (NaN where not reported).
  double pss_mib = 0;
  // What this rank holds, bytes: parameters, gradients, optimizer state, working buffers (the
  // fully sharded mode's gathered units and gradient buffers), activations and their gradients
  // for one batch; and the bytes it sends per step in its collectives.
  double param_b = 0, grad_b = 0, state_b = 0, working_b = 0, act_b = 0, sent_b = 0;
  // The largest unit's working set (a parameter and a gradient buffer of the largest unit), bytes;
  // 0 but in the fully sharded mode.
  double unit_set_b = 0;
  // Peak bytes allocated through the rank's policy (largest over the ranks): while the model,
  // its sync and its optimizer were built, and over the training steps after that.
  double build_peak_b = 0, steps_peak_b = 0;
  // Not empty: the mode did not fit --state-budget-mib (the error of the allocation that went
  // over), and nothing was measured.
  std::string refused;
  // Loss per step of the first round (warm-up and timed steps), the mean over the ranks added in
  // rank order; with --print-loss only.
  std::vector<double> losses;
};

// What a rank's policy allocates over --state-budget-mib.
class BudgetExceeded final : public dtrain::Error {
 public:
  using dtrain::Error::Error;
};

// The allocator under every policy of train_bench (the shared heap's or the host's): counts the
// live and peak bytes that the model, its sync and its optimizer allocate through the policy, and
// with a budget (> 0) refuses a block that would take the live bytes over it, naming the rank and
// what was being built or run (set_operation). Thread-safe (the policy's helper threads may
// allocate); the block comes from `inner`, which must outlive it.
class BudgetAllocator final : public dtrain::Allocator {
 public:
  BudgetAllocator(dtrain::Allocator& inner, std::size_t budget, int rank)
      : inner_(inner), budget_(budget), rank_(rank) {}
  void set_operation(std::string operation) {
    const std::lock_guard<std::mutex> lock(mutex_);
    operation_ = std::move(operation);
  }
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (budget_ > 0 && live_ + bytes > budget_) {
        std::ostringstream os;
        const double mib = 1.0 / (1 << 20);
        os.setf(std::ios::fixed);
        os.precision(2);
        os << "allocating " << bytes * mib << " MiB would hold " << (live_ + bytes) * mib
           << " MiB, over this rank's budget of " << budget_ * mib << " MiB (--state-budget-mib)";
        throw dtrain::make_error<BudgetExceeded>(rank_, "train_bench (" + operation_ + ")",
                                                 os.str());
      }
      live_ += bytes;
      peak_ = std::max(peak_, live_);
    }
    try {
      return inner_.allocate(bytes, alignment);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      live_ -= bytes;
      throw;
    }
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
  void reset_peak() {
    const std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_;
  }

 private:
  dtrain::Allocator& inner_;
  const std::size_t budget_;
  const int rank_;
  mutable std::mutex mutex_;
  std::size_t live_ = 0, peak_ = 0;
  std::string operation_ = "setup";
};

constexpr std::int64_t kIn = 784, kClasses = 10;

// CPU seconds of this process so far, every thread (user and system).
double process_cpu_seconds() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// This process's proportional set size in MiB (shared pages divided among the processes that
// map them), or NaN where the kernel does not report it.
double pss_mib() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  double kib = 0;
  while (f >> key) {
    if (key == "Pss:" && (f >> kib)) return kib / 1024.0;
    f.ignore(1 << 20, '\n');
  }
  return std::nan("");
}
// The largest pss_mib() seen after a 2-rank figure's timed steps (the model, its optimizer and
// loader alive), in this process. Not after the 1-rank figures: each builds its model in private
// memory while the pages the 2-rank model had in the heap stay mapped and resident.
double g_peak_pss_mib = 0;

// Parameters of the MLP 784-H-H-10.
double parameter_count(std::int64_t h) {
  return static_cast<double>(kIn * h + h + h * h + h + h * kClasses + kClasses);
}

// On the CPU the layers' GEMM is the host policy's: CBLAS when this build links it; with --device
// cuda|hip (a build by nvcc / hipcc, DTRAIN_EXAMPLE_GPU) the model lives on the GPU.
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
using HostPolicy = dtrain::HostBlasExec;
#else
using HostPolicy = dtrain::HostExec;
#endif

// Training loop on `comm`; every rank of it calls this. Returns samples/s of the whole group
// (slowest rank's elapsed time) and rank 0's phase split per step.
// The fused mode's optimizer, timed: the bucket updates and the step's completion that
// sync.wait(opt) runs, so that the split counts them as optimizer time, not as sync wait.
template <class Opt>
struct TimedUpdates {
  Opt& opt;
  double& seconds;
  void update(std::size_t offset, std::size_t count) {
    const dtrain::Timer t;
    opt.update(offset, count);
    seconds += t.seconds();
  }
  void complete_step() {
    const dtrain::Timer t;
    opt.complete_step();
    seconds += t.seconds();
  }
  void shard_state(const std::vector<std::pair<std::size_t, std::size_t>>& parts) {
    opt.shard_state(parts);
  }
  void unshard_state() { opt.unshard_state(); }
  void set_state_partial(bool partial) { opt.set_state_partial(partial); }
  template <class F>
  void for_each_state_arena(F&& f) {
    opt.for_each_state_arena(std::forward<F>(f));
  }
};

template <class Comm, class Exec>
Result measure(Comm& comm, Exec& exec, BudgetAllocator& budget, dtrain::InMemoryDataset& data,
               const Args& a, Mode mode, int fs_buffers) {
  const int world = comm.size();
  dtrain::DistributedSampler sampler(data.size(), comm, a.seed);
  dtrain::LoaderOptions lopt;
  lopt.prefetch_depth = 2;
  const std::size_t b = static_cast<std::size_t>(a.batch);
  dtrain::Loader loader(data, sampler, b, lopt);
  using Model = dtrain::BasicSequential<float, Exec>;
  // Fully sharded: the model keeps its parts, the units are gathered by `fs`; otherwise the
  // gradient buckets of `sync_p`. Only the chosen optimizer exists, so its state alone counts in
  // the peak memory.
  std::unique_ptr<Model> model_p;
  std::unique_ptr<dtrain::FullyShardedSync<Model>> fs;
  std::unique_ptr<dtrain::BasicGradientSync<Exec>> sync_p;
  const bool use_sgd = a.optimizer == "sgd";
  std::unique_ptr<dtrain::BasicAdamW<Exec>> adamw_p;
  std::unique_ptr<dtrain::BasicSgd<Exec>> sgd_p;
  const std::string mode_name = name_of(mode);
  auto build = [&]() {
    budget.set_operation(mode_name + " mode: the model");
    const std::vector<typename Model::entry_type> layers{
        dtrain::Linear(kIn, a.hidden), dtrain::Relu(), dtrain::Linear(a.hidden, a.hidden),
        dtrain::Relu(), dtrain::Linear(a.hidden, kClasses)};
    if (mode == Mode::fully_sharded) {
      // Built without its arenas: the sync allocates this rank's parts only, init draws them.
      model_p = std::make_unique<Model>(layers, exec, dtrain::deferred_arenas);
      budget.set_operation(mode_name + " mode: FullyShardedSync");
      dtrain::FullyShardedOptions fo;
      fo.buffers = fs_buffers;
      fs = std::make_unique<dtrain::FullyShardedSync<Model>>(comm, *model_p, fo);
      model_p->init(a.seed);
    } else {
      model_p = std::make_unique<Model>(layers, exec);
      model_p->init(a.seed);
      budget.set_operation(mode_name + " mode: GradientSync");
      sync_p = std::make_unique<dtrain::BasicGradientSync<Exec>>(
          exec, comm, model_p->gradients(), static_cast<std::size_t>(a.bucket_kib) * 1024);
    }
    budget.set_operation(mode_name + " mode: the optimizer");
    dtrain::SgdOptions so;
    so.momentum = 0.9;
    if (use_sgd)
      sgd_p = std::make_unique<dtrain::BasicSgd<Exec>>(*model_p, a.lr, so);
    else
      adamw_p = std::make_unique<dtrain::BasicAdamW<Exec>>(*model_p, a.lr);
    // Sharded: the optimizer's state in this rank's parts from the start (never whole here).
    if (mode == Mode::sharded) {
      if (use_sgd)
        sync_p->shard_updates(model_p->parameters(), *sgd_p);
      else
        sync_p->shard_updates(model_p->parameters(), *adamw_p);
    }
  };

  dtrain::Batch batch;
  std::int64_t epoch = 0;
  auto next = [&]() {
    while (!loader.next(batch)) sampler.set_epoch(++epoch);
  };
  Phases ph;
  std::vector<double> fb_end;  // per timed step, when this rank's forward and backward ended
  fb_end.reserve(static_cast<std::size_t>(a.steps));
  std::vector<double> losses;  // this rank's, every step
  losses.reserve(static_cast<std::size_t>(a.warmup + a.steps));
  auto step = [&](bool timed) {
    Model& model = *model_p;
    dtrain::Timer t;
    next();
    const double t_data = t.seconds();
    t.reset();
    model.zero_grad();
    const auto* x = batch.features.as<float>().data();
    const auto* y = batch.labels.as<std::int32_t>().data();
    const auto n = static_cast<std::int64_t>(batch.size);
    double loss = 0;
    if (mode == Mode::no_overlap) {
      loss = model.forward_backward(x, y, n);
      sync_p->ready_all();
    } else if (mode == Mode::fully_sharded) {
      loss = model.forward_backward(x, y, n);
    } else {
      loss = model.forward_backward(x, y, n, dtrain::Loss::softmax_cross_entropy,
                                    [&](std::size_t o, std::size_t c) { sync_p->ready(o, c); });
    }
    losses.push_back(loss);
    const double t_fb = t.seconds();
    if (timed) fb_end.push_back(dtrain::now_seconds());
    t.reset();
    double t_opt = 0;
    if (mode == Mode::fully_sharded) {
      if (use_sgd) {
        TimedUpdates<dtrain::BasicSgd<Exec>> timed{*sgd_p, t_opt};
        fs->wait(timed);
      } else {
        TimedUpdates<dtrain::BasicAdamW<Exec>> timed{*adamw_p, t_opt};
        fs->wait(timed);
      }
    } else if (mode == Mode::fused || mode == Mode::sharded) {
      if (use_sgd) {
        TimedUpdates<dtrain::BasicSgd<Exec>> timed{*sgd_p, t_opt};
        sync_p->wait(timed);
      } else {
        TimedUpdates<dtrain::BasicAdamW<Exec>> timed{*adamw_p, t_opt};
        sync_p->wait(timed);
      }
    } else {
      sync_p->wait();
    }
    const double t_sync = t.seconds() - t_opt;
    if (mode != Mode::fused && mode != Mode::sharded && mode != Mode::fully_sharded) {
      t.reset();
      if (use_sgd)
        sgd_p->step();
      else
        adamw_p->step();
      t_opt = t.seconds();
    }
    if (timed) {
      ph.data += t_data;
      ph.backward += t_fb;  // forward is split off below
      ph.sync += t_sync;
      ph.optimizer += t_opt;
    }
  };

  // The model, its sync and optimizer, then the first two steps (where the model makes its
  // activations and input staging), under --state-budget-mib. Every rank of a mode allocates the
  // same blocks in the same order (the fully sharded parts differ by an element per unit at
  // most), so a budget is exceeded on every rank at the same allocation, before any collective
  // of its own; the ranks then agree, and the mode is refused on all of them.
  std::string failure;
  double build_peak = 0;
  const std::int64_t guarded = std::min<std::int64_t>(a.warmup, 2);
  try {
    build();
    build_peak = static_cast<double>(budget.peak());
    budget.reset_peak();
    budget.set_operation(mode_name + " mode: the first steps (activations, input staging)");
    for (std::int64_t i = 0; i < guarded; ++i) step(false);
  } catch (const BudgetExceeded& e) {
    failure = e.what();
  }
  double failed = failure.empty() ? 0 : 1;
  comm.allreduce(dtrain::BufferView(&failed, 1, dtrain::DType::f64), dtrain::ReduceOp::max);
  if (failed > 0) {
    Result r;
    r.refused = failure.empty() ? "another rank went over its --state-budget-mib" : failure;
    return r;
  }
  Model& model = *model_p;
  budget.set_operation(mode_name + " mode: the training steps");
  for (std::int64_t i = guarded; i < a.warmup; ++i) step(false);
  const std::uint64_t moved_before = fs ? fs->elements_moved() : 0;
  comm.barrier();
  const double cpu_start = process_cpu_seconds();
  const dtrain::Timer wall;
  for (std::int64_t i = 0; i < a.steps; ++i) step(true);
  double elapsed = wall.seconds();
  const std::uint64_t moved = fs ? fs->elements_moved() - moved_before : 0;
  double cpu = process_cpu_seconds() - cpu_start;
  comm.allreduce(dtrain::BufferView(&elapsed, 1, dtrain::DType::f64), dtrain::ReduceOp::max);
  comm.allreduce(dtrain::BufferView(&cpu, 1, dtrain::DType::f64), dtrain::ReduceOp::sum);
  // The latest rank's end of each step's forward and backward pass, after the timed loop (the
  // ranks of one node read one monotonic clock).
  std::vector<double> latest = fb_end;
  comm.allreduce(dtrain::BufferView(latest.data(), latest.size(), dtrain::DType::f64),
                 dtrain::ReduceOp::max);
  double lag = 0;
  for (std::size_t i = 0; i < latest.size(); ++i) lag += latest[i] - fb_end[i];

  Result r;
  if (a.print_loss) {
    // Every rank's loss of every step: each rank fills its own column of zeros, so the sum is
    // exact whatever order the all-reduce adds in; the mean then adds the ranks in rank order.
    const std::size_t steps = losses.size(), p = static_cast<std::size_t>(world);
    std::vector<double> all(steps * p, 0.0);
    for (std::size_t i = 0; i < steps; ++i)
      all[i * p + static_cast<std::size_t>(comm.rank())] = losses[i];
    comm.allreduce(dtrain::BufferView(all.data(), all.size(), dtrain::DType::f64),
                   dtrain::ReduceOp::sum);
    for (std::size_t i = 0; i < steps; ++i) {
      double sum = 0;
      for (std::size_t k = 0; k < p; ++k) sum += all[i * p + k];
      r.losses.push_back(sum / static_cast<double>(p));
    }
  }

  // Forward alone on the same batch shapes (local, outside the timed loop).
  const std::int64_t fsteps = std::max<std::int64_t>(10, a.steps / 4);
  const auto* x = batch.features.as<float>().data();
  const auto n = static_cast<std::int64_t>(batch.size);
  dtrain::PassOptions eval;
  eval.training = false;
  model.forward(x, n, eval);
  const dtrain::Timer ft;
  for (std::int64_t i = 0; i < fsteps; ++i) model.forward(x, n, eval);
  const double fwd = ft.seconds() / static_cast<double>(fsteps);

  {
    // What this rank holds, by part, and what it sends per step: an all-reduce sends
    // 2 (p-1)/p of the arena (ring or shm alike), a sharded step's reduce-scatter and
    // all-gather the same; the fully sharded step (p-1)/p of every unit it gathers or reduces.
    const double p = static_cast<double>(world), whole = 4.0 * parameter_count(a.hidden);
    const double held = 4.0 * static_cast<double>(model.parameters().count);
    const auto bsz = static_cast<double>(a.batch), h = static_cast<double>(a.hidden);
    r.param_b = held;
    r.grad_b = held;
    // Elements per state arena: SGD's momentum, AdamW's two moments.
    r.state_b = use_sgd ? 4.0 * static_cast<double>(sgd_p->state_elements())
                        : 8.0 * static_cast<double>(adamw_p->state_elements());
    r.working_b = fs ? static_cast<double>(fs->working_bytes()) : 0.0;
    r.unit_set_b = fs && world > 1 ? 2 * 4.0 * static_cast<double>(fs->largest_unit()) : 0.0;
    // Input copy, each layer's output, two input-gradient buffers of the widest input, the loss
    // gradient.
    r.act_b = 4.0 * bsz * (kIn + 4 * h + kClasses + 2 * std::max<double>(kIn, h) + kClasses);
    if (world > 1)
      r.sent_b = fs ? 4.0 * static_cast<double>(moved) * (p - 1) / p / static_cast<double>(a.steps)
                    : whole * 2 * (p - 1) / p;
    r.build_peak_b = build_peak;
    r.steps_peak_b = static_cast<double>(budget.peak());
    // The largest over the ranks (a rank's parts differ by an element per unit at most).
    double held_b[7] = {r.param_b,    r.grad_b,       r.state_b,     r.working_b,
                        r.unit_set_b, r.build_peak_b, r.steps_peak_b};
    comm.allreduce(dtrain::BufferView(held_b, 7, dtrain::DType::f64), dtrain::ReduceOp::max);
    r.param_b = held_b[0];
    r.grad_b = held_b[1];
    r.state_b = held_b[2];
    r.working_b = held_b[3];
    r.unit_set_b = held_b[4];
    r.build_peak_b = held_b[5];
    r.steps_peak_b = held_b[6];
  }
  r.samples_per_s = static_cast<double>(a.steps * a.batch * world) / elapsed;
  r.cpu_cores = cpu / elapsed;
  if (world > 1) {  // the 2-rank job, not the 1-rank figures' private copies of the model
    r.pss_mib = pss_mib();
    if (!(r.pss_mib <= g_peak_pss_mib)) g_peak_pss_mib = r.pss_mib;  // NaN where not reported
  }
  const double s = static_cast<double>(a.steps);
  r.split.data = ph.data / s;
  r.split.forward = std::min(fwd, ph.backward / s);
  r.split.backward = ph.backward / s - r.split.forward;
  r.split.sync = ph.sync / s;
  r.split.optimizer = ph.optimizer / s;
  r.lag = comm.topology().nodes == 1 ? lag / s : std::nan("");
  for (std::size_t i = 0; sync_p && i < sync_p->bucket_count(); ++i) {
    r.bucket_algorithms +=
        (i ? "," : "") + std::string(dtrain::name_of(sync_p->bucket_algorithm(i)));
    r.algorithm_changes += sync_p->bucket_algorithm_changes(i);
    if (const auto* h = dynamic_cast<const dtrain::SharedHeapAllocator*>(&comm.shared_allocator()))
      r.grads_in_heap = h->owns(model.gradients().data);
  }
  return r;
}

double peak_rss_mib() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

std::string split_json(const Phases& p) {
  const double t = p.total();
  char b[512];
  std::snprintf(b, sizeof b,
                "{\"step_ms\": %.4f, \"data_wait\": %.4f, \"forward\": %.4f, \"backward\": %.4f, "
                "\"sync_wait\": %.4f, \"optimizer\": %.4f}",
                1e3 * t, p.data / t, p.forward / t, p.backward / t, p.sync / t, p.optimizer / t);
  return b;
}

// The result with the median samples/s of `rs` (non-empty; of an even count, the lower of the
// middle two), with its own phase split.
Result median_result(std::vector<Result> rs) {
  std::sort(rs.begin(), rs.end(),
            [](const Result& x, const Result& y) { return x.samples_per_s < y.samples_per_s; });
  return rs[(rs.size() - 1) / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Args a;
  {
    CLI::App app(
        "train_bench: training samples/s of an MLP 784-H-H-10 on 1 and 2 ranks in one run "
        "(synthetic data), scaling efficiency, phase split, peak memory.",
        "train_bench");
    dtrain_cli::add_hidden(app, a.hidden);
    dtrain_cli::add_batch(app, a.batch);
    app.add_option("--optimizer", a.optimizer, "adamw or sgd (momentum 0.9)")
        ->check(CLI::IsMember({"adamw", "sgd"}))
        ->capture_default_str();
    dtrain_cli::add_int(app, "--steps", a.steps, "timed steps per figure", 1, 1000000);
    dtrain_cli::add_int(app, "--warmup", a.warmup, "untimed steps before each figure", 0, 100000);
    dtrain_cli::add_int(app, "--bucket-kib", a.bucket_kib, "gradient bucket size in KiB", 1,
                        1 << 20);
    dtrain_cli::add_int(app, "--rounds", a.rounds,
                        "interleaved rounds of the 1- and 2-rank figures of every mode; each "
                        "figure is the median over the rounds",
                        1, 100);
    dtrain_cli::add_lr(app, a.lr);
    dtrain_cli::add_seed(app, a.seed);
    dtrain_cli::add_json(app, a.json);
    dtrain_cli::add_device(app, a.device);
    dtrain_cli::add_int(app, "--shared-heap", a.shared_heap,
                        "1: the model's arenas (parameters, gradients) in the communicator's "
                        "node-shared heap (Communicator::shared_allocator), which the shm "
                        "all-reduce reads in place; 0: in private host memory (CPU only)",
                        0, 1);
    app.add_option("--modes", a.modes,
                   "the modes to measure, comma-separated (default: every mode): overlap, "
                   "no-overlap, fused, sharded, fully-sharded")
        ->delimiter(',')
        ->check(CLI::IsMember({"overlap", "no-overlap", "fused", "sharded", "fully-sharded"}));
    app.add_option("--fs-buffers", a.fs_buffers,
                   "working buffers of the fully-sharded mode (FullyShardedOptions::buffers): 1 "
                   "the memory-tight mode, 2 or 3 gather units ahead; a comma-separated list "
                   "measures each, side by side (fully-sharded-b1, ...)")
        ->delimiter(',')
        ->check(CLI::Range(1, 3))
        ->capture_default_str();
    dtrain_cli::add_real(app, "--state-budget-mib", a.state_budget_mib,
                         "cap on the bytes each rank may allocate through its policy (the model's "
                         "parameters and gradients, optimizer state, working buffers, activations "
                         "and input staging), MiB; a mode over it is refused; 0: no cap (CPU only)",
                         0, 1 << 20);
    app.add_flag("--reproducible", a.reproducible,
                 "every communicator sums in rank order (CommConfig::reproducible): the same "
                 "bits in every mode on any number of ranks");
    app.add_flag("--print-loss", a.print_loss,
                 "print each mode's loss per step (first round, warm-up and timed steps, the "
                 "mean over the ranks)");
    if (const int code = dtrain_cli::run_parser_mpi(app, argc, argv); code >= 0) {
      MPI_Finalize();
      return code;
    }
  }
  if (world < 2) {
    if (rank == 0)
      std::fprintf(stderr, "train_bench: run it on 2 ranks or more (mpiexec -n 2), not %d\n",
                   world);
    MPI_Finalize();
    return 2;
  }
  int code = 0;
  dtrain_cli::DeviceChoice device;
  try {
    device = dtrain_cli::resolve_device(a.device);  // collective; the same error on every rank
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "train_bench: %s\n", e.what());
    MPI_Finalize();
    return 1;
  }
  if (a.state_budget_mib > 0 && device.kind != dtrain_cli::DeviceKind::cpu) {
    if (rank == 0)
      std::fprintf(stderr,
                   "train_bench: --state-budget-mib caps host memory; run with "
                   "--device cpu\n");
    MPI_Finalize();
    return 2;
  }
  // The optimizers allocate their state at the first step, the model its activations at the
  // first two: those steps run where a mode over the budget is refused cleanly (measure).
  if (a.state_budget_mib > 0 && a.warmup < 2) {
    if (rank == 0)
      std::fprintf(stderr, "train_bench: --state-budget-mib needs --warmup 2 or more\n");
    MPI_Finalize();
    return 2;
  }
  const auto budget_bytes = static_cast<std::size_t>(a.state_budget_mib * (1 << 20));
  dtrain::CommConfig comm_config;
  comm_config.reproducible = a.reproducible;
  // One GPU policy object per rank for the whole run (it owns the device's streams); host
  // policies are made per figure, over the figure's counting allocator.
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
  std::unique_ptr<dtrain::GpuExec> gpu_exec;
  if (device.kind != dtrain_cli::DeviceKind::cpu)
    gpu_exec = std::make_unique<dtrain::GpuExec>(device.index);
#endif
  try {
    // The same synthetic samples on every rank: 64 global batches per epoch.
    const std::size_t n = static_cast<std::size_t>(a.batch) * 2 * 64;
    dtrain::InMemoryDataset data(dtrain::Shape{kIn}, n);
    {
      dtrain::RngStream rng(a.seed, 7);
      std::vector<float> x(kIn);
      for (std::size_t i = 0; i < n; ++i) {
        for (auto& v : x) v = static_cast<float>(rng.normal());
        data.append(dtrain::span<const float>(x.data(), x.size()),
                    static_cast<std::int32_t>(rng.below(kClasses)));
      }
    }
    // Each figure's policy allocates through a BudgetAllocator of its own (counting; capping
    // with --state-budget-mib).
    auto run = [&](auto& comm, Mode mode, int fs_buffers) {
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
      if (gpu_exec) {
        BudgetAllocator none(dtrain::default_allocator(), 0,
                             rank);  // counts nothing: device memory
        return measure(comm, *gpu_exec, none, data, a, mode, fs_buffers);
      }
#endif
      // The p-rank communicator's heap (a 1-rank one has none: host memory as before).
      BudgetAllocator budget(a.shared_heap ? comm.shared_allocator() : dtrain::default_allocator(),
                             budget_bytes, rank);
      HostPolicy exec(budget);
      return measure(comm, exec, budget, data, a, mode, fs_buffers);
    };
    MPI_Comm solo = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
    // With --shared-heap 1, a node-shared heap (unless DTRAIN_SHM_HEAP_MIB sets one) for what
    // the model and its optimizer allocate: parameters, gradients, moments, activations.
    dtrain::SharedSegmentConfig segments = dtrain::SharedSegmentConfig::from_env();
    if (a.shared_heap && segments.heap_bytes == 0) {
      const double params = parameter_count(a.hidden);
      const double act = 4.0 * static_cast<double>(a.batch) * (kIn + 4 * a.hidden + 2 * kClasses);
      segments.heap_bytes = static_cast<std::size_t>(4.0 * (6 * params + act)) + (24u << 20);
    }
    dtrain::MpiTransport world_transport(MPI_COMM_WORLD, segments);
    dtrain::Communicator world_comm(world_transport, comm_config);

    const Mode all_modes[kModes] = {Mode::overlap, Mode::no_overlap, Mode::fused, Mode::sharded,
                                    Mode::fully_sharded};
    // The figures to measure, in mode order: the fully sharded mode once per --fs-buffers value.
    std::vector<Variant> vars;
    for (const Mode mode : all_modes) {
      if (!a.modes.empty() &&
          std::find(a.modes.begin(), a.modes.end(), name_of(mode)) == a.modes.end())
        continue;
      if (mode != Mode::fully_sharded) {
        vars.push_back({mode, 0, name_of(mode)});
        continue;
      }
      for (const int b : a.fs_buffers)
        vars.push_back({mode, b,
                        a.fs_buffers.size() == 1
                            ? std::string(name_of(mode))
                            : std::string(name_of(mode)) + "-b" + std::to_string(b)});
    }
    const int nv = static_cast<int>(vars.size());
    // The replicated reference (overlap), where it runs.
    int ov = -1;
    for (int m = 0; m < nv; ++m)
      if (vars[m].mode == Mode::overlap) ov = m;
    const double p = static_cast<double>(world);
    // Every round measures each mode's 1-rank figure and then its p-rank figure, so a drift of the
    // machine's speed over the run (this one is shared) reaches both figures of a round alike;
    // each figure is the median over the rounds, and the rounds' own efficiencies give its spread.
    const auto rounds = static_cast<std::size_t>(a.rounds);
    std::vector<std::vector<Result>> one_r(nv), two_r(nv);
    for (std::size_t r = 0; r < rounds; ++r)
      for (int m = 0; m < nv; ++m) {
        // 1 rank: rank 0 on its own communicator; the others sleep in a polled non-blocking
        // barrier.
        Result solo_result;
        if (rank == 0) {
          dtrain::MpiTransport t(solo);
          dtrain::Communicator c(t, comm_config);
          solo_result = run(c, vars[m].mode, vars[m].buffers);
        }
        one_r[m].push_back(solo_result);
        MPI_Request req;
        MPI_Ibarrier(MPI_COMM_WORLD, &req);
        for (int done = 0; !done;) {
          MPI_Test(&req, &done, MPI_STATUS_IGNORE);
          if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        two_r[m].push_back(run(world_comm, vars[m].mode, vars[m].buffers));
      }
    std::vector<Result> one(nv), two(nv);
    std::vector<double> eff_lo(nv, 1e300), eff_hi(nv, 0.0);
    for (int m = 0; m < nv; ++m) {
      one[m] = median_result(one_r[m]);
      two[m] = median_result(two_r[m]);
      two[m].losses = two_r[m][0].losses;  // the first round's curve
      for (std::size_t r = 0; r < rounds; ++r) {
        if (one_r[m][r].samples_per_s <= 0) continue;  // not rank 0, or refused: no figure
        const double e = two_r[m][r].samples_per_s / (p * one_r[m][r].samples_per_s);
        eff_lo[m] = std::min(eff_lo[m], e);
        eff_hi[m] = std::max(eff_hi[m], e);
      }
    }
    // Every rank alone at once (each on a communicator of its own, no communication): what the
    // machine gives p independent trainings sharing it (cores, memory bandwidth, the helper
    // threads). The p-rank figure over this one is the cost of communication alone; the 1-rank
    // figure above also had the other core free for its loader and progress threads. Refused
    // (0) where the replicated model does not fit --state-budget-mib.
    double pair_sps = 0;
    {
      MPI_Comm own = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &own);
      dtrain::MpiTransport t(own);
      dtrain::Communicator c(t, comm_config);
      MPI_Barrier(MPI_COMM_WORLD);
      const double mine_sps = run(c, Mode::overlap, 0).samples_per_s;
      MPI_Allreduce(&mine_sps, &pair_sps, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      MPI_Comm_free(&own);
    }
    // The table automatic all-reduce followed on p ranks (calibrated in this run; every rank
    // calls it, as it is collective until calibrated): a bucket's algorithm moves the sync wait.
    std::string decisions;
    for (const auto& d : world_comm.allreduce_decisions())
      decisions += (decisions.empty() ? "" : " ") + std::to_string(d.min_bytes) + ":" +
                   dtrain::name_of(d.algo);
    const auto nw = static_cast<std::size_t>(world);
    std::vector<double> rss(nw), pss(nw);
    double mine = peak_rss_mib();
    MPI_Gather(&mine, 1, MPI_DOUBLE, rss.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&g_peak_pss_mib, 1, MPI_DOUBLE, pss.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    // Per mode, the largest over the rounds: what each mode's model and optimizer hold (the
    // modes run one after the other, each freeing its own; sharded keeps 1/p of the state).
    std::vector<double> mode_pss(nv);
    std::vector<double> modes_pss(nw * nv);  // rank-major
    for (int m = 0; m < nv; ++m) {
      mode_pss[m] = 0;
      for (const Result& x : two_r[m])
        if (!(x.pss_mib <= mode_pss[m])) mode_pss[m] = x.pss_mib;
    }
    MPI_Gather(mode_pss.data(), nv, MPI_DOUBLE, modes_pss.data(), nv, MPI_DOUBLE, 0,
               MPI_COMM_WORLD);
    if (solo != MPI_COMM_NULL) MPI_Comm_free(&solo);

    if (rank == 0) {
      const double params = parameter_count(a.hidden);
      const double state_floats = params * (a.optimizer == "sgd" ? 3 : 4);
      const double act_floats =
          2.0 * static_cast<double>(a.batch) * (kIn + 4 * a.hidden + 2 * kClasses);
      const double prefetch_floats = 3.0 * static_cast<double>(a.batch) * (kIn + 1);
      const double state_mib = 4.0 * (state_floats + act_floats + prefetch_floats) / (1 << 20);
      // The overlap mode's figures where it ran (the replicated reference), zeros otherwise.
      const Result none{};
      const Result& one0 = ov >= 0 ? one[static_cast<std::size_t>(ov)] : none;
      const Result& two0 = ov >= 0 ? two[static_cast<std::size_t>(ov)] : none;
      // "2 ranks" on 2 ranks, as the scripts that read this output expect; "p ranks" otherwise.
      const std::string pr = std::to_string(world) + " ranks",
                        prr = std::to_string(world) + "-rank";
      auto eff = [&](const Result& o, const Result& t) {
        return o.samples_per_s > 0 ? t.samples_per_s / (p * o.samples_per_s) : 0.0;
      };
      std::printf(
          "# train_bench: MLP 784-%lld-%lld-10 (%.0f parameters), %s, batch %lld per rank, %lld "
          "timed steps, synthetic data, on %s; 1 rank on a sub-communicator, then %s; "
          "median of %lld interleaved round(s)%s",
          static_cast<long long>(a.hidden), static_cast<long long>(a.hidden), params,
          a.optimizer.c_str(), static_cast<long long>(a.batch), static_cast<long long>(a.steps),
          device.describe().c_str(), pr.c_str(), static_cast<long long>(a.rounds),
          a.reproducible ? "; reproducible mode" : "");
      for (const Variant& v : vars)
        if (v.mode == Mode::fully_sharded)
          std::printf("; %s with %d working buffer(s)", v.label.c_str(), v.buffers);
      if (budget_bytes > 0) std::printf("; state budget %.2f MiB per rank", a.state_budget_mib);
      std::printf("\n");
      std::printf("# %-16s %12s %12s %10s   rank 0 split on %s: %s\n", "mode", "1 rank sps",
                  (pr + " sps").c_str(), "efficiency", pr.c_str(),
                  "data / forward / backward / sync wait / optimizer, step ms");
      for (int m = 0; m < nv; ++m) {
        if (!two[m].refused.empty()) {
          std::printf("  %-16s %12s %12s   refused: %s\n", vars[m].label.c_str(),
                      one[m].refused.empty() ? "-" : "refused", "refused", two[m].refused.c_str());
          continue;
        }
        const Phases& ps = two[m].split;
        const double t = ps.total();
        char solo_sps[32];
        if (one[m].refused.empty())
          std::snprintf(solo_sps, sizeof solo_sps, "%.0f", one[m].samples_per_s);
        else
          std::snprintf(solo_sps, sizeof solo_sps, "refused");
        std::printf(
            "  %-16s %12s %12.0f %10.3f   %4.1f%% / %4.1f%% / %4.1f%% / %4.1f%% / %4.1f%%, "
            "%.3f ms\n",
            vars[m].label.c_str(), solo_sps, two[m].samples_per_s, eff(one[m], two[m]),
            100 * ps.data / t, 100 * ps.forward / t, 100 * ps.backward / t, 100 * ps.sync / t,
            100 * ps.optimizer / t, 1e3 * t);
      }
      for (int m = 0; m < nv; ++m)
        if (two[m].refused.empty() && !one[m].refused.empty())
          std::printf("# %s on 1 rank refused: %s\n", vars[m].label.c_str(),
                      one[m].refused.c_str());
      if (rounds > 1) {
        std::printf("# efficiency of the single rounds (min - max):");
        for (int m = 0; m < nv; ++m)
          std::printf(" %s %.3f - %.3f", vars[m].label.c_str(), eff_lo[m], eff_hi[m]);
        std::printf("\n");
      }
      std::printf("# all-reduce on %s, automatic decisions (from bytes per rank): %s\n", pr.c_str(),
                  decisions.c_str());
      if (ov >= 0 && two0.refused.empty()) {
        std::printf(
            "# gradient buckets on %s (overlap, the median round) at its end: %s; algorithm "
            "changes during it: %d\n",
            pr.c_str(), two0.bucket_algorithms.c_str(), two0.algorithm_changes);
        std::printf("# gradient arena on %s in the node-shared heap: %s\n", pr.c_str(),
                    two0.grads_in_heap ? "yes (read in place by the shm all-reduce)"
                    : a.shared_heap    ? "no (no heap here: private host memory)"
                                       : "no (--shared-heap 0)");
        if (!std::isnan(two0.lag))
          std::printf(
              "# rank 0's sync wait on %s (overlap) %.3f ms per step, of which waiting for the "
              "other ranks' forward and backward to end %.3f ms (its lag behind the latest "
              "rank, whatever the all-reduce costs)\n",
              pr.c_str(), 1e3 * two0.split.sync, 1e3 * two0.lag);
      }
      std::printf(
          "# CPU cores used while timed (every thread of the group's processes over wall time), "
          "1 rank / %s:",
          pr.c_str());
      for (int m = 0; m < nv; ++m)
        std::printf(" %s %.2f / %.2f", vars[m].label.c_str(), one[m].cpu_cores, two[m].cpu_cores);
      std::printf("\n");
      if (pair_sps > 0 && ov >= 0 && two0.refused.empty())
        std::printf(
            "# every rank training alone at once (no communication): %.0f samples/s together; "
            "%s (overlap) / that = %.3f, the cost of communication alone\n",
            pair_sps, pr.c_str(), two0.samples_per_s / pair_sps);
      auto per_rank = [&](const std::vector<double>& v) {
        std::string out;
        char b[64];
        for (std::size_t k = 0; k < v.size(); ++k) {
          std::snprintf(b, sizeof b, "%srank %zu %.1f MiB", k ? ", " : "", k, v[k]);
          out += b;
        }
        return out;
      };
      std::printf(
          "# peak RSS: %s; training state %.1f MiB (parameters, gradients, optimizer state, "
          "activations, prefetch)\n",
          per_rank(rss).c_str(), state_mib);
      std::printf(
          "# largest PSS after the %s figures' timed steps: %s (rank 0 %.2fx the training state; "
          "node-shared pages split between the ranks that touch them, where the peak RSS counts "
          "them on each)\n",
          prr.c_str(), per_rank(pss).c_str(), pss[0] / state_mib);
      std::printf(
          "# PSS at the end of each mode's %s timed steps (largest round), rank 0 / "
          "rank 1 / ..., MiB:",
          pr.c_str());
      for (int m = 0; m < nv; ++m) {
        std::printf(" %s", vars[m].label.c_str());
        for (std::size_t k = 0; k < nw; ++k)
          std::printf("%s%.1f", k ? " / " : " ",
                      modes_pss[k * static_cast<std::size_t>(nv) + static_cast<std::size_t>(m)]);
      }
      std::printf("\n");
      // The training state of the memory target: parameters, gradients, optimizer state and
      // working buffers. Activations (per batch, sharded by no mode) are a column of their own,
      // outside the sum; the allocator's peaks count them.
      std::printf(
          "# training state per rank on %s (largest over the ranks), MiB: parameters + gradients "
          "+ optimizer state + working buffers = state (x overlap's); activations apart; peak "
          "allocated through the policy while building / while training (activations and "
          "staging included); sent per step\n",
          pr.c_str());
      const double mib = 1.0 / (1 << 20);
      const Result& rep = two0;
      const double rep_state = rep.param_b + rep.grad_b + rep.state_b;
      for (int m = 0; m < nv; ++m) {
        if (!two[m].refused.empty()) continue;
        const Result& x = two[m];
        const double total = x.param_b + x.grad_b + x.state_b + x.working_b;
        char ratio[32] = "-", sent_ratio[32] = "-";
        if (rep_state > 0) std::snprintf(ratio, sizeof ratio, "%.3fx", total / rep_state);
        if (rep.sent_b > 0)
          std::snprintf(sent_ratio, sizeof sent_ratio, "%.3fx", x.sent_b / rep.sent_b);
        std::printf(
            "  %-16s %7.2f + %7.2f + %7.2f + %7.2f = %7.2f (%s)   activations %6.2f   peak %7.2f "
            "/ %7.2f   sent %.2f MiB (%s the all-reduce's)\n",
            vars[m].label.c_str(), x.param_b * mib, x.grad_b * mib, x.state_b * mib,
            x.working_b * mib, total * mib, ratio, x.act_b * mib, x.build_peak_b * mib,
            x.steps_peak_b * mib, x.sent_b * mib, sent_ratio);
      }
      // The fully sharded memory target: state <= 1.1 (replicated / p + the largest unit's
      // working set), the replicated state being parameters, gradients and optimizer state whole.
      for (int m = 0; m < nv; ++m) {
        const Result& fsr = two[static_cast<std::size_t>(m)];
        if (vars[m].mode != Mode::fully_sharded || !fsr.refused.empty() || world < 2) continue;
        const double whole = 4.0 * parameter_count(a.hidden) * (a.optimizer == "sgd" ? 3 : 4);
        const double bound = 1.1 * (whole / p + fsr.unit_set_b);
        const double state = fsr.param_b + fsr.grad_b + fsr.state_b + fsr.working_b;
        std::printf(
            "# %s target: state %.2f MiB <= 1.1 x (replicated %.2f MiB / %d + the "
            "largest unit's working set %.2f MiB) = %.2f MiB: %s (%.3fx the bound); peak while "
            "training %.2f MiB, while building %.2f MiB\n",
            vars[m].label.c_str(), state * mib, whole * mib, world, fsr.unit_set_b * mib,
            bound * mib, state <= bound ? "met" : "not met", state / bound, fsr.steps_peak_b * mib,
            fsr.build_peak_b * mib);
      }
      if (a.print_loss)
        for (int m = 0; m < nv; ++m) {
          if (!two[m].refused.empty()) continue;
          std::printf("# loss per step on %s, %s (mean over the ranks): step loss\n", pr.c_str(),
                      vars[m].label.c_str());
          for (std::size_t i = 0; i < two[m].losses.size(); ++i)
            std::printf("loss %s %zu %.17g\n", vars[m].label.c_str(), i, two[m].losses[i]);
        }
      if (!a.json.empty()) {
        dtrain::JsonSummary js;
        char model[64];
        std::snprintf(model, sizeof model, "mlp-784-%lld-%lld-10", static_cast<long long>(a.hidden),
                      static_cast<long long>(a.hidden));
        js.add("model", model)
            .add("device", dtrain_cli::name_of(device.kind))
            .add("optimizer", a.optimizer)
            .add("ranks", world)
            .add("batch_per_rank", a.batch)
            .add("steps", a.steps)
            .add("samples_per_s_1", one0.samples_per_s)
            .add("samples_per_s_2", two0.samples_per_s)
            .add("scaling_efficiency", eff(one0, two0))
            .add("rounds", a.rounds)
            .add("scaling_efficiency_round_min",
                 ov >= 0 ? eff_lo[static_cast<std::size_t>(ov)] : 0.0)
            .add("scaling_efficiency_round_max",
                 ov >= 0 ? eff_hi[static_cast<std::size_t>(ov)] : 0.0)
            .add("samples_per_s_solo_pair", pair_sps)
            .add("efficiency_vs_solo_pair", pair_sps > 0 ? two0.samples_per_s / pair_sps : 0.0)
            .add("allreduce_decisions", decisions)
            .add("bucket_algorithms_2", two0.bucket_algorithms)
            .add("bucket_algorithm_changes_2", two0.algorithm_changes)
            .add("gradients_in_shared_heap", two0.grads_in_heap)
            .add("sync_wait_ms_2", 1e3 * two0.split.sync)
            .add("cpu_cores_1", one0.cpu_cores)
            .add("cpu_cores_2", two0.cpu_cores)
            .add_raw("phase_split_2", split_json(two0.split))
            .add_raw("phase_split_1", split_json(one0.split));
        if (!std::isnan(two0.lag)) js.add("lag_behind_latest_rank_ms_2", 1e3 * two0.lag);
        std::string modes_json = "{";
        bool first_mode = true;
        for (int m = 0; m < nv; ++m) {
          char b[512];
          std::snprintf(
              b, sizeof b,
              "%s\n    \"%s\": {\"samples_per_s_1\": %.1f, \"samples_per_s_2\": %.1f, "
              "\"scaling_efficiency\": %.4f, \"cpu_cores_1\": %.3f, "
              "\"cpu_cores_2\": %.3f, \"refused\": %s, \"state_mib\": %.4f, "
              "\"working_mib\": %.4f, \"activations_mib\": %.4f, \"phase_split_2\": ",
              first_mode ? "" : ",", vars[m].label.c_str(), one[m].samples_per_s,
              two[m].samples_per_s, eff(one[m], two[m]), one[m].cpu_cores, two[m].cpu_cores,
              two[m].refused.empty() ? "false" : "true",
              (two[m].param_b + two[m].grad_b + two[m].state_b + two[m].working_b) / (1 << 20),
              two[m].working_b / (1 << 20), two[m].act_b / (1 << 20));
          modes_json += b + split_json(two[m].split);
          if (a.print_loss) {
            modes_json += ", \"losses\": [";
            for (std::size_t i = 0; i < two[m].losses.size(); ++i) {
              char v[40];
              std::snprintf(v, sizeof v, "%s%.17g", i ? ", " : "", two[m].losses[i]);
              modes_json += v;
            }
            modes_json += "]";
          }
          modes_json += "}";
          first_mode = false;
        }
        modes_json += "\n  }";
        js.add_raw("modes", modes_json)
            .add("peak_rss_mib_rank0", rss[0])
            .add("peak_rss_mib_rank1", rss[1])
            .add("peak_pss_mib_rank0", pss[0])
            .add("peak_pss_mib_rank1", pss[1])
            .add("training_state_mib", state_mib);
        for (int m = 0; m < nv; ++m) {
          std::string key = "pss_mib_" + vars[m].label;
          std::replace(key.begin(), key.end(), '-', '_');
          js.add(key + "_rank0", modes_pss[static_cast<std::size_t>(m)])
              .add(key + "_rank1", modes_pss[static_cast<std::size_t>(nv + m)]);
        }
        js.write(a.json);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
