// Example 20: in-situ training. A 2D heat-diffusion solver split over MPI ranks trains a small CNN
// to predict its field --horizon steps ahead while it runs, beside an MLP of 5 x 5 neighbourhoods
// at the same budget (same AdamW steps, schedule and all-reduce on the same tiles). Design:
// - The solver is an ordinary MPI code (five-point stencil, periodic grid, rows split over the
//   ranks) with its own halo exchange on MPI_COMM_WORLD; dtrain works on a duplicate, so the two
//   never match each other's messages. Heat has an exact discrete solution to check against.
// - Samples are per-rank tiles (the rank's rows plus `halo` ghost rows either side, and their
//   change --horizon steps later): they never leave their rank, and the fully convolutional
//   model applies to the whole field tile by tile, with the same halo exchange.
// - Convolutions pad periodically: right along x (the domain wraps), harmless along y because the
//   halo is as wide as the receptive field and the loss is masked to the rank's own rows. Tiles
//   are scaled to zero mean and unit RMS (the heat step is linear and ignores constants).
// - The same ranks alternate simulation and training; a round's last all-reduce runs on dtrain's
//   progress thread during the next simulation step. One checkpoint holds field, samples, models,
//   optimizers and sampler: a run stopped anywhere (--stop-after) restarts bit for bit.
// Self-checks (exit 1 on failure): exact Fourier-mode decay, heat conservation, the CNN's error on
// fresh snapshots falls, its rollout beats the MLP's, replicas identical.
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
#include <dtrain/train/replica_check.hpp>
#include <dtrain/transports/mpi.hpp>

#include "common/cli_mpi.hpp"
#include "common/mpi_main.hpp"

namespace {

struct Config {
  long long nx = 64, ny = 64, steps = 240, horizon = 4, train_every = 4, batch = 2;
  long long ckpt_every = 100, stop_after = -1;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::string run_dir = "insitu_run";
};
// Fixed settings: diffusion number D dt / dx^2, the CNN's receptive field (four 3 x 3
// convolutions) and channels, the MLP's patch side and width, tiles kept per rank, optimizer steps
// per training round, surrogate applications in the final rollout and a bound on the CNN's error.
constexpr double kR = 0.2, kRolloutBound = 0.3;
constexpr int kReach = 4, kChannels = 8, kPatch = 5, kHidden = 32, kCapacity = 64, kOptSteps = 2;
constexpr int kRollout = 8;

double sum_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x;
}

