// Example 20: in-situ training. A 2D heat-diffusion solver decomposed over MPI ranks trains an MLP
// surrogate of its own time step while it runs; nothing is written to disk but checkpoints.
//
// The simulation is an ordinary MPI code: an explicit five-point stencil on a periodic nx x ny
// grid, rows split over the ranks, halo rows exchanged with the application's own MPI_Sendrecv on
// MPI_COMM_WORLD. Every --sample-every steps each rank takes the patch x patch neighbourhoods of
// --samples random points of its subdomain; --horizon steps later, when the centres' new values
// exist, it appends them as training samples (neighbourhood at step t, relative to its centre ->
// the centre's change by step t+horizon) to its own dtrain::InMemoryDataset. Every --train-every
// steps the ranks run --opt-steps data-parallel AdamW steps on batches drawn from their stores.
//
// Mode: the same ranks alternate simulation and training. The sample data never leaves the rank
// that produced it (no copies to training ranks), no core idles while the other half of the job
// works, and the last training step's gradient all-reduce runs on dtrain's progress thread while
// the next simulation step (and its halo exchange) proceeds. A split-communicator mode would pay
// a transfer of every sample and leave cores idle whenever the two sides are unbalanced; it is
// not offered.
//
// Coexistence: dtrain's MpiTransport duplicates MPI_COMM_WORLD, so the application's messages and
// dtrain's never match each other even at MPI_THREAD_MULTIPLE with the progress thread running.
// The halo receive here accepts any tag from its neighbour and fails if it sees anything but a
// halo message: it would catch a dtrain message if the two shared a communicator. The run counts
// the halo exchanges made while a gradient all-reduce was in flight.
//
// Self-checks (exit 1 when one fails): the solver decays a Fourier mode by the exact discrete
// factor; the total heat of the main run is conserved; the surrogate's error on held-out grid
// points (never used for training) falls from its first value to below --target-error; rolled
// out for --rollout applications, it stays within --rollout-target of the solver (relative to
// the field's change over those steps); the model replicas are bit-identical on every rank.
//
// One checkpoint holds the field, the samples, the model, the optimizer and the sampler, so a
// run stopped at any step (--stop-after K exits without saving, like a killed job) and restarted
// with the same options continues exactly: its final field and parameters equal those of an
// uninterrupted run bit for bit.
//
//   mpiexec.mpich -n 2 insitu_surrogate [--steps 2000] [--run-dir insitu_run] [--help]
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>

namespace {

struct Config {
  int nx = 1024, ny = 1024;
  double r = 0.2;  // D dt / dx^2; the explicit scheme is stable for r <= 1/4
  std::int64_t steps = 3000;
  std::uint64_t seed = 1;
  std::string run_dir = "insitu_run";
  std::int64_t ckpt_every = 1000;
  std::int64_t stop_after = -1;
  std::int64_t sample_every = 10;
  std::int64_t horizon = 2;
  int patch = 5;
  std::size_t samples = 64;
  std::size_t capacity = 16384;
  std::int64_t train_every = 10;
  int opt_steps = 2;
  std::size_t batch = 128;
  std::int64_t hidden = 64;
  double lr = 3e-3;
  std::size_t validation = 256;
  std::int64_t eval_every = 100;
  int rollout = 5;
  double target_error = 0.25;
  double rollout_target = 0.25;
  std::int64_t baseline_steps = 50;
  std::int64_t baseline_every = 500;
};

constexpr int kTagUp = 1, kTagDown = 2;

#define CHECK_MPI(call)                                                               \
  do {                                                                                \
    const int rc_ = (call);                                                           \
    if (rc_ != MPI_SUCCESS) {                                                         \
      char msg_[MPI_MAX_ERROR_STRING];                                                \
      int len_ = 0;                                                                   \
      MPI_Error_string(rc_, msg_, &len_);                                             \
      throw std::runtime_error(std::string("insitu: ") + #call + " failed: " + msg_); \
    }                                                                                 \
  } while (0)

// ---------------------------------------------------------------------------------------------
// The simulation: rows [row0, row0 + rows) of a periodic grid, with `halo` ghost rows on each
// side, exchanged with the ranks above and below on the application's communicator.
struct Grid {
  int nx = 0, ny = 0, rows = 0, row0 = 0, halo = 1;
  int rank = 0, size = 1;
  MPI_Comm comm = MPI_COMM_WORLD;

  std::size_t cells() const { return static_cast<std::size_t>(rows + 2 * halo) * nx; }
  // Index of local row i (0-based interior row; -halo .. rows+halo-1 reach the ghosts), column j.
  std::size_t at(int i, int j) const { return static_cast<std::size_t>(i + halo) * nx + j; }
  int wrap(int j) const { return j < 0 ? j + nx : (j >= nx ? j - nx : j); }

  // Application halo exchange: my first `halo` rows go up, my last go down. The receive takes any
  // tag from the neighbour and checks it, so a foreign message on this communicator is an error.
  void exchange(std::vector<double>& u) const {
    const int up = (rank - 1 + size) % size, down = (rank + 1) % size;
    const int n = halo * nx;
    auto one = [&](double* send, int to, int tag, double* recv, int from) {
      MPI_Status st;
      CHECK_MPI(MPI_Sendrecv(send, n, MPI_DOUBLE, to, tag, recv, n, MPI_DOUBLE, from, MPI_ANY_TAG,
                             comm, &st));
      int count = 0;
      MPI_Get_count(&st, MPI_DOUBLE, &count);
      if (st.MPI_TAG != tag || count != n)
        throw std::runtime_error("insitu: rank " + std::to_string(rank) +
                                 ": halo exchange received tag " + std::to_string(st.MPI_TAG) +
                                 " with " + std::to_string(count) + " values from rank " +
                                 std::to_string(from) + ", expected tag " + std::to_string(tag) +
                                 " with " + std::to_string(n));
    };
    one(&u[at(0, 0)], up, kTagUp, &u[at(rows, 0)], down);
    one(&u[at(rows - halo, 0)], down, kTagDown, &u[at(-halo, 0)], up);
  }

  // One explicit step of u_t = D (u_xx + u_yy): the five-point stencil, then the halo exchange,
  // so that the ghost rows are always those of the current step (samples read them too).
  void step(std::vector<double>& u, std::vector<double>& tmp, double r) const {
    for (int i = 0; i < rows; ++i) {
      const double* c = &u[at(i, 0)];
      const double* n = &u[at(i - 1, 0)];
      const double* s = &u[at(i + 1, 0)];
      double* o = &tmp[at(i, 0)];
      o[0] = c[0] + r * (n[0] + s[0] + c[nx - 1] + c[1] - 4 * c[0]);
      for (int j = 1; j < nx - 1; ++j)
        o[j] = c[j] + r * (n[j] + s[j] + c[j - 1] + c[j + 1] - 4 * c[j]);
      o[nx - 1] = c[nx - 1] + r * (n[nx - 1] + s[nx - 1] + c[nx - 2] + c[0] - 4 * c[nx - 1]);
    }
    std::copy(tmp.begin() + at(0, 0), tmp.begin() + at(rows, 0), u.begin() + at(0, 0));
    exchange(u);
  }

  double total(const std::vector<double>& u) const {
    double local = 0, sum = 0;
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < nx; ++j) local += u[at(i, j)];
    CHECK_MPI(MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, comm));
    return sum;
  }
};

