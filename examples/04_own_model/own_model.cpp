// Example 04: your own model. The rank code computes a 2-layer MLP's forward and backward passes
// itself (plain C++ loops standing for your own CUDA, Kokkos or Fortran kernels); dtrain holds the
// parameters and gradients (ParameterSet), averages each tensor's gradient while the backward pass
// goes on (GradientSync), clips, steps AdamW and checkpoints. Self-checking: exits non-zero unless
// the held-out loss falls below --target and the replicas are bit-identical. Prints a checksum of
// the final parameters, which a resumed run must reproduce (own_model_test.cmake, beside this
// file). Run: mpiexec.mpich -n 2 ./own_model [--run-dir DIR] [--stop-after N]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/model/parameter_set.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/train/replica_check.hpp>
#include <dtrain/transports/mpi.hpp>

#include "common/cli.hpp"
#include "common/cli_mpi.hpp"
#include "common/mpi_main.hpp"

namespace {
constexpr int kIn = 4, kHidden = 32, kBatch = 64;
// The function to learn, and a batch of it: fixed by (seed, stream), so a resumed run sees the
// same batches as an uninterrupted one.
float target(const float* x) { return std::sin(2 * x[0]) + x[1] * x[2] - 0.5f * x[3] * x[3]; }
void make_batch(std::uint64_t seed, std::uint64_t stream, std::vector<float>& x,
                std::vector<float>& y) {
  dtrain::RngStream rng(seed, stream);
  for (auto& v : x) v = static_cast<float>(2 * rng.uniform_double() - 1);
  for (int r = 0; r < kBatch; ++r) y[r] = target(&x[r * kIn]);
}

// "Your kernels": y = W2 tanh(W1 x + b1) + b2 and the mean squared error. With `set` given the
// backward pass writes the gradients and reports each tensor as soon as it is final, last first.
struct Mlp {
  dtrain::ParameterRef<float> w1, b1, w2, b2;
  std::vector<float> h = std::vector<float>(kBatch * kHidden), dy = std::vector<float>(kBatch);
  double loss(const std::vector<float>& x, const std::vector<float>& y,
              const dtrain::ParameterSet* set = nullptr, dtrain::GradientSync* sync = nullptr) {
    double total = 0;
    for (int r = 0; r < kBatch; ++r) {
      float out = b2.param[0];
      for (int j = 0; j < kHidden; ++j) {
        float a = b1.param[j];
        for (int i = 0; i < kIn; ++i) a += w1.param[j * kIn + i] * x[r * kIn + i];
        h[r * kHidden + j] = std::tanh(a);
        out += w2.param[j] * h[r * kHidden + j];
      }
      total += double(out - y[r]) * (out - y[r]) / kBatch;
      dy[r] = 2 * (out - y[r]) / kBatch;
    }
    if (!set) return total;
    b2.grad[0] = 0;  // output layer first: its two tensors can be averaged at once
    for (int j = 0; j < kHidden; ++j) w2.grad[j] = 0;
    for (int r = 0; r < kBatch; ++r) {
      b2.grad[0] += dy[r];
      for (int j = 0; j < kHidden; ++j) w2.grad[j] += dy[r] * h[r * kHidden + j];
    }
    set->grad_ready(b2.index, *sync);
    set->grad_ready(w2.index, *sync);
    for (int j = 0; j < kHidden; ++j) {  // then the hidden layer, while those travel
      float gb = 0, gw[kIn] = {};
      for (int r = 0; r < kBatch; ++r) {
        const float da = dy[r] * w2.param[j] * (1 - h[r * kHidden + j] * h[r * kHidden + j]);
        gb += da;
        for (int i = 0; i < kIn; ++i) gw[i] += da * x[r * kIn + i];
      }
      b1.grad[j] = gb;
      for (int i = 0; i < kIn; ++i) w1.grad[j * kIn + i] = gw[i];
    }
    set->grad_ready(b1.index, *sync);
    set->grad_ready(w1.index, *sync);
    return total;
  }
};
}  // namespace

