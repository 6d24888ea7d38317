// Example 20: in-situ training of a convolutional surrogate. A 2D heat-diffusion solver decomposed
// over MPI ranks trains a small CNN to predict its field `--horizon` steps ahead while it runs, and
// an MLP of point neighbourhoods beside it at the same budget; nothing is written but checkpoints.
//
// The simulation is an ordinary MPI code: an explicit five-point stencil on a periodic nx x ny
// grid, rows split over the ranks, halo rows exchanged with its own MPI_Sendrecv on
// MPI_COMM_WORLD (dtrain's MpiTransport works on a duplicate, so the two never match each other's
// messages; the halo receive takes any tag and fails on a foreign one).
//
// Samples are per-rank tiles: every --sample-every steps each rank keeps its slab plus `halo` ghost
// rows either side (one channel); --horizon steps later the tile's change becomes the target and
// the pair goes to the rank's own InMemoryDataset. Samples never leave their rank, and a fully
// convolutional model trained on tiles applies to the whole field, tile by tile, with the same
// halo exchange. The convolutions pad periodically: that is right along x (the domain wraps) and
// harmless along y, because the halo is as wide as the model's receptive field (4 cells) and the
// loss covers only the rank's own rows. Each tile is shifted by its mean and divided by its RMS
// deviation: the heat step is linear and ignores constants, so the scaled map is the same operator
// and the model sees inputs of order one while the field smooths out.
//
// Why heat: its discrete solution is known exactly (the solver checks itself against it) and over
// `horizon` steps a cell depends on every cell within `horizon` of it, a wider stencil than the
// MLP's 5 x 5 neighbourhood: a few stacked 3 x 3 convolutions cover it with a few hundred shared
// weights, and every cell of a tile is a training target.
//
// Budget of the comparison: the same optimizer steps (AdamW, same schedule, same all-reduce) on
// the same tiles; the MLP's batch is --points neighbourhoods of each tile (0: every cell of the
// rank's rows, the data the CNN sees). Training seconds of each are printed.
//
// Mode: the same ranks alternate simulation and training; the last optimizer step's gradient
// all-reduce runs on dtrain's progress thread while the next simulation step goes on. One
// checkpoint holds field, samples, both models and optimizers and the sampler, so a run stopped
// at any step (--stop-after K exits without saving, like a killed job) and restarted continues
// bit for bit. Self-checks (exit 1 on failure): exact Fourier-mode decay, heat conservation, the
// CNN's error on fresh snapshots falls, its rollout beats the MLP's and --rollout-target, replicas
// bit-identical on every rank.
//
//   mpiexec.mpich -n 2 insitu_surrogate [--steps 240] [--run-dir insitu_run] [--help]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>

#include "common/cli_mpi.hpp"
#include "common/mpi_main.hpp"

namespace {

struct Config {
  int nx = 64, ny = 64, channels = 8, patch = 5, points = 0, rollout = 8;
  std::int64_t hidden = 32;
  std::int64_t steps = 240, horizon = 4, sample_every = 4, train_every = 4, opt_steps = 2;
  std::int64_t batch = 2, capacity = 64, ckpt_every = 100, stop_after = -1, print_every = 100;
  double r = 0.2, lr = 3e-3, rollout_target = 0.3;
  std::uint64_t seed = 1;
  std::string run_dir = "insitu_run";
};
constexpr int kReach = 4;  // receptive field of the CNN below: four 3 x 3 convolutions

double sum_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x;
}

