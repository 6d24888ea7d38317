// SPDX-License-Identifier: BSD-3-Clause
// conv_profile: one convolution layer of model_bench's models, one pass, in a loop, for `perf`
// (the library's code only: no oneDNN, no other lowering in the process). Layers: cnn1 (1 -> 16,
// 28x28, batch 64), cnn2 (16 -> 32, 14x14, batch 64), sur1 (1 -> 8, 40x64 periodic, batch 2),
// sur8 (8 -> 8, the residual block's), sur81 (8 -> 1); all 3x3, padding 1. Passes: fwd (forward),
// wgrad (weight and bias gradients, no input gradient: the first layer's backward), bwd (all three
// gradients). Prints CPU ms per pass (median of 5 batches of reps / 5 calls) and GFLOP/s (2 x
// multiply-adds) against the measured FMA peak. Build (repository root, no -march: as a user's
// build compiles the header):
//   g++ -std=c++17 -O3 -g -Iinclude -Ikernels -Itransports benchmarks/compare/conv_profile.cpp
//     -o /tmp/conv_profile -lpthread
// Run: /tmp/conv_profile LAYER PASS [reps=2000] [avx512|avx2|portable]; profile:
//   perf record -o /tmp/p.data /tmp/conv_profile cnn1 fwd 20000 && perf report -i /tmp/p.data
//     --no-children --sort sym
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>

#include "../fma_peak.hpp"

int main(int argc, char** argv) {
  using namespace dtrain;
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: conv_profile cnn1|cnn2|sur1|sur8|sur81 fwd|wgrad|bwd [reps] [isa]\n");
    return 2;
  }
  const std::string name = argv[1], pass = argv[2];
  const int reps = argc > 3 ? std::atoi(argv[3]) : 2000;
  if (argc > 4) {
    const std::string isa = argv[4];
    host::force_conv_isa(isa == "avx512" ? host::ConvIsa::avx512
                         : isa == "avx2" ? host::ConvIsa::avx2
                                         : host::ConvIsa::portable);
  }
  struct Def {
    const char* name;
    std::int64_t cin, cout, h, w, batch;
    bool periodic;
  };
  const Def defs[] = {{"cnn1", 1, 16, 28, 28, 64, false},
                      {"cnn2", 16, 32, 14, 14, 64, false},
                      {"sur1", 1, 8, 40, 64, 2, true},
                      {"sur8", 8, 8, 40, 64, 2, true},
                      {"sur81", 8, 1, 40, 64, 2, true}};
  const Def* d = nullptr;
  for (const Def& x : defs)
    if (name == x.name) d = &x;
  if (!d || (pass != "fwd" && pass != "wgrad" && pass != "bwd") || reps < 5) {
    std::fprintf(stderr, "conv_profile: unknown layer or pass, or reps < 5\n");
    return 2;
  }
  Conv spec = Conv2d(d->cin, d->cout, 3);
  if (d->periodic)
    spec.with_padding(1, Padding::periodic);
  else
    spec.with_padding(1);
  ConvLayer<float, HostExec> layer(spec.with_lowering(ConvLowering::direct));
  layer.setup(Shape{d->cin, d->h, d->w});
  HostExec& exec = HostExec::instance();
  const auto np = static_cast<std::size_t>(layer.param_count());
  const auto nin = static_cast<std::size_t>(layer.input_size() * d->batch),
             nout = static_cast<std::size_t>(layer.output_size() * d->batch);
  std::vector<float> p(np), g(np), x(nin), y(nout), dy(nout), dx(nin);
  layer.bind(exec, p.data(), g.data());
  layer.init(1, 0, p.data());
  layer.reserve(d->batch);
  RngStream rng(3, 0);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  for (auto& v : dy) v = static_cast<float>(rng.normal());
  const PassContext ctx{};
  const auto s = exec.compute_stream();
  auto run = [&] {
    if (pass == "fwd")
      layer.forward(s, x.data(), y.data(), d->batch, ctx);
    else
      layer.backward(s, x.data(), y.data(), dy.data(), pass == "bwd" ? dx.data() : nullptr,
                     d->batch, ctx);
  };
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> t;
  for (int b = 0; b < 5; ++b) {
    const double t0 = dtrain_bench::cpu_seconds();
    for (int i = 0; i < reps / 5; ++i) run();
    t.push_back((dtrain_bench::cpu_seconds() - t0) / (reps / 5));
  }
  std::sort(t.begin(), t.end());
  const double ms = 1e3 * t[2];
  const double macs = static_cast<double>(d->batch * d->h * d->w * d->cin * d->cout * 9);
  const double flops = 2 * macs * (pass == "bwd" ? 2 : 1);
  const char* isa = "";
  const double peak = dtrain_bench::fma_peak_gflops(&isa);
  std::printf("%s %s (direct %s): %.4f ms, %.1f GFLOP/s, %.0f%% of the %s FMA peak %.1f\n", d->name,
              pass.c_str(), host::conv_isa_name(layer.direct_isa()), ms, flops / (ms * 1e-3) / 1e9,
              100 * flops / (ms * 1e-3) / 1e9 / peak, isa, peak);
  return 0;
}