Grid make_grid(const Config& c, int rank, int size) {
  Grid g;
  g.nx = c.nx;
  g.ny = c.ny;
  g.rank = rank;
  g.size = size;
  g.row0 = static_cast<int>(static_cast<std::int64_t>(c.ny) * rank / size);
  g.rows = static_cast<int>(static_cast<std::int64_t>(c.ny) * (rank + 1) / size) - g.row0;
  g.halo = std::max(1, c.patch / 2);
  return g;
}

// Known property 1: a product of cosines is an eigenvector of the periodic five-point Laplacian,
// so the scheme multiplies its amplitude by exactly lambda = 1 + r (2 cos a + 2 cos b - 4) per
// step. Runs the same decomposition and halo exchange as the main run; returns the max error.
double check_fourier_decay(const Grid& g, double r, int steps) {
  const double pi = 3.14159265358979323846;
  const double a = 2 * pi * 3 / g.nx, b = 2 * pi * 2 / g.ny;
  std::vector<double> u(g.cells(), 0.0), tmp(g.cells(), 0.0);
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j)
      u[g.at(i, j)] = 1.0 + 0.5 * std::cos(a * j) * std::cos(b * (g.row0 + i));
  g.exchange(u);
  for (int s = 0; s < steps; ++s) g.step(u, tmp, r);
  const double amp = 0.5 * std::pow(1 + r * (2 * std::cos(a) + 2 * std::cos(b) - 4), steps);
  double err = 0, max_err = 0;
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j)
      err = std::max(err, std::abs(u[g.at(i, j)] -
                                   (1.0 + amp * std::cos(a * j) * std::cos(b * (g.row0 + i)))));
  CHECK_MPI(MPI_Allreduce(&err, &max_err, 1, MPI_DOUBLE, MPI_MAX, g.comm));
  return max_err;
}

// The main run's initial field: warm and cold Gaussian blobs (4 to 12 cells wide, one per 32 x 32
// cells) at positions drawn from the seed, each evaluated within 4 widths of its centre.
void initial_field(const Grid& g, std::uint64_t seed, std::vector<double>& u) {
  dtrain::RngStream rng(seed, 0x1b10b5);
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j) u[g.at(i, j)] = 1.0;
  const int blobs = std::max(8, g.nx / 32 * (g.ny / 32));
  for (int k = 0; k < blobs; ++k) {
    const double x = rng.uniform_double() * g.nx, y = rng.uniform_double() * g.ny;
    const double amp = rng.uniform_double() * 2 - 1;
    const double s = 4 + 8 * rng.uniform_double();
    const int reach = static_cast<int>(std::ceil(4 * s));
    for (int i = 0; i < g.rows; ++i) {
      // Periodic distances, so the field is smooth across the boundaries.
      double dy = std::abs(g.row0 + i - y);
      dy = std::min(dy, g.ny - dy);
      if (dy > reach) continue;
      const int width = std::min(2 * reach + 1, g.nx);
      const int first = 2 * reach + 1 >= g.nx ? 0 : static_cast<int>(x) - reach;
      for (int t = 0; t < width; ++t) {
        const int j = ((first + t) % g.nx + g.nx) % g.nx;
        double dx = std::abs(j - x);
        dx = std::min(dx, g.nx - dx);
        u[g.at(i, j)] += amp * std::exp(-(dx * dx + dy * dy) / (2 * s * s));
      }
    }
  }
  g.exchange(u);
}