// Rows [row0, row0 + rows) of the periodic grid, with `halo` ghost rows on each side.
struct Grid {
  int nx = 0, ny = 0, rows = 0, row0 = 0, halo = 0, rank = 0, size = 1;
  std::size_t cells() const { return static_cast<std::size_t>(rows + 2 * halo) * nx; }
  std::size_t at(int i, int j) const { return static_cast<std::size_t>(i + halo) * nx + j; }
  void exchange(std::vector<double>& u) const {
    const int n = halo * nx, up = (rank + size - 1) % size, down = (rank + 1) % size;
    auto one = [&](std::size_t send, int to, int tag, std::size_t recv, int from) {
      MPI_Status st;
      int count = 0;
      const int rc = MPI_Sendrecv(&u[send], n, MPI_DOUBLE, to, tag, &u[recv], n, MPI_DOUBLE, from,
                                  MPI_ANY_TAG, MPI_COMM_WORLD, &st);
      MPI_Get_count(&st, MPI_DOUBLE, &count);
      if (rc != MPI_SUCCESS || st.MPI_TAG != tag || count != n)
        throw std::runtime_error("insitu: rank " + std::to_string(rank) +
                                 ": halo exchange received tag " + std::to_string(st.MPI_TAG) +
                                 " with " + std::to_string(count) + " values");
    };
    one(at(0, 0), up, 1, at(rows, 0), down);
    one(at(rows - halo, 0), down, 2, at(-halo, 0), up);
  }
  // One explicit step of u_t = D (u_xx + u_yy), then the halo exchange: ghost rows stay current.
  void step(std::vector<double>& u, std::vector<double>& tmp, double r) const {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < nx; ++j) {
        const double c = u[at(i, j)], w = u[at(i, j ? j - 1 : nx - 1)];
        const double e = u[at(i, j + 1 < nx ? j + 1 : 0)];
        tmp[at(i, j)] = c + r * (u[at(i - 1, j)] + u[at(i + 1, j)] + w + e - 4 * c);
      }
    std::copy(tmp.begin() + at(0, 0), tmp.begin() + at(rows, 0), u.begin() + at(0, 0));
    exchange(u);
  }
  double total(const std::vector<double>& u) const {
    double s = 0;
    for (std::size_t k = at(0, 0); k < at(rows, 0); ++k) s += u[k];
    return sum_ranks(s);
  }
};

// Solver check: a product of cosines decays by exactly 1 + r (2 cos a + 2 cos b - 4) per step.
double fourier_decay_error(const Grid& g, double r, int steps) {
  const double pi = 3.14159265358979323846, a = 2 * pi * 3 / g.nx, b = 2 * pi * 2 / g.ny;
  std::vector<double> u(g.cells()), tmp(g.cells());
  auto mode = [&](int i, int j) { return std::cos(a * j) * std::cos(b * (g.row0 + i)); };
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j) u[g.at(i, j)] = 1 + 0.5 * mode(i, j);
  g.exchange(u);
  for (int s = 0; s < steps; ++s) g.step(u, tmp, r);
  const double amp = 0.5 * std::pow(1 + r * (2 * std::cos(a) + 2 * std::cos(b) - 4), steps);
  double err = 0;
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j)
      err = std::max(err, std::abs(u[g.at(i, j)] - 1 - amp * mode(i, j)));
  MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return err;
}

// Warm and cold Gaussian blobs (2 to 6 cells wide, one per 16 x 16 cells) placed by the seed.
void initial_field(const Grid& g, std::uint64_t seed, std::vector<double>& u) {
  dtrain::RngStream rng(seed, 0x1b10b5);
  std::fill(u.begin(), u.end(), 1.0);
  auto dist = [](double p, double q, int n) {
    return std::min(std::abs(p - q), n - std::abs(p - q));
  };
  for (int k = 0; k < std::max(8, g.nx * g.ny / 256); ++k) {
    const double x = rng.uniform_double() * g.nx, y = rng.uniform_double() * g.ny;
    const double amp = 2 * rng.uniform_double() - 1, s = 2 + 4 * rng.uniform_double();
    for (int i = 0; i < g.rows; ++i)
      for (int j = 0; j < g.nx; ++j) {
        const double dx = dist(j, x, g.nx), dy = dist(g.row0 + i, y, g.ny);
        if (dy < 5 * s) u[g.at(i, j)] += amp * std::exp(-(dx * dx + dy * dy) / (2 * s * s));
      }
  }
  g.exchange(u);
}

// The simulation's checkpointed state on one rank.
struct SimState {
  std::int64_t step = 0, snap_step = -1, trained = 0, tiles = 0, height = 0, width = 0;
  double initial_total = 0, first_error = -1;
  std::vector<double> u, snap;  // the field and the snapshot waiting for its target (with halos)
  template <class V>
  void visit_state(V& v) {
    v.scalar("step", step);
    v.scalar("snap_step", snap_step);
    v.scalar("trained", trained);
    v.scalar("tiles", tiles);  // read first on restore: the store grows to this size
    v.scalar("initial_total", initial_total);
    v.scalar("first_error", first_error);
    v.tensor("u", dtrain::BufferView(u.data(), u.size(), dtrain::DType::f64),
             dtrain::Shape{height, width});
    v.tensor("snap", dtrain::BufferView(snap.data(), snap.size(), dtrain::DType::f64),
             dtrain::Shape{height, width});
  }
};