// Rows [row0, row0 + rows) of the periodic grid, with `halo` ghost rows on each side.
struct Grid {
  int nx = 0, ny = 0, rows = 0, row0 = 0, halo = kReach, rank = 0, size = 1;
  std::size_t cells() const { return std::size_t(rows + 2 * halo) * nx; }
  std::size_t at(int i, int j) const { return std::size_t(i + halo) * nx + j; }
  void exchange(std::vector<double>& u) const {
    const int n = halo * nx, up = (rank + size - 1) % size, down = (rank + 1) % size;
    auto one = [&](std::size_t send, int to, int tag, std::size_t recv, int from) {
      MPI_Status st;
      int count = 0;
      MPI_Sendrecv(&u[send], n, MPI_DOUBLE, to, tag, &u[recv], n, MPI_DOUBLE, from, MPI_ANY_TAG,
                   MPI_COMM_WORLD, &st);
      MPI_Get_count(&st, MPI_DOUBLE, &count);
      if (st.MPI_TAG != tag || count != n)  // a message of dtrain's would have another tag
        throw std::runtime_error("insitu: rank " + std::to_string(rank) +
                                 ": foreign message in the halo exchange");
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
  long long step = 0, trained = 0, tiles = 0;
  double initial_total = 0, first_error = -1;
  std::vector<double> u, snap;  // the field and the snapshot waiting for its target (with halos)
  dtrain::Shape shape;
  template <class V>
  void visit_state(V& v) {
    v.scalar("step", step);
    v.scalar("trained", trained);
    v.scalar("tiles", tiles);  // read first on restore: the store grows to this size
    v.scalar("initial_total", initial_total);
    v.scalar("first_error", first_error);
    v.tensor("u", dtrain::BufferView(u.data(), u.size(), dtrain::DType::f64), shape);
    v.tensor("snap", dtrain::BufferView(snap.data(), snap.size(), dtrain::DType::f64), shape);
  }
};

// A tile as the CNN sees it: (u - mean) / rms over the whole tile; returns the rms.
double scale_tile(const std::vector<double>& u, float* x) {
  double m = 0, ss = 0;
  for (double v : u) m += v;
  m /= double(u.size());
  for (double v : u) ss += (v - m) * (v - m);
  const double s = std::max(std::sqrt(ss / double(u.size())), 1e-30);
  for (std::size_t k = 0; k < u.size(); ++k) x[k] = float((u[k] - m) / s);
  return s;
}

// The MLP's inputs: for each own cell of a scaled tile, its neighbourhood minus its centre.
void neighbourhoods(const Grid& g, const float* x, float* p) {
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j)
      for (int di = -kPatch / 2; di <= kPatch / 2; ++di)
        for (int dj = -kPatch / 2; dj <= kPatch / 2; ++dj)
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
  g.nx = int(cfg.nx), g.ny = int(cfg.ny), g.row0 = int(cfg.ny * g.rank / g.size);
  g.rows = int(cfg.ny * (g.rank + 1) / g.size) - g.row0;
  auto say = [root = g.rank == 0](const char* format, auto... args) {
    if (root) std::printf(format, args...);
  };
  if (g.rows < g.halo || kCapacity < cfg.batch) {
    say("insitu: need >= %d rows per rank and --batch <= %d\n", g.halo, kCapacity);
    return 2;
  }
  dtrain::MpiTransport transport(MPI_COMM_WORLD);  // dtrain's own duplicate of the communicator
  dtrain::Communicator comm(transport);
  const double decay_err = fourier_decay_error(g, kR, 50);
  say("solver check: Fourier mode after 50 steps, max error %.2e against the exact discrete decay "
      "(%s)\n",
      decay_err, decay_err < 1e-12 ? "ok" : "FAILED");

  // The CNN lifts to C channels, runs a pre-activation residual block and projects back (the lift
  // and the projection alone are a linear 5 x 5 stencil). Named all-reduce algorithms fix the
  // reduction order, so a resumed run reproduces the bits.
  const long long C = kChannels, H = kHidden, T = g.rows + 2 * g.halo, nf = kPatch * kPatch;
  dtrain::Sequential cnn{dtrain::Input{1, T, cfg.nx}, dtrain::Conv2d(1, C, 3).periodic(1),
                         dtrain::Residual{dtrain::Relu(), dtrain::Conv2d(C, C, 3).periodic(1),
                                          dtrain::Relu(), dtrain::Conv2d(C, C, 3).periodic(1)},
                         dtrain::Conv2d(C, 1, 3).periodic(1)};
  dtrain::Sequential mlp{dtrain::Linear(nf, H), dtrain::Tanh(), dtrain::Linear(H, H),
                         dtrain::Tanh(), dtrain::Linear(H, 1)};
  cnn.init(cfg.seed);
  mlp.init(cfg.seed);
  // The targets are small (the change over a few steps): the projection starts near zero.
  const auto& info = cnn.parameter_info();
  for (std::size_t k = info[info.size() - 2].offset; k < cnn.parameter_count(); ++k)
    cnn.parameter_span()[k] *= 0.01f;
  const long long total =
      std::max(2LL, cfg.train_every ? cfg.steps / cfg.train_every * kOptSteps : 2);
  auto schedule =
      dtrain::Schedule::warmup_cosine(cfg.lr, std::min(50LL, total / 10 + 1), total, cfg.lr * 0.01);
  dtrain::AdamW cnn_opt(cnn, schedule), mlp_opt(mlp, schedule);
  dtrain::GradientSync cnn_sync(comm, cnn.gradients(), 256 << 10, dtrain::AllreduceAlgorithm::ring);
  dtrain::GradientSync mlp_sync(comm, mlp.gradients(), 256 << 10, dtrain::AllreduceAlgorithm::ring);

  // This rank's tiles: scaled field -> its scaled change per unit of r * horizon.
  const std::size_t tile = g.cells(), own = std::size_t(g.rows) * g.nx, B = cfg.batch;
  dtrain::InMemoryDataset store(dtrain::Shape{1, T, cfg.nx}, dtrain::Shape{1, T, cfg.nx},
                                kCapacity);
  dtrain::SamplerOptions sopt;
  sopt.drop_last = true;
  dtrain::DistributedSampler sampler(0, 0, 1, cfg.seed, sopt);  // world size 1: this rank's store
  SimState sim;
  sim.shape = dtrain::Shape{T, cfg.nx};
  sim.u = std::vector<double>(tile);
  initial_field(g, cfg.seed, sim.u);
  sim.initial_total = g.total(sim.u);
  sim.snap = sim.u;

  // Everything a restart needs, listed once for save and restore.
  dtrain::Checkpointer ckpt(comm, cfg.run_dir);
  auto items = [&](auto&& f) {
    return f(dtrain::named("cnn", cnn), dtrain::named("cnn_optimizer", cnn_opt),
             dtrain::named("mlp", mlp), dtrain::named("mlp_optimizer", mlp_opt),
             dtrain::named("sampler", sampler), dtrain::per_rank("store", store),
             dtrain::per_rank("sim", sim));
  };
  auto save = [&] {
    sim.tiles = static_cast<long long>(store.size());
    items([&](const auto&... o) { ckpt.save(sim.step, o...); });
  };
  // The simulation state first: it says how many tiles the store and the sampler must hold.
  if (ckpt.restore_latest(dtrain::per_rank("sim", sim))) {
    const std::vector<float> zero(tile, 0.0f);
    for (long long k = 0; k < sim.tiles; ++k) store.append_pair(zero, zero);
    sampler.set_num_samples(store.size());
    items([&](const auto&... o) { return ckpt.restore_latest(o...); });
    say("resumed at step %lld from %s (%zu tiles per rank, %lld optimizer steps)\n", sim.step,
        cfg.run_dir.c_str(), store.size(), sim.trained);
  }
  say("dtrain %s: %d ranks, %lldx%lld grid, tiles %lldx%lld; CNN %zu parameters, MLP "
      "%lld->%lld->%lld->1 %zu\n",
      dtrain::version_string(), g.size, cfg.nx, cfg.ny, T, cfg.nx, cnn.parameter_count(), nf, H, H,
      mlp.parameter_count());

  std::vector<float> xb(B * tile), yb(B * tile), dy(B * tile), xt(tile), yt(tile), pred(own);
  std::vector<float> xm(B * own * nf), ym(B * own);
  std::vector<double> tmp(tile);
  dtrain::PassOptions eval;
  eval.training = false;
  // Either model's prediction for the rank's own rows of a scaled tile, and its error relative to
  // the target tile yt (over all ranks).
  auto predict = [&](bool use_cnn, const float* x) {
    if (!use_cnn) neighbourhoods(g, x, xm.data());
    const float* o =
        use_cnn ? cnn.forward(x, 1, eval) + g.at(0, 0) : mlp.forward(xm.data(), own, eval);
    std::copy(o, o + own, pred.begin());
  };
  auto rel_error = [&](bool use_cnn) {
    predict(use_cnn, xt.data());
    double e[2] = {0, 0};
    for (std::size_t k = 0; k < own; ++k) {
      const double y = yt[g.at(0, 0) + k];
      e[0] += (pred[k] - y) * (pred[k] - y), e[1] += y * y;
    }
    comm.allreduce(dtrain::BufferView(e, 2, dtrain::DType::f64), dtrain::ReduceOp::sum);
    return std::sqrt(e[0] / e[1]);
  };
  // One optimizer step of each model on the same tiles. The MLP's all-reduce completes here; the
  // CNN's runs on while the caller goes on (finish() waits for it and applies the update).
  double t_cnn = 0, t_mlp = 0, last_loss = 0;
  auto train_step = [&] {
    if (sampler.batch_rows_at(sampler.position(), B) == 0) sampler.set_epoch(sampler.epoch() + 1);
    const auto idx = sampler.next_indices(B);
    sampler.advance(B);
    store.read_pairs(idx, xb, yb);
    dtrain::Timer t;
    for (std::size_t b = 0; b < B; ++b) {
      neighbourhoods(g, &xb[b * tile], &xm[b * own * nf]);
      const auto y = yb.begin() + b * tile;
      std::copy(y + g.at(0, 0), y + g.at(g.rows, 0), ym.begin() + b * own);
    }
    dtrain::PassOptions pass;
    pass.step = sim.trained;
    mlp.zero_grad();
    mlp.forward_backward(xm.data(), ym.data(), B * own, dtrain::Loss::mse, mlp_sync, pass);
    mlp_sync.wait();
    mlp_opt.step();
    t_mlp += t.seconds();
    dtrain::Timer tc;
    // The CNN's loss: mean squared error over the rank's own rows (the halo rows only feed them).
    cnn.zero_grad();
    const float* out = cnn.forward(xb.data(), B, pass);
    last_loss = 0;
    for (std::size_t k = 0; k < B * tile; ++k) {
      const bool mine = k % tile >= g.at(0, 0) && k % tile < g.at(g.rows, 0);
      const float d = mine ? out[k] - yb[k] : 0.0f;
      dy[k] = 2 * d / float(B * own);
      last_loss += double(d) * d / double(B * own);
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

  double cnn_error = -1, mlp_error = -1;
  while (sim.step < cfg.steps) {
    if (sim.step == cfg.stop_after) {
      say("stopping at step %lld without saving (--stop-after): restart to continue from the last "
          "checkpoint\n",
          sim.step);
      return 0;
    }
    const bool train = cfg.train_every > 0 && sim.step % cfg.train_every == 0 && store.size() >= B;
    for (int k = 0; train && k < kOptSteps; ++k) {
      train_step();
      if (k + 1 < kOptSteps) finish();
    }
    g.step(sim.u, tmp, kR);  // the last all-reduce may still be in flight here
    ++sim.step;
    if (train) finish();
    if (sim.step % cfg.horizon == 0) {
      // The snapshot's target is here: both models' error on the pair (never trained on), then it
      // joins the store and the next snapshot is taken.
      const double per = scale_tile(sim.snap, xt.data()) * kR * double(cfg.horizon);
      for (std::size_t k = 0; k < tile; ++k) yt[k] = float((sim.u[k] - sim.snap[k]) / per);
      cnn_error = rel_error(true), mlp_error = rel_error(false);
      if (sim.trained > 0 && sim.first_error < 0) sim.first_error = cnn_error;
      store.append_pair(xt, yt);
      if (sampler.num_samples() != store.size()) sampler.set_num_samples(store.size());
      sim.snap = sim.u;
    }
    if (sim.step % 100 == 0 && cnn_error >= 0)
      say("step %6lld  loss %.3e  error on the newest snapshot: CNN %.4f  MLP %.4f\n", sim.step,
          last_loss, cnn_error, mlp_error);
    if (cfg.ckpt_every > 0 && sim.step % cfg.ckpt_every == 0 && sim.step < cfg.steps) save();
  }
  save();
  const double drift = std::abs(g.total(sim.u) - sim.initial_total) / std::abs(sim.initial_total);

  // Rollout: each surrogate applied kRollout times (horizon steps each) to the final field, tile
  // by tile with the halo exchange, against the solver; error relative to the field's change.
  double err[3] = {0, 0, 0};
  std::vector<double> v = sim.u;
  for (long long n = 0; n < kRollout * cfg.horizon; ++n) g.step(v, tmp, kR);
  for (int m = 0; m < 2; ++m) {
    std::vector<double> f = sim.u;
    for (int n = 0; n < kRollout; ++n) {
      const double per = scale_tile(f, xt.data()) * kR * double(cfg.horizon);
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
  const double cnn_roll = std::sqrt(err[0] / err[2]), mlp_roll = std::sqrt(err[1] / err[2]);

  // Replicas and the final state's fingerprint (field gathered in rank order, both models).
  const bool same = dtrain::replicas_identical(comm, cnn) && dtrain::replicas_identical(comm, mlp);
  unsigned long long ph = fnv1a(cnn.parameter_span().data(), cnn.parameter_count() * sizeof(float));
  ph = fnv1a(mlp.parameter_span().data(), mlp.parameter_count() * sizeof(float), ph);
  std::uint64_t fh = fnv1a(&sim.u[g.at(0, 0)], own * sizeof(double));
  std::vector<std::uint64_t> all(g.size);
  MPI_Gather(&fh, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  unsigned long long h = 1469598103934665603ull;
  for (auto x : all) h = fnv1a(&x, sizeof x, h);

  const bool trained = sim.trained > 0;
  const bool error_ok = !trained || (cnn_error >= 0 && cnn_error < sim.first_error);
  const bool rollout_ok = !trained || (cnn_roll < mlp_roll && cnn_roll < kRolloutBound);
  say("total heat relative drift %.2e (%s)\n", drift,
      drift < 1e-12 ? "conserved" : "NOT CONSERVED");
  if (trained) {
    say("CNN error on fresh snapshots: first %.4f, final %.4f (%s)\n", sim.first_error, cnn_error,
        error_ok ? "ok" : "FAILED");
    say("rollout: %d x %lld steps, error relative to the field's change: CNN %.4f, MLP %.4f (CNN "
        "better, bound %.3f: %s)\n",
        kRollout, cfg.horizon, cnn_roll, mlp_roll, kRolloutBound, rollout_ok ? "ok" : "FAILED");
    say("budget: %lld optimizer steps each on the same tiles; training seconds on rank 0: CNN "
        "%.2f, "
        "MLP %.2f\n",
        sim.trained, t_cnn, t_mlp);
  }
  say("replicas %s\n", same ? "bit-identical" : "DIFFER");
  say("final state: step %lld field %016llx parameters %016llx\n", sim.step, h, ph);
  return decay_err < 1e-12 && drift < 1e-12 && error_ok && rollout_ok && same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return dtrain_cli::mpi_main(argc, argv, [](int argc, char** argv) {
    Config c;
    CLI::App app{
        "In-situ training: a 2D heat-diffusion MPI solver trains a CNN surrogate of its "
        "own time step while it runs, beside an MLP at the same budget (dtrain example 20)"};
    using dtrain_cli::add_int;
    const long long big = 1LL << 40;
    add_int(app, "--nx", c.nx, "grid columns", 8, 1 << 16);
    add_int(app, "--ny", c.ny, "grid rows (split over the ranks)", 8, 1 << 16);
    add_int(app, "--steps", c.steps, "simulation steps in total", 1, big);
    add_int(app, "--horizon", c.horizon, "the surrogates predict this many steps ahead", 1, 64);
    add_int(app, "--train-every", c.train_every, "train every N steps (0: never)", 0, big);
    dtrain_cli::add_batch(app, c.batch, "tiles per rank per optimizer step");
    dtrain_cli::add_lr(app, c.lr);
    add_int(app, "--ckpt-every", c.ckpt_every, "checkpoint every N steps (0: only at the end)", 0,
            big);
    add_int(app, "--stop-after", c.stop_after, "stop at this step without saving (-1: never)", -1,
            big);
    dtrain_cli::add_seed(app, c.seed);
    dtrain_cli::add_run_dir(app, c.run_dir);
    const int code = dtrain_cli::run_parser_mpi(app, argc, argv);
    return code >= 0 ? code : run(c);
  });
}