// The simulation's per-rank checkpointed state: time step, field (with ghost rows), the samples
// waiting for their targets, and the run's bookkeeping.
struct SimState {
  std::int64_t step = 0;
  std::int64_t snap_step = -1;   // step the pending samples were taken; -1 when none are
  std::int64_t store_count = 0;  // samples in the rank's store (read before the store itself)
  std::int64_t trained = 0;      // optimizer steps so far
  double initial_total = 0;
  double first_error = -1;
  std::int64_t height = 0, width = 0, pending_rows = 0, features = 0;
  std::vector<double> u;
  std::vector<float> pending_x;      // [pending_rows, features] scaled patches
  std::vector<double> pending_meta;  // [pending_rows, 3]: centre value, scale, cell index

  template <class V>
  void visit_state(V& v) {
    v.scalar("step", step);
    v.scalar("snap_step", snap_step);
    v.scalar("store_count", store_count);
    v.scalar("trained", trained);
    v.scalar("initial_total", initial_total);
    v.scalar("first_error", first_error);
    const dtrain::Shape shape{height, width};
    v.tensor("u", dtrain::BufferView(u.data(), u.size(), dtrain::DType::f64), shape);
    v.tensor("pending_x",
             dtrain::BufferView(pending_x.data(), pending_x.size(), dtrain::DType::f32),
             dtrain::Shape{pending_rows, features});
    v.tensor("pending_meta",
             dtrain::BufferView(pending_meta.data(), pending_meta.size(), dtrain::DType::f64),
             dtrain::Shape{pending_rows, 3});
  }
};

// Grid points whose samples are never trained on: about one in eight, by a hash of the global
// position, the same whatever the decomposition.
bool held_out(int gi, int gj) {
  std::uint64_t h = static_cast<std::uint64_t>(gi) * 0x9E3779B97F4A7C15ull ^
                    static_cast<std::uint64_t>(gj) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  return (h & 7u) == 0;
}

// Turns fields into samples: the patch x patch neighbourhood of local point (i, j) relative to
// its centre value, and the centre's change over `horizon` steps per unit of r * horizon. Both
// are divided by the patch's RMS deviation: the heat step is linear and homogeneous, so the
// scaled map is the same operator, and the network sees inputs of order one whether the field is
// still rough or already smooth.
struct Sampler {
  const Grid& g;
  int radius;
  double r;
  std::int64_t horizon;

  std::size_t features() const {
    return static_cast<std::size_t>((2 * radius + 1) * (2 * radius + 1));
  }
  // Writes the scaled patch to x and returns the scale it divided by.
  double patch(const std::vector<double>& f, int i, int j, float* x) const {
    const double c = f[g.at(i, j)];
    double ss = 0;
    const std::size_t n = features();
    for (int di = -radius; di <= radius; ++di)
      for (int dj = -radius; dj <= radius; ++dj) {
        const double d = f[g.at(i + di, g.wrap(j + dj))] - c;
        ss += d * d;
      }
    const double scale = std::max(std::sqrt(ss / static_cast<double>(n)), 1e-30);
    for (int di = -radius; di <= radius; ++di)
      for (int dj = -radius; dj <= radius; ++dj)
        *x++ = static_cast<float>((f[g.at(i + di, g.wrap(j + dj))] - c) / scale);
    return scale;
  }
  float target(double before, double after, double scale) const {
    return static_cast<float>((after - before) / (r * static_cast<double>(horizon) * scale));
  }
  // Inverse of target(): the field's change predicted from a model output.
  double change(float y, double scale) const {
    return static_cast<double>(y) * scale * r * static_cast<double>(horizon);
  }
};

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The simulation alone, on a copy of the field: seconds per step, slowest rank.
double time_solver_alone(const Grid& g, const std::vector<double>& u0, double r,
                         std::int64_t steps) {
  if (steps <= 0) return 0;
  std::vector<double> u = u0, tmp(u0.size(), 0.0);
  CHECK_MPI(MPI_Barrier(g.comm));
  const dtrain::Timer t;
  for (std::int64_t s = 0; s < steps; ++s) g.step(u, tmp, r);
  double mine = t.seconds() / static_cast<double>(steps), slowest = 0;
  CHECK_MPI(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, g.comm));
  return slowest;
}

// Rank 0: keeps the CSV rows up to `step` (a resumed run rewrites what follows its checkpoint).
void open_metrics(const std::string& path, std::int64_t step, bool resumed) {
  std::vector<std::string> keep;
  const std::string header =
      "step,wall_s,sim_s,train_s,optimizer_steps,samples_per_s,loss,heldout_rel_error";
  if (resumed) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line == header) continue;
      if (std::atoll(line.c_str()) <= step) keep.push_back(line);
    }
  }
  std::ofstream out(path, std::ios::trunc);
  out << header << "\n";
  for (const auto& l : keep) out << l << "\n";
  if (!out) throw dtrain::IoError("insitu: rank 0: cannot write " + path);
}

