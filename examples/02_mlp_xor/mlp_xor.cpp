// Example 02: an MLP learns XOR from noisy points, on one process.
//
// XOR is the smallest task a linear model cannot solve, so reaching 100% accuracy shows the hidden
// layer, its gradients and the optimizer working together. The example checks itself: it exits
// non-zero unless the training loss falls below 0.05 and every held-out point is classified
// correctly. Run: ./mlp_xor [--max-steps N] [--seed N] (--help lists the options)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>

#include "common/cli.hpp"

namespace {
// Points around the four corners of the unit square (sd 0.1, so the classes do not overlap); the
// class is XOR of the corner's bits.
void make_xor(std::int64_t n, std::uint64_t seed, std::vector<float>& x,
              std::vector<std::int32_t>& y) {
  dtrain::RngStream rng(seed, 0);
  x.resize(static_cast<std::size_t>(2 * n));
  y.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const int a = static_cast<int>(rng.below(2)), b = static_cast<int>(rng.below(2));
    x[2 * i] = static_cast<float>(a + 0.1 * rng.normal());
    x[2 * i + 1] = static_cast<float>(b + 0.1 * rng.normal());
    y[i] = a ^ b;
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 300;
  std::uint64_t seed = 2024;
  CLI::App app("Example 02: an MLP learns noisy XOR on one process (self-checking).", "mlp_xor");
  dtrain_cli::add_int(app, "--max-steps", steps, "optimizer steps (more than the 20 warm-up steps)",
                      21, 1000000);
  dtrain_cli::add_seed(app, seed);
  if (const int code = dtrain_cli::run_parser(app, argc, argv); code >= 0) return code;
  const std::int64_t batch = 64;
  std::vector<float> x_train, x_test;
  std::vector<std::int32_t> y_train, y_test;
  make_xor(batch * 8, 1, x_train, y_train);
  make_xor(256, 2, x_test, y_test);

  dtrain::Sequential model{dtrain::Linear(2, 32), dtrain::Tanh(), dtrain::Linear(32, 32),
                           dtrain::Gelu(), dtrain::Linear(32, 2)};
  model.init(seed);  // every rank passing this seed would hold the same parameters
  dtrain::AdamW opt(model, dtrain::Schedule::warmup_cosine(0.02, 20, steps, 1e-4));

  double loss = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    const std::int64_t first = (step % 8) * batch;
    model.zero_grad();
    loss = model.forward_backward(x_train.data() + 2 * first, y_train.data() + first, batch);
    dtrain::clip_grad_norm(model.gradients(), 1.0);
    opt.step();
    if (step % 50 == 0 || step == steps - 1)
      std::printf("step %4lld  loss %.4f  lr %.5f\n", static_cast<long long>(step), loss,
                  opt.current_lr());
  }
  const double acc = model.accuracy(x_test.data(), y_test.data(), 256);
  std::printf("final loss %.4f, held-out accuracy %.4f (%zu parameters)\n", loss, acc,
              model.parameter_count());
  if (loss < 0.05 && acc == 1.0) {
    std::printf("OK\n");
    return 0;
  }
  std::printf("FAILED: expected loss < 0.05 and accuracy 1.0\n");
  return 1;
}
