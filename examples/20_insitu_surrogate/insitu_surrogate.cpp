// Example 20: in-situ training. A 2D heat-diffusion solver split over MPI ranks trains a small CNN
// to predict its field --horizon steps ahead while it runs, beside an MLP of 5 x 5 neighbourhoods
// at the same budget (same AdamW steps, schedule and all-reduce on the same tiles). Design:
// - The solver (heat_solver.hpp: five-point stencil, periodic grid, rows split over the ranks) is
//   an ordinary MPI code with its own halo exchange on MPI_COMM_WORLD; dtrain works on a duplicate,
//   so the two never match each other's messages. Heat has an exact discrete solution to check.
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
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/train/replica_check.hpp>
#include <dtrain/transports/mpi.hpp>

#include "common/cli_mpi.hpp"
#include "common/mpi_main.hpp"
#include "heat_solver.hpp"
#include "tiles.hpp"

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

int run(const Config& cfg) {
  const Grid g = make_grid(cfg.nx, cfg.ny, kReach);
  auto say = [root = g.rank == 0](const char* format, auto... args) {
    if (root) std::printf(format, args...);
  };
  auto verdict = [](bool ok) { return ok ? "ok" : "FAILED"; };
  if (g.rows < g.halo || kCapacity < cfg.batch) {
    say("insitu: need >= %d rows per rank and --batch <= %d\n", g.halo, kCapacity);
    return 2;
  }
  dtrain::MpiTransport transport(MPI_COMM_WORLD);  // dtrain's own duplicate of the communicator
  dtrain::Communicator comm(transport);
  const double decay_err = fourier_decay_error(g, kR, 50);
  say("solver check: Fourier mode after 50 steps, max error %.2e against the exact discrete decay "
      "(%s)\n",
      decay_err, verdict(decay_err < 1e-12));

  // The CNN lifts to C channels, runs a pre-activation residual block and projects back (the lift
  // and the projection alone are a linear 5 x 5 stencil). Named all-reduce algorithms fix the
  // reduction order, so a resumed run reproduces the bits.
  const long long C = kChannels, H = kHidden, T = g.rows + 2 * g.halo, nf = kPatch * kPatch;
  dtrain::Sequential cnn{
      dtrain::Input{1, T, cfg.nx},
      dtrain::Conv2d(1, C, 3).with_padding(1, dtrain::Padding::periodic),
      dtrain::Residual{
          dtrain::Relu(), dtrain::Conv2d(C, C, 3).with_padding(1, dtrain::Padding::periodic),
          dtrain::Relu(), dtrain::Conv2d(C, C, 3).with_padding(1, dtrain::Padding::periodic)},
      dtrain::Conv2d(C, 1, 3).with_padding(1, dtrain::Padding::periodic)};
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
  SimState sim = initial_state(g, cfg.seed);

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
  // Either model's prediction for the rank's own rows of the scaled tile xt, and its error
  // relative to the target tile yt (over all ranks).
  auto predict = [&](bool use_cnn) {
    if (!use_cnn) neighbourhoods(g, kPatch, xt.data(), xm.data());
    const float* o =
        use_cnn ? cnn.forward(xt.data(), 1, eval) + g.at(0, 0) : mlp.forward(xm.data(), own, eval);
    std::copy(o, o + own, pred.begin());
  };
  auto rel_error = [&](bool use_cnn) {
    predict(use_cnn);
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
      neighbourhoods(g, kPatch, &xb[b * tile], &xm[b * own * nf]);
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
    cnn.zero_grad();
    last_loss = own_rows_mse(g, B, cnn.forward(xb.data(), B, pass), yb.data(), dy.data());
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

  // Rollout: a surrogate applied kRollout times (horizon steps each) to the final field, tile by
  // tile with the halo exchange, against the solver; error relative to the field's change.
  std::vector<double> v = sim.u;
  for (long long n = 0; n < kRollout * cfg.horizon; ++n) g.step(v, tmp, kR);
  const double change = g.distance2(v, sim.u);
  auto rollout_error = [&](bool use_cnn) {
    std::vector<double> f = sim.u;
    for (int n = 0; n < kRollout; ++n) {
      const double per = scale_tile(f, xt.data()) * kR * double(cfg.horizon);
      predict(use_cnn);
      for (std::size_t k = 0; k < own; ++k) f[g.at(0, 0) + k] += pred[k] * per;
      g.exchange(f);
    }
    return std::sqrt(g.distance2(f, v) / change);
  };
  const double cnn_roll = rollout_error(true), mlp_roll = rollout_error(false);

  // Replicas and the final state's fingerprint (the whole field, both models).
  const bool same = dtrain::replicas_identical(comm, cnn) && dtrain::replicas_identical(comm, mlp);
  unsigned long long ph = fnv1a(cnn.parameter_span().data(), cnn.parameter_count() * sizeof(float));
  ph = fnv1a(mlp.parameter_span().data(), mlp.parameter_count() * sizeof(float), ph);
  const unsigned long long h = g.fingerprint(sim.u);

  const bool trained = sim.trained > 0;
  const bool error_ok = !trained || (cnn_error >= 0 && cnn_error < sim.first_error);
  const bool rollout_ok = !trained || (cnn_roll < mlp_roll && cnn_roll < kRolloutBound);
  say("total heat relative drift %.2e (%s)\n", drift,
      drift < 1e-12 ? "conserved" : "NOT CONSERVED");
  if (trained) {
    say("CNN error on fresh snapshots: first %.4f, final %.4f (%s)\n", sim.first_error, cnn_error,
        verdict(error_ok));
    say("rollout: %d x %lld steps, error relative to the field's change: CNN %.4f, MLP %.4f (CNN "
        "better, bound %.3f: %s)\n",
        kRollout, cfg.horizon, cnn_roll, mlp_roll, kRolloutBound, verdict(rollout_ok));
    say("budget: %lld optimizer steps each on the same tiles; training seconds on rank 0: "
        "CNN %.2f, MLP %.2f\n",
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