// A tile as the CNN sees it: (u - mean) / rms over the whole tile; returns the rms.
double scale_tile(const std::vector<double>& u, float* x) {
  double m = 0, ss = 0;
  for (double v : u) m += v;
  m /= static_cast<double>(u.size());
  for (double v : u) ss += (v - m) * (v - m);
  const double s = std::max(std::sqrt(ss / static_cast<double>(u.size())), 1e-30);
  for (std::size_t k = 0; k < u.size(); ++k) x[k] = static_cast<float>((u[k] - m) / s);
  return s;
}

// The MLP's input: the patch x patch neighbourhood of cell (i, j) of a scaled tile, minus its
// centre.
void neighbourhood(const Grid& g, int patch, const float* x, int i, int j, float* p) {
  for (int di = -patch / 2; di <= patch / 2; ++di)
    for (int dj = -patch / 2; dj <= patch / 2; ++dj)
      *p++ = x[g.at(i + di, (j + dj + g.nx) % g.nx)] - x[g.at(i, j)];
}

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < bytes; ++i)
    h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return h;
}

int run(const Config& cfg) {
  Grid g;
  MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g.size);
  g.nx = cfg.nx, g.ny = cfg.ny, g.halo = std::max(kReach, cfg.patch / 2);
  g.row0 = static_cast<int>(std::int64_t{cfg.ny} * g.rank / g.size);
  g.rows = static_cast<int>(std::int64_t{cfg.ny} * (g.rank + 1) / g.size) - g.row0;
  const bool root = g.rank == 0;
  if (g.rows < g.halo || cfg.patch % 2 == 0 || cfg.horizon > cfg.sample_every ||
      cfg.capacity < cfg.batch) {
    if (root)
      std::fprintf(stderr,
                   "insitu: need rows per rank >= %d, an odd --patch, --horizon <= --sample-every, "
                   "--capacity >= --batch\n",
                   g.halo);
    return 2;
  }
  dtrain::MpiTransport transport(MPI_COMM_WORLD);  // dtrain's own duplicate of the communicator
  dtrain::Communicator comm(transport);

  const double decay_err = fourier_decay_error(g, cfg.r, 50);
  if (root)
    std::printf(
        "solver check: Fourier mode after 50 steps, max error %.2e against the exact discrete "
        "decay (%s)\n",
        decay_err, decay_err < 1e-12 ? "ok" : "FAILED");

  // The two surrogates, each with its optimizer and gradient all-reduce (a named algorithm fixes
  // the reduction order, so a resumed run reproduces the bits).
  const std::int64_t C = cfg.channels, T = g.rows + 2 * g.halo, nf = cfg.patch * cfg.patch;
  // Lift to C channels, a pre-activation residual block, project back: the lift and the
  // projection alone are a linear 5 x 5 stencil, the block adds what is not linear.
  dtrain::Sequential cnn{dtrain::Input{1, T, cfg.nx}, dtrain::Conv2d(1, C, 3).periodic(1),
                         dtrain::Residual{dtrain::Relu(), dtrain::Conv2d(C, C, 3).periodic(1),
                                          dtrain::Relu(), dtrain::Conv2d(C, C, 3).periodic(1)},
                         dtrain::Conv2d(C, 1, 3).periodic(1)};
  dtrain::Sequential mlp{dtrain::Linear(nf, cfg.hidden), dtrain::Tanh(),
                         dtrain::Linear(cfg.hidden, cfg.hidden), dtrain::Tanh(),
                         dtrain::Linear(cfg.hidden, 1)};
  cnn.init(cfg.seed);
  // The targets are small (the change over a few steps): the projection starts near zero.
  const auto& info = cnn.parameter_info();
  for (std::size_t k = info[info.size() - 2].offset; k < cnn.parameter_count(); ++k)
    cnn.parameter_span()[k] *= 0.01f;
  mlp.init(cfg.seed);
  const std::int64_t total =
      std::max<std::int64_t>(2, cfg.train_every ? cfg.steps / cfg.train_every * cfg.opt_steps : 2);
  auto schedule = dtrain::Schedule::warmup_cosine(
      cfg.lr, std::min<std::int64_t>(50, total / 10 + 1), total, cfg.lr * 0.01);
  dtrain::AdamW cnn_opt(cnn, schedule), mlp_opt(mlp, schedule);
  dtrain::GradientSync cnn_sync(comm, cnn.gradients(), 256 << 10, dtrain::AllreduceAlgorithm::ring);
  dtrain::GradientSync mlp_sync(comm, mlp.gradients(), 256 << 10, dtrain::AllreduceAlgorithm::ring);

  // This rank's tiles: scaled field -> its scaled change per unit of r * horizon.
  const std::size_t tile = g.cells(), own = static_cast<std::size_t>(g.rows) * g.nx;
  dtrain::InMemoryDataset store(dtrain::Shape{1, T, cfg.nx}, dtrain::Shape{1, T, cfg.nx},
                                static_cast<std::size_t>(cfg.capacity));
  dtrain::SamplerOptions sopt;
  sopt.drop_last = true;
  dtrain::DistributedSampler sampler(0, 0, 1, cfg.seed, sopt);  // world size 1: this rank's store

  SimState sim;
  sim.height = T, sim.width = cfg.nx;
  sim.u.assign(tile, 0.0);
  sim.snap.assign(tile, 0.0);
  initial_field(g, cfg.seed, sim.u);
  sim.initial_total = g.total(sim.u);
  dtrain::CheckpointOptions copt;
  copt.every_steps = cfg.ckpt_every;
  copt.keep_last = 2;
  dtrain::Checkpointer ckpt(comm, cfg.run_dir, copt);
  auto save = [&] {
    sim.tiles = static_cast<std::int64_t>(store.size());
    ckpt.save(sim.step, dtrain::named("cnn", cnn), dtrain::named("cnn_optimizer", cnn_opt),
              dtrain::named("mlp", mlp), dtrain::named("mlp_optimizer", mlp_opt),
              dtrain::named("sampler", sampler), dtrain::per_rank("store", store),
              dtrain::per_rank("sim", sim));
  };
  // The simulation state first: it says how many tiles the store and the sampler must hold.
  const bool resumed = static_cast<bool>(ckpt.restore_latest(dtrain::per_rank("sim", sim)));
  if (resumed) {
    const std::vector<float> zero(tile, 0.0f);
    for (std::int64_t k = 0; k < sim.tiles; ++k)
      store.append_pair(dtrain::span<const float>(zero), dtrain::span<const float>(zero));
    sampler.set_num_samples(store.size());
    ckpt.restore_latest(dtrain::named("cnn", cnn), dtrain::named("cnn_optimizer", cnn_opt),
                        dtrain::named("mlp", mlp), dtrain::named("mlp_optimizer", mlp_opt),
                        dtrain::named("sampler", sampler), dtrain::per_rank("store", store),
                        dtrain::per_rank("sim", sim));
    if (root)
      std::printf("resumed at step %lld from %s (%zu tiles per rank, %lld optimizer steps)\n",
                  static_cast<long long>(sim.step), cfg.run_dir.c_str(), store.size(),
                  static_cast<long long>(sim.trained));
  }
  if (root)
    std::printf(
        "dtrain %s: %d ranks, %dx%d grid, tiles %lldx%d; CNN %zu parameters, MLP %lld->%d->%d->1 "
        "%zu parameters, %lld tile(s) per step\n",
        dtrain::version_string(), g.size, cfg.nx, cfg.ny, static_cast<long long>(T), cfg.nx,
        cnn.parameter_count(), static_cast<long long>(nf), cfg.hidden, cfg.hidden,
        mlp.parameter_count(), static_cast<long long>(cfg.batch));

  const std::size_t points = cfg.points > 0 ? static_cast<std::size_t>(cfg.points) : own;
  const std::size_t B = static_cast<std::size_t>(cfg.batch);
  std::vector<float> xb(B * tile), yb(B * tile), dy(B * tile), xt(tile), yt(tile), pred(own);
  std::vector<float> xm(std::max(B * points, own) * nf), ym(B * points);
  std::vector<double> tmp(tile);
  dtrain::PassOptions eval;
  eval.training = false;
  // Predictions of either model for the rank's own rows of a scaled tile.
  auto predict = [&](bool use_cnn, const float* x) {
    if (use_cnn) {
      const float* o = cnn.forward(x, 1, eval);
      std::copy(o + g.at(0, 0), o + g.at(g.rows, 0), pred.begin());
      return;
    }
    for (int i = 0; i < g.rows; ++i)
      for (int j = 0; j < g.nx; ++j) neighbourhood(g, cfg.patch, x, i, j, &xm[(i * g.nx + j) * nf]);
    const float* o = mlp.forward(xm.data(), static_cast<std::int64_t>(own), eval);
    std::copy(o, o + own, pred.begin());
  };

  // One optimizer step of each model on the same tiles. The MLP's all-reduce completes here; the
  // CNN's runs on while the caller goes on (finish() waits for it and applies the update).
  double t_cnn = 0, t_mlp = 0, last_loss = 0;
  auto train_step = [&] {
    if (sampler.batch_rows_at(sampler.position(), B) == 0) sampler.set_epoch(sampler.epoch() + 1);
    const auto idx = sampler.next_indices(B);
    sampler.advance(B);
    store.read_pairs(dtrain::span<const std::int64_t>(idx), dtrain::span<float>(xb),
                     dtrain::span<float>(yb));
    dtrain::Timer t;
    dtrain::RngStream rng(cfg.seed ^ 0x3c7a11ull,
                          static_cast<std::uint64_t>(sim.trained) * 4096u + g.rank);
    for (std::size_t b = 0, n = 0; b < B; ++b)
      for (std::size_t k = 0; k < points; ++k, ++n) {
        const std::size_t c = cfg.points > 0 ? rng.below(own) : k;
        const int i = static_cast<int>(c) / g.nx, j = static_cast<int>(c) % g.nx;
        neighbourhood(g, cfg.patch, &xb[b * tile], i, j, &xm[n * nf]);
        ym[n] = yb[b * tile + g.at(i, j)];
      }
    dtrain::PassOptions pass;
    pass.step = sim.trained;
    mlp.zero_grad();
    mlp.forward_backward(xm.data(), ym.data(), static_cast<std::int64_t>(B * points),
                         dtrain::Loss::mse, mlp_sync, pass);
    mlp_sync.wait();
    mlp_opt.step();
    t_mlp += t.seconds();
    dtrain::Timer tc;
    // The CNN's loss: mean squared error over the rank's own rows (the halo rows only feed them).
    cnn.zero_grad();
    const float* out = cnn.forward(xb.data(), static_cast<std::int64_t>(B), pass);
    last_loss = 0;
    for (std::size_t k = 0; k < B * tile; ++k) {
      const bool mine = k % tile >= g.at(0, 0) && k % tile < g.at(g.rows, 0);
      const float d = mine ? out[k] - yb[k] : 0.0f;
      dy[k] = 2 * d / static_cast<float>(B * own);
      last_loss += static_cast<double>(d) * d / static_cast<double>(B * own);
    }
    cnn.backward(dy.data(), cnn_sync);
    t_cnn += tc.seconds();
  };
  auto finish = [&] {
    dtrain::Timer t;
    cnn_sync.wait();
    cnn_opt.step();
    ++sim.trained;
    t_cnn += t.seconds();
  };

  // `horizon` steps after a snapshot: both models' relative error on the new tile (never trained
  // on), then the tile joins the store.
  double cnn_error = -1, mlp_error = -1;
  auto harvest = [&] {
    const double s = scale_tile(sim.snap, xt.data()),
                 per = s * cfg.r * static_cast<double>(cfg.horizon);
    for (std::size_t k = 0; k < tile; ++k)
      yt[k] = static_cast<float>((sim.u[k] - sim.snap[k]) / per);
    double acc[3] = {0, 0, 0};
    for (int m = 0; m < 2; ++m) {
      predict(m == 0, xt.data());
      for (std::size_t k = 0; k < own; ++k) {
        const double y = yt[g.at(0, 0) + k];
        acc[m] += (pred[k] - y) * (pred[k] - y);
        if (m == 0) acc[2] += y * y;
      }
    }
    comm.allreduce(dtrain::BufferView(acc, 3, dtrain::DType::f64), dtrain::ReduceOp::sum);
    cnn_error = std::sqrt(acc[0] / acc[2]), mlp_error = std::sqrt(acc[1] / acc[2]);
    if (sim.trained > 0 && sim.first_error < 0) sim.first_error = cnn_error;
    store.append_pair(dtrain::span<const float>(xt), dtrain::span<const float>(yt));
    if (sampler.num_samples() != store.size()) sampler.set_num_samples(store.size());
    sim.snap_step = -1;
  };

  const std::int64_t first_step = sim.step;
  std::int64_t overlapped = 0, rounds = 0;
  auto snapshot = [&] {
    sim.snap = sim.u;
    sim.snap_step = sim.step;
  };
  if (!resumed && cfg.sample_every > 0) snapshot();
  for (;;) {
    if (sim.step > first_step && cfg.ckpt_every > 0 && sim.step % cfg.ckpt_every == 0 &&
        sim.step < cfg.steps)
      save();
    if (sim.step == cfg.stop_after && sim.step < cfg.steps) {
      if (root)
        std::printf(
            "stopping at step %lld without saving (--stop-after): restart to continue from the "
            "last checkpoint\n",
            static_cast<long long>(sim.step));
      return 0;
    }
    if (sim.step >= cfg.steps) break;
    const bool train = cfg.train_every > 0 && sim.step % cfg.train_every == 0 && store.size() >= B;
    for (std::int64_t k = 0; train && k < cfg.opt_steps; ++k) {
      train_step();
      if (k + 1 < cfg.opt_steps) finish();
    }
    if (train && cnn_sync.buckets_started() > 0 &&
        !cnn_sync.bucket_done(cnn_sync.buckets_started() - 1))
      ++overlapped;
    g.step(sim.u, tmp, cfg.r);  // the last all-reduce may still be in flight here
    ++sim.step;
    if (train) {
      finish();
      ++rounds;
    }
    if (sim.snap_step >= 0 && sim.step == sim.snap_step + cfg.horizon) harvest();
    if (cfg.sample_every > 0 && sim.step % cfg.sample_every == 0 && sim.snap_step < 0) snapshot();
    if (root && sim.step % cfg.print_every == 0 && cnn_error >= 0)
      std::printf("step %6lld  loss %.3e  error on the newest snapshot: CNN %.4f  MLP %.4f\n",
                  static_cast<long long>(sim.step), last_loss, cnn_error, mlp_error);
  }
  save();
  const double drift = std::abs(g.total(sim.u) - sim.initial_total) / std::abs(sim.initial_total);

  // Rollout: each surrogate applied `rollout` times (horizon steps each) to the final field, tile
  // by tile with the halo exchange, against the solver; error relative to the field's change.
  double err[3] = {0, 0, 0};
  {
    std::vector<double> v = sim.u;
    for (int n = 0; n < cfg.rollout; ++n)
      for (std::int64_t h = 0; h < cfg.horizon; ++h) g.step(v, tmp, cfg.r);
    for (int m = 0; m < 2; ++m) {
      std::vector<double> f = sim.u;
      for (int n = 0; n < cfg.rollout; ++n) {
        const double per = scale_tile(f, xt.data()) * cfg.r * static_cast<double>(cfg.horizon);
        predict(m == 0, xt.data());
        for (std::size_t k = 0; k < own; ++k) f[g.at(0, 0) + k] += pred[k] * per;
        g.exchange(f);
      }
      for (std::size_t k = g.at(0, 0); k < g.at(g.rows, 0); ++k) {
        err[m] += (f[k] - v[k]) * (f[k] - v[k]);
        if (m == 0) err[2] += (v[k] - sim.u[k]) * (v[k] - sim.u[k]);
      }
    }
    for (double& e : err) e = sum_ranks(e);
  }
  const double cnn_roll = std::sqrt(err[0] / err[2]), mlp_roll = std::sqrt(err[1] / err[2]);

  // Replicas and the final state's fingerprint (field gathered in rank order, both models).
  std::uint64_t ph = fnv1a(cnn.parameter_span().data(), cnn.parameter_count() * sizeof(float));
  ph = fnv1a(mlp.parameter_span().data(), mlp.parameter_count() * sizeof(float), ph);
  std::int64_t lo = static_cast<std::int64_t>(ph >> 1), hi = lo;
  comm.allreduce(dtrain::BufferView(&lo, 1, dtrain::DType::i64), dtrain::ReduceOp::min);
  comm.allreduce(dtrain::BufferView(&hi, 1, dtrain::DType::i64), dtrain::ReduceOp::max);
  std::uint64_t fh = fnv1a(&sim.u[g.at(0, 0)], own * sizeof(double));
  std::vector<std::uint64_t> all(static_cast<std::size_t>(g.size));
  MPI_Gather(&fh, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);

  const bool trained = sim.trained > 0;
  const bool error_ok = !trained || (cnn_error >= 0 && cnn_error < sim.first_error);
  const bool rollout_ok = !trained || (cnn_roll < mlp_roll && cnn_roll < cfg.rollout_target);
  if (root) {
    std::printf("total heat relative drift %.2e (%s)\n", drift,
                drift < 1e-12 ? "conserved" : "NOT CONSERVED");
    if (trained) {
      std::printf("CNN error on fresh snapshots: first %.4f, final %.4f (%s)\n", sim.first_error,
                  cnn_error, error_ok ? "ok" : "FAILED");
      std::printf(
          "rollout: %d x %lld steps, error relative to the field's change: CNN %.4f, MLP %.4f (CNN "
          "better, bound %.3f: %s)\n",
          cfg.rollout, static_cast<long long>(cfg.horizon), cnn_roll, mlp_roll, cfg.rollout_target,
          rollout_ok ? "ok" : "FAILED");
      std::printf(
          "budget: %lld optimizer steps each on the same tiles; training seconds on rank 0: CNN "
          "%.2f, MLP %.2f\n",
          static_cast<long long>(sim.trained), t_cnn, t_mlp);
    }
    std::printf(
        "halo exchanges with a gradient all-reduce in flight: %lld of %lld training rounds; "
        "replicas %s\n",
        static_cast<long long>(overlapped), static_cast<long long>(rounds),
        lo == hi ? "bit-identical" : "DIFFER");
    std::uint64_t h = 1469598103934665603ull;
    for (auto x : all) h = fnv1a(&x, sizeof x, h);
    std::printf("final state: step %lld field %016llx parameters %016llx\n",
                static_cast<long long>(sim.step), static_cast<unsigned long long>(h),
                static_cast<unsigned long long>(ph));
  }
  return decay_err < 1e-12 && drift < 1e-12 && error_ok && rollout_ok && lo == hi ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return dtrain_cli::mpi_main(argc, argv, [](int argc, char** argv) {
    Config c;
    CLI::App app{
        "In-situ training: a 2D heat-diffusion MPI solver trains a CNN surrogate of its own time "
        "step while it runs, beside an MLP at the same budget (dtrain example 20)"};
    using dtrain_cli::add_int;
    using dtrain_cli::add_real;
    const std::int64_t big = std::int64_t{1} << 40;
    add_int(app, "--nx", c.nx, "grid columns", 8, 1 << 16);
    add_int(app, "--ny", c.ny, "grid rows (split over the ranks)", 8, 1 << 16);
    add_real(app, "--r", c.r, "diffusion number D dt / dx^2 (stable up to 0.25)", 1e-6, 0.25);
    add_int(app, "--steps", c.steps, "simulation steps in total", 1, big);
    add_int(app, "--horizon", c.horizon, "the surrogates predict this many steps ahead", 1, 64);
    add_int(app, "--sample-every", c.sample_every, "keep a snapshot every N steps (0: never)", 0,
            big);
    add_int(app, "--capacity", c.capacity, "tiles each rank keeps (oldest replaced first)", 1,
            1 << 20);
    add_int(app, "--train-every", c.train_every, "train every N steps (0: never)", 0, big);
    add_int(app, "--opt-steps", c.opt_steps, "optimizer steps per training round", 1, 1000);
    dtrain_cli::add_batch(app, c.batch, "tiles per rank per optimizer step");
    add_int(app, "--channels", c.channels, "channels of the CNN's hidden convolutions", 1, 1024);
    dtrain_cli::add_hidden(app, c.hidden);
    add_int(app, "--patch", c.patch, "side of the MLP's input neighbourhood (odd)", 3,
            2 * kReach + 1);
    add_int(app, "--points", c.points, "MLP samples per tile and step (0: every own cell)", 0,
            1 << 24);
    dtrain_cli::add_lr(app, c.lr);
    add_int(app, "--rollout", c.rollout, "surrogate applications compared with the solver", 1,
            10000);
    add_real(app, "--rollout-target", c.rollout_target, "bound on the CNN's rollout error", 1e-9,
             1e9);
    add_int(app, "--ckpt-every", c.ckpt_every, "checkpoint every N steps (0: only at the end)", 0,
            big);
    add_int(app, "--stop-after", c.stop_after, "stop at this step without saving (-1: never)", -1,
            big);
    add_int(app, "--print-every", c.print_every, "progress line every N steps", 1, big);
    dtrain_cli::add_seed(app, c.seed);
    dtrain_cli::add_run_dir(app, c.run_dir);
    const int code = dtrain_cli::run_parser_mpi(app, argc, argv);
    return code >= 0 ? code : run(c);
  });
}