// The held-out error against the step is drawn outside the ranks, by scripts/plot-metrics.
void print_plot_command(const std::string& run_dir) {
  std::printf("plot: scripts/plot-metrics --log %s/metrics.csv %s/error.png heldout_rel_error\n",
              run_dir.c_str(), run_dir.c_str());
}

int run(const Config& cfg) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const Grid g = make_grid(cfg, world_rank, world_size);
  const bool root = world_rank == 0;

  // dtrain's side: its own duplicate of MPI_COMM_WORLD, a progress thread for non-blocking
  // collectives (MPI_THREAD_MULTIPLE).
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  dtrain::Communicator comm(transport);
  dtrain::detail::RankScope scope(comm.rank());

  // Known property 1, on this decomposition: exact decay of a Fourier mode.
  const double decay_err = check_fourier_decay(g, cfg.r, 50);
  const bool decay_ok = decay_err < 1e-12;
  if (root)
    std::printf(
        "solver check: Fourier mode after 50 steps, max error %.2e against the exact "
        "discrete decay (%s)\n",
        decay_err, decay_ok ? "ok" : "FAILED");

  const Sampler make{g, cfg.patch / 2, cfg.r, cfg.horizon};
  const std::size_t nf = make.features();

  // Per-rank sample store of regression pairs: the scaled patch (input) and the centre's scaled
  // change (target).
  dtrain::InMemoryDataset store(dtrain::Shape{static_cast<std::int64_t>(nf)}, dtrain::Shape{1},
                                cfg.capacity);
  dtrain::SamplerOptions sopt;
  sopt.drop_last = true;
  // World size 1: each rank draws batches from its own store; all stores have the same size.
  dtrain::DistributedSampler sampler(0, 0, 1, cfg.seed, sopt);

  dtrain::Sequential model{dtrain::Linear(static_cast<std::int64_t>(nf), cfg.hidden),
                           dtrain::Tanh(), dtrain::Linear(cfg.hidden, cfg.hidden), dtrain::Tanh(),
                           dtrain::Linear(cfg.hidden, 1)};
  model.init(cfg.seed);
  // The run's length is known, so the learning rate decays over its optimizer steps (warm-up,
  // then cosine): the late, small steps remove most of the noise the early large ones leave.
  const std::int64_t total_opt =
      cfg.train_every > 0 ? std::max<std::int64_t>(2, cfg.steps / cfg.train_every * cfg.opt_steps)
                          : 2;
  dtrain::AdamW opt(
      model, dtrain::Schedule::warmup_cosine(cfg.lr, std::min<std::int64_t>(50, total_opt / 10 + 1),
                                             total_opt, cfg.lr * 0.01));
  // A fixed algorithm keeps the reduction order, hence the bits, the same in a resumed run.
  dtrain::GradientSync sync(comm, model.gradients(), 256 << 10, dtrain::AllreduceAlgorithm::ring);

  SimState sim;
  sim.height = g.rows + 2 * g.halo;
  sim.width = g.nx;
  sim.u.assign(g.cells(), 0.0);
  sim.features = static_cast<std::int64_t>(nf);
  sim.pending_rows = static_cast<std::int64_t>(cfg.samples + cfg.validation);
  sim.pending_x.assign(cfg.samples * nf + cfg.validation * nf, 0.0f);
  sim.pending_meta.assign((cfg.samples + cfg.validation) * 3, 0.0);
  initial_field(g, cfg.seed, sim.u);
  sim.initial_total = g.total(sim.u);

  dtrain::CheckpointOptions copt;
  copt.every_steps = cfg.ckpt_every;
  copt.keep_last = 2;
  copt.config = "insitu heat nx=" + std::to_string(cfg.nx) + " ny=" + std::to_string(cfg.ny) +
                " patch=" + std::to_string(cfg.patch) + " hidden=" + std::to_string(cfg.hidden);
  dtrain::Checkpointer ckpt(comm, cfg.run_dir, copt);
  auto save = [&](std::int64_t step) {
    sim.store_count = static_cast<std::int64_t>(store.size());
    ckpt.save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
              dtrain::named("sampler", sampler), dtrain::per_rank("store", store),
              dtrain::per_rank("sim", sim));
  };
  // Restore in two reads of the same file: the simulation state first, which says how many
  // samples the store held, so that the fresh store can be grown to that size before its
  // contents (and the sampler over them) are read.
  bool resumed = false;
  if (ckpt.restore_latest(dtrain::per_rank("sim", sim))) {
    const std::vector<float> zero_x(nf, 0.0f), zero_y(1, 0.0f);
    for (std::int64_t k = 0; k < sim.store_count; ++k)
      store.append_pair(dtrain::span<const float>(zero_x), dtrain::span<const float>(zero_y));
    sampler.set_num_samples(static_cast<std::size_t>(sim.store_count));
    ckpt.restore_latest(dtrain::named("model", model), dtrain::named("optimizer", opt),
                        dtrain::named("sampler", sampler), dtrain::per_rank("store", store),
                        dtrain::per_rank("sim", sim));
    resumed = true;
    if (root)
      std::printf("resumed at step %lld from %s (%lld samples per rank, %lld optimizer steps)\n",
                  static_cast<long long>(sim.step), cfg.run_dir.c_str(),
                  static_cast<long long>(sim.store_count), static_cast<long long>(sim.trained));
  }
  const std::string csv = cfg.run_dir + "/metrics.csv";
  if (root) open_metrics(csv, sim.step, resumed);

  // Held-out validation points of this rank, fixed by (seed, rank).
  std::vector<std::pair<int, int>> val_points;
  {
    dtrain::RngStream rng(cfg.seed, 0xa11d0000ull + static_cast<std::uint64_t>(world_rank));
    while (val_points.size() < cfg.validation) {
      const int i = static_cast<int>(rng.below(static_cast<std::uint64_t>(g.rows)));
      const int j = static_cast<int>(rng.below(static_cast<std::uint64_t>(g.nx)));
      if (held_out(g.row0 + i, j)) val_points.emplace_back(i, j);
    }
  }
  std::vector<float> xval(val_points.size() * nf), yval(val_points.size());
  std::vector<float> fresh_y(cfg.samples);
  std::vector<float> xb(cfg.batch * nf), yb(cfg.batch);
  std::vector<double> tmp(g.cells(), 0.0);

  // Relative RMS error of the surrogate on this rank's held-out points, summed over ranks.
  auto evaluate = [&]() {
    dtrain::PassOptions eval;
    eval.training = false;
    const float* out = model.forward(xval.data(), static_cast<std::int64_t>(yval.size()), eval);
    double acc[2] = {0, 0};
    for (std::size_t k = 0; k < yval.size(); ++k) {
      const double d = static_cast<double>(out[k]) - yval[k];
      acc[0] += d * d;
      acc[1] += static_cast<double>(yval[k]) * yval[k];
    }
    comm.allreduce(dtrain::BufferView(acc, 2, dtrain::DType::f64), dtrain::ReduceOp::sum);
    return acc[1] > 0 ? std::sqrt(acc[0] / acc[1]) : 0.0;
  };

  // At a sampling step: the patches of random non-held-out points (and, every --eval-every
  // steps, of the held-out points), kept until their targets exist `horizon` steps later.
  auto take_samples = [&]() {
    dtrain::RngStream rng(cfg.seed ^ 0x5a3d1e5ull, static_cast<std::uint64_t>(sim.step) * 4096u +
                                                       static_cast<std::uint64_t>(world_rank));
    auto keep = [&](std::size_t row, int i, int j) {
      const double scale = make.patch(sim.u, i, j, &sim.pending_x[row * nf]);
      const std::size_t c = g.at(i, j);
      sim.pending_meta[row * 3] = sim.u[c];
      sim.pending_meta[row * 3 + 1] = scale;
      sim.pending_meta[row * 3 + 2] = static_cast<double>(c);
    };
    for (std::size_t k = 0; k < cfg.samples;) {
      const int i = static_cast<int>(rng.below(static_cast<std::uint64_t>(g.rows)));
      const int j = static_cast<int>(rng.below(static_cast<std::uint64_t>(g.nx)));
      if (!held_out(g.row0 + i, j)) keep(k++, i, j);
    }
    if (sim.step % cfg.eval_every == 0)
      for (std::size_t k = 0; k < val_points.size(); ++k)
        keep(cfg.samples + k, val_points[k].first, val_points[k].second);
    sim.snap_step = sim.step;
  };
  auto target_of = [&](std::size_t row) {
    const double* m = &sim.pending_meta[row * 3];
    return make.target(m[0], sim.u[static_cast<std::size_t>(m[2])], m[1]);
  };

  // `horizon` steps later: the training samples go to the store; returns the held-out error when
  // the held-out points were sampled too, -1 otherwise.
  auto harvest = [&]() {
    for (std::size_t k = 0; k < cfg.samples; ++k) fresh_y[k] = target_of(k);
    store.append_pairs(dtrain::span<const float>(sim.pending_x.data(), cfg.samples * nf),
                       dtrain::span<const float>(fresh_y));
    if (sampler.num_samples() != store.size()) sampler.set_num_samples(store.size());
    const bool due = sim.snap_step % cfg.eval_every == 0;
    sim.snap_step = -1;
    if (!due) return -1.0;
    std::copy_n(&sim.pending_x[cfg.samples * nf], xval.size(), xval.begin());
    for (std::size_t k = 0; k < yval.size(); ++k) yval[k] = target_of(cfg.samples + k);
    return evaluate();
  };

  // One optimizer step's forward and backward on a batch from the rank's store; the gradient
  // buckets start their all-reduce on the progress thread as backward produces them.
  double last_loss = 0;
  auto forward_backward = [&]() {
    if (sampler.batch_rows_at(sampler.position(), cfg.batch) == 0)
      sampler.set_epoch(sampler.epoch() + 1);
    const auto idx = sampler.next_indices(cfg.batch);
    sampler.advance(cfg.batch);
    store.read_pairs(dtrain::span<const std::int64_t>(idx), dtrain::span<float>(xb),
                     dtrain::span<float>(yb));
    model.zero_grad();
    dtrain::PassOptions pass;
    pass.step = sim.trained;
    last_loss = model.forward_backward(xb.data(), yb.data(), static_cast<std::int64_t>(cfg.batch),
                                       dtrain::Loss::mse, sync, pass);
  };
  auto finish_step = [&]() {
    sync.wait();
    opt.step();
    ++sim.trained;
  };

  if (root)
    std::printf(
        "dtrain %s: %d ranks, %dx%d grid (%d rows per rank), r=%.3f; surrogate %zu->%lld->%lld->1 "
        "(%zu parameters); %zu samples every %lld steps, %d optimizer step(s) of batch %zu every "
        "%lld steps\n",
        dtrain::version_string(), world_size, cfg.nx, cfg.ny, g.rows, cfg.r, nf,
        static_cast<long long>(cfg.hidden), static_cast<long long>(cfg.hidden),
        model.parameter_count(), cfg.samples, static_cast<long long>(cfg.sample_every),
        cfg.opt_steps, cfg.batch, static_cast<long long>(cfg.train_every));

  // The simulation alone, timed on a copy of the field before, during (every --baseline-every
  // steps) and after the run, so that a change of the machine's load affects both sides alike.
  double base_sum = 0, t_base = 0;
  std::int64_t base_n = 0;
  auto time_baseline = [&]() {
    if (cfg.baseline_steps <= 0) return;
    const dtrain::Timer t;
    base_sum += time_solver_alone(g, sim.u, cfg.r, cfg.baseline_steps);
    ++base_n;
    t_base += t.seconds();
  };
  time_baseline();

  double t_sim = 0, t_train = 0, t_samples = 0, t_ckpt = 0, last_error = -1;
  std::int64_t overlapped = 0, trained_here = 0, rounds = 0;
  const std::int64_t first_step = sim.step;
  const dtrain::Timer wall;
  bool pending = false;
  if (!resumed && cfg.sample_every > 0) take_samples();  // step 0 is a sampling step
  for (;;) {
    // Here the state is consistent (no gradient in flight): checkpoint, stop, or go on.
    {
      const dtrain::Timer t;
      if (sim.step > first_step && cfg.ckpt_every > 0 && sim.step % cfg.ckpt_every == 0 &&
          sim.step != cfg.steps)
        save(sim.step);
      t_ckpt += t.seconds();
    }
    if (sim.step > first_step && sim.step % cfg.baseline_every == 0 && sim.step < cfg.steps)
      time_baseline();
    if (sim.step == cfg.stop_after && sim.step < cfg.steps) {
      if (root)
        std::printf(
            "stopping at step %lld without saving (--stop-after): restart to continue "
            "from the last checkpoint\n",
            static_cast<long long>(sim.step));
      return 0;
    }
    if (sim.step >= cfg.steps) break;

    // Training: all but the last optimizer step complete here; the last one's all-reduce stays
    // in flight during the next simulation step.
    if (cfg.train_every > 0 && sim.step % cfg.train_every == 0 && store.size() >= cfg.batch) {
      const dtrain::Timer t;
      for (int k = 0; k < cfg.opt_steps; ++k) {
        forward_backward();
        ++trained_here;
        if (k + 1 < cfg.opt_steps) finish_step();
      }
      pending = true;
      ++rounds;
      t_train += t.seconds();
    }

    {
      const dtrain::Timer t;
      if (pending && sync.buckets_started() > 0 && !sync.bucket_done(sync.buckets_started() - 1))
        ++overlapped;
      g.step(sim.u, tmp, cfg.r);
      ++sim.step;
      t_sim += t.seconds();
    }
    if (pending) {
      const dtrain::Timer t;
      finish_step();
      pending = false;
      t_train += t.seconds();
    }

    const dtrain::Timer t;
    bool evaluated = false;
    if (sim.snap_step >= 0 && sim.step == sim.snap_step + cfg.horizon) {
      const double e = harvest();
      evaluated = e >= 0;
      if (evaluated) last_error = e;
      if (evaluated && sim.first_error < 0) sim.first_error = last_error;
    }
    if (cfg.sample_every > 0 && sim.step % cfg.sample_every == 0 && sim.snap_step < 0)
      take_samples();
    t_samples += t.seconds();
    if (root && evaluated) {
      const double w = wall.seconds();
      const double sps = w > 0 ? static_cast<double>(trained_here) *
                                     static_cast<double>(cfg.batch * world_size) / w
                               : 0.0;
      std::ofstream out(csv, std::ios::app);
      out << sim.step << ',' << w << ',' << t_sim << ',' << t_train << ',' << sim.trained << ','
          << sps << ',' << last_loss << ',' << last_error << '\n';
      {
        std::printf(
            "step %6lld/%lld  held-out error %.4f  loss %.3e  %6.0f samples/s  training+sampling "
            "%4.1f%% of wall\n",
            static_cast<long long>(sim.step), static_cast<long long>(cfg.steps), last_error,
            last_loss, sps, w > 0 ? 100 * (t_train + t_samples) / w : 0.0);
        std::fflush(stdout);
      }
    }
  }
  const double loop_wall = wall.seconds();
  {
    const dtrain::Timer t;
    save(sim.step);
    t_ckpt += t.seconds();
  }

  // Known property 2: the periodic scheme conserves the total heat.
  const double total = g.total(sim.u);
  const double drift = std::abs(total - sim.initial_total) / std::abs(sim.initial_total);
  const bool conserved = drift < 1e-12;

  // Roll the surrogate out: `rollout` applications of `horizon` steps each, against the solver.
  double rollout_err = 0;
  {
    std::vector<double> s = sim.u, v = sim.u, next = sim.u;
    const std::size_t chunk = 4096;
    std::vector<float> xs(chunk * nf);
    std::vector<double> scales(chunk);
    std::vector<std::pair<int, int>> pts;
    pts.reserve(chunk);
    dtrain::PassOptions eval;
    eval.training = false;
    for (int round = 0; round < cfg.rollout; ++round) {
      g.exchange(s);
      for (int i = 0; i < g.rows; ++i)
        for (int j = 0; j < g.nx; ++j) {
          pts.emplace_back(i, j);
          if (pts.size() == chunk || (i == g.rows - 1 && j == g.nx - 1)) {
            for (std::size_t k = 0; k < pts.size(); ++k)
              scales[k] = make.patch(s, pts[k].first, pts[k].second, &xs[k * nf]);
            const float* y = model.forward(xs.data(), static_cast<std::int64_t>(pts.size()), eval);
            for (std::size_t k = 0; k < pts.size(); ++k) {
              const std::size_t c = g.at(pts[k].first, pts[k].second);
              next[c] = s[c] + make.change(y[k], scales[k]);
            }
            pts.clear();
          }
        }
      std::copy(next.begin() + g.at(0, 0), next.begin() + g.at(g.rows, 0), s.begin() + g.at(0, 0));
      for (std::int64_t h = 0; h < cfg.horizon; ++h) g.step(v, tmp, cfg.r);
    }
    double acc[2] = {0, 0}, sum[2] = {0, 0};
    for (int i = 0; i < g.rows; ++i)
      for (int j = 0; j < g.nx; ++j) {
        const std::size_t c = g.at(i, j);
        acc[0] += (s[c] - v[c]) * (s[c] - v[c]);
        acc[1] += (v[c] - sim.u[c]) * (v[c] - sim.u[c]);
      }
    CHECK_MPI(MPI_Allreduce(acc, sum, 2, MPI_DOUBLE, MPI_SUM, g.comm));
    rollout_err = sum[1] > 0 ? std::sqrt(sum[0] / sum[1]) : 0.0;
  }

  // Replicas and the final state's fingerprint (field gathered in rank order, parameters).
  const auto params = model.parameters().template as<float>();
  const std::uint64_t ph = fnv1a(params.data(), params.size() * sizeof(float));
  std::int64_t lo = static_cast<std::int64_t>(ph >> 1), hi = lo;
  comm.allreduce(dtrain::BufferView(&lo, 1, dtrain::DType::i64), dtrain::ReduceOp::min);
  comm.allreduce(dtrain::BufferView(&hi, 1, dtrain::DType::i64), dtrain::ReduceOp::max);
  const bool replicas_same = lo == hi;
  std::uint64_t fh =
      fnv1a(&sim.u[g.at(0, 0)], static_cast<std::size_t>(g.rows) * g.nx * sizeof(double));
  std::vector<std::uint64_t> all_fh(static_cast<std::size_t>(world_size));
  CHECK_MPI(MPI_Gather(&fh, 1, MPI_UINT64_T, all_fh.data(), 1, MPI_UINT64_T, 0, g.comm));

  // The cost of training: the simulation alone (before and after, on a copy of the field)
  // against the in-situ loop's wall time per step without checkpoint writes.
  time_baseline();
  const std::int64_t ran = sim.step - first_step;
  double per_step[4] = {ran > 0 ? (loop_wall - t_ckpt - t_base) / static_cast<double>(ran) : 0,
                        ran > 0 ? t_sim / static_cast<double>(ran) : 0,
                        loop_wall > t_base ? t_train / (loop_wall - t_base) : 0,
                        loop_wall > t_base ? t_samples / (loop_wall - t_base) : 0};
  double slowest[4] = {0, 0, 0, 0};
  CHECK_MPI(MPI_Allreduce(per_step, slowest, 4, MPI_DOUBLE, MPI_MAX, g.comm));

  // Without training (--train-every 0: the simulation alone, for comparison) there is no
  // surrogate to check.
  const bool trained = sim.trained > 0;
  const double final_error = last_error;
  const bool error_ok = !trained || (final_error >= 0 && final_error < cfg.target_error &&
                                     final_error < sim.first_error);
  const bool rollout_ok = !trained || rollout_err < cfg.rollout_target;
  if (root) {
    std::printf("total heat %.17g, relative drift %.2e (%s)\n", total, drift,
                conserved ? "conserved" : "NOT CONSERVED");
    if (!trained) {
      std::printf("no optimizer steps were taken: surrogate checks skipped\n");
    } else {
      std::printf("held-out error: first %.4f, final %.4f, bound %.3f (%s)\n", sim.first_error,
                  final_error, cfg.target_error, error_ok ? "ok" : "FAILED");
      std::printf("rollout: %d x %lld steps, error %.4f of the field's change (bound %.3f, %s)\n",
                  cfg.rollout, static_cast<long long>(cfg.horizon), rollout_err, cfg.rollout_target,
                  rollout_ok ? "ok" : "FAILED");
    }
    std::printf(
        "halo exchanges with a gradient all-reduce in flight: %lld of %lld training "
        "rounds; replicas %s\n",
        static_cast<long long>(overlapped), static_cast<long long>(rounds),
        replicas_same ? "bit-identical" : "DIFFER");
    if (base_n > 0) {
      const double base = base_sum / static_cast<double>(base_n);
      std::printf(
          "time per step: simulation alone %.1f us (mean of %lld timings of %lld steps), in-situ "
          "run %.1f us (solver part %.1f us): ratio %.3f\n",
          base * 1e6, static_cast<long long>(base_n), static_cast<long long>(cfg.baseline_steps),
          slowest[0] * 1e6, slowest[1] * 1e6, base > 0 ? slowest[0] / base : 0.0);
    }
    std::printf(
        "share of the loop's wall time (slowest rank): training %.1f%%, sampling and "
        "evaluation %.1f%%\n",
        100 * slowest[2], 100 * slowest[3]);
    std::uint64_t all = 1469598103934665603ull;
    for (auto h : all_fh) all = fnv1a(&h, sizeof h, all);
    std::printf("final state: step %lld field %016llx parameters %016llx\n",
                static_cast<long long>(sim.step), static_cast<unsigned long long>(all),
                static_cast<unsigned long long>(ph));
    print_plot_command(cfg.run_dir);
  }
  return decay_ok && conserved && error_ok && rollout_ok && replicas_same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Config c;
  CLI::App app{
      "In-situ training: a 2D heat-diffusion MPI solver trains an MLP surrogate of its "
      "own time step while it runs (dtrain example 20)"};
  // An option given twice takes its last value, so a script can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--nx", c.nx, "grid columns")
      ->check(CLI::Range(8, 1 << 16))
      ->capture_default_str();
  app.add_option("--ny", c.ny, "grid rows (split over the ranks)")
      ->check(CLI::Range(8, 1 << 16))
      ->capture_default_str();
  app.add_option("--r", c.r, "diffusion number D dt / dx^2 (stable up to 0.25)")
      ->check(CLI::Range(1e-6, 0.25))
      ->capture_default_str();
  app.add_option("--steps", c.steps, "simulation steps in total")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the initial field, samples and model")
      ->capture_default_str();
  app.add_option("--run-dir", c.run_dir,
                 "checkpoints and metrics.csv go here (scripts/plot-metrics draws error.png)")
      ->capture_default_str();
  app.add_option("--ckpt-every", c.ckpt_every, "checkpoint every N steps (0: only at the end)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--stop-after", c.stop_after,
                 "stop at this step without saving, as a killed job would (-1: never)")
      ->check(CLI::Range(std::int64_t{-1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--sample-every", c.sample_every, "take samples every N steps (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--horizon", c.horizon, "the surrogate predicts this many steps ahead")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--patch", c.patch, "side of the input neighbourhood (odd)")
      ->check(CLI::Range(3, 15))
      ->capture_default_str();
  app.add_option("--samples", c.samples, "samples each rank takes per sampling step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--capacity", c.capacity, "samples each rank keeps (oldest replaced first)")
      ->check(CLI::Range(1, 1 << 26))
      ->capture_default_str();
  app.add_option("--train-every", c.train_every, "train every N steps (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--opt-steps", c.opt_steps, "optimizer steps per training round")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--batch", c.batch, "batch per rank")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--hidden", c.hidden, "width of the two hidden layers")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--lr", c.lr, "AdamW learning rate")
      ->check(CLI::Range(1e-8, 1.0))
      ->capture_default_str();
  app.add_option("--validation", c.validation, "held-out points per rank")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--eval-every", c.eval_every,
                 "held-out error and progress line every N steps (a multiple of --sample-every)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rollout", c.rollout,
                 "surrogate applications compared with the solver at the end")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--target-error", c.target_error, "held-out error the surrogate must reach")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rollout-target", c.rollout_target, "rollout error bound")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--baseline-every", c.baseline_every,
                 "also time the simulation alone every N steps of the run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--baseline-steps", c.baseline_steps,
                 "steps of the simulation alone (on a copy of the field) per timing: before, "
                 "during and after the run (0: skip)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  int code = 0;
  try {
    app.parse(argc, argv);
    if (c.patch % 2 == 0) throw CLI::ValidationError("--patch", "must be odd");
    if (c.ny / size < std::max(1, c.patch / 2))
      throw CLI::ValidationError("--ny", "every rank needs at least patch/2 rows");
    if (c.sample_every > 0 && c.horizon > c.sample_every)
      throw CLI::ValidationError("--horizon", "must not exceed --sample-every");
    if (c.capacity < c.batch) throw CLI::ValidationError("--capacity", "must hold a batch");
    if (c.sample_every > 0 && c.eval_every % c.sample_every != 0)
      throw CLI::ValidationError("--eval-every", "must be a multiple of --sample-every");
  } catch (const CLI::ParseError& e) {
    std::ostringstream quiet;
    code = rank == 0 ? app.exit(e) : app.exit(e, quiet, quiet);
    MPI_Finalize();
    return code;
  }
  try {
    code = run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  dtrain::finalize_mpi();  // skipped if this rank failed: MPI_Finalize would wait for peers
  return code;
}