int main(int argc, char** argv) {
  return dtrain_cli::mpi_main(argc, argv, [](int ac, char** av) {
    std::int64_t steps = 400, ckpt_every = 50, stop_after = -1;
    std::uint64_t seed = 7;
    double target_loss = 0.02;
    std::string run_dir = "own-run";
    CLI::App app("Example 04: a hand-written MLP trained by dtrain (self-checking).", "own_model");
    dtrain_cli::add_int(app, "--steps", steps, "optimizer steps", 1, 1000000);
    dtrain_cli::add_int(app, "--ckpt-every", ckpt_every, "steps between checkpoints", 1, 1000000);
    dtrain_cli::add_int(app, "--stop-after", stop_after,
                        "stop at this step without saving (-1: never)", -1, 1000000);
    dtrain_cli::add_real(app, "--target", target_loss, "held-out loss to reach", 0, 1e9);
    dtrain_cli::add_seed(app, seed);
    dtrain_cli::add_run_dir(app, run_dir);
    if (const int code = dtrain_cli::run_parser_mpi(app, ac, av); code >= 0) return code;

    dtrain::MpiTransport transport(MPI_COMM_WORLD);
    dtrain::Communicator comm(transport);
    const bool root = comm.rank() == 0;
    // dtrain owns the two arenas; the tensors' pointers are what the kernels use.
    dtrain::ParameterSet set(
        {{"hidden/weight", {kHidden, kIn}, dtrain::ParameterInit::kaiming_uniform},
         {"hidden/bias", {kHidden}, dtrain::ParameterInit::zeros},
         {"out/weight", {1, kHidden}, dtrain::ParameterInit::xavier_uniform},
         {"out/bias", {1}, dtrain::ParameterInit::zeros}});
    set.init(seed);  // identical on every rank, no broadcast
    Mlp mlp{set.tensor(0), set.tensor(1), set.tensor(2), set.tensor(3)};
    dtrain::AdamW opt(set, dtrain::Schedule::warmup_cosine(0.01, 20, steps, 1e-4));
    // 64-byte buckets, so the output layer's gradients are on the wire during the hidden layer's
    // backward pass; ring keeps the reduction order, hence the bits, the same in a resumed run.
    dtrain::GradientSync sync(comm, set.gradients(), 64, dtrain::AllreduceAlgorithm::ring);
    dtrain::CheckpointOptions every;
    every.every_steps = ckpt_every;
    dtrain::Checkpointer ckpt(comm, run_dir, every);
    std::int64_t step =
        ckpt.restore_latest(dtrain::named("model", set), dtrain::named("optimizer", opt))
            .value_or(0);
    if (root && step > 0) std::printf("resumed at step %lld\n", static_cast<long long>(step));

    std::vector<float> x(kBatch * kIn), y(kBatch), xv(kBatch * kIn), yv(kBatch);
    make_batch(seed, 1ull << 40, xv, yv);  // held out, the same on every rank
    for (; step < steps; ++step) {
      if (step == stop_after) {
        if (root)
          std::printf("stopping at step %lld without saving\n", static_cast<long long>(step));
        return 0;
      }
      make_batch(seed, static_cast<std::uint64_t>(step * comm.size() + comm.rank()), x, y);
      double loss = mlp.loss(x, y, &set, &sync);  // reports each tensor to sync
      sync.wait();                                // the averages are in the gradient arena
      dtrain::clip_grad_norm(set.gradients(), 1.0);
      opt.step();
      ckpt.maybe_save(step + 1, dtrain::named("model", set), dtrain::named("optimizer", opt));
      comm.allreduce(dtrain::BufferView(&loss, 1, dtrain::DType::f64), dtrain::ReduceOp::avg);
      if (root && (step % 100 == 0 || step + 1 == steps))
        std::printf("step %4lld  loss %.5f  lr %.5f\n", static_cast<long long>(step), loss,
                    opt.current_lr());
    }
    const double held_out = mlp.loss(xv, yv);
    const bool same = dtrain::replicas_identical(comm, set);
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the parameter bytes
    const auto* bytes = reinterpret_cast<const unsigned char*>(set.parameter_span().data());
    for (std::size_t i = 0; i < set.parameters().bytes(); ++i)
      h = (h ^ bytes[i]) * 1099511628211ull;
    const bool ok = held_out < target_loss && same;
    if (root)
      std::printf("held-out loss %.5f (target %.5f), replicas %s\nfinal parameters %016llx\n%s\n",
                  held_out, target_loss, same ? "bit-identical" : "DIFFER",
                  static_cast<unsigned long long>(h), ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
  });
}
