// SPDX-License-Identifier: BSD-3-Clause
// model_bench: whole models as a user writes them from the guide (dtrain::Sequential on its
// default policy, AdamW, GradientSync), forward + backward + all-reduce + optimizer, on 1 rank and
// on 2 ranks in the same run, with every layer kind's share of the step. Two models:
//   cnn        the Fashion-MNIST classifier: Input{1, 28, 28}, two blocks of Conv2d 3x3 (pad 1,
//              16 then 32 channels) + ReLU + MaxPool2d(2), Linear(1568, 128), ReLU,
//              Linear(128, 10); softmax cross-entropy, batch 64 per rank
//   surrogate  examples/20_insitu_surrogate's CNN on its 2-rank tile: Input{1, 40, 64},
//              Conv2d(1, 8, 3), Residual{ReLU, Conv2d(8, 8, 3), ReLU, Conv2d(8, 8, 3)},
//              Conv2d(8, 1, 3), all with periodic padding 1; MSE, batch 2 per rank
// benchmarks/compare/model_torch.py is the PyTorch counterpart (same models, optimizer, batches,
// the same figures); with libdnnl-dev the convolution layers are also timed in oneDNN.
//
//   OPENBLAS_NUM_THREADS=1 mpiexec.mpich -n 2 build/benchmarks/model_bench [--models cnn,surrogate]
//       [--steps 40] [--warmup 5] [--rounds 3] [--layer-reps 20] [--epochs 0]
//       [--data /usr/share/datasets/fashion-mnist]
//
// Throughput: in each round, rank 0 trains alone on a one-rank communicator while rank 1 sleeps
// in a polled barrier, then both ranks train on MPI_COMM_WORLD; samples/s per figure is the median
// over the rounds (the slowest rank's wall time of the timed steps). Data is synthetic and already
// in memory (8 batches per rank, cycled): the figure is the model's, not the loader's.
// Layers: on rank 0 alone, each layer of the model is built, configured and bound to buffers of
// its own and its forward and backward timed separately (median of --layer-reps, CPU time) on
// random inputs of the model's shapes; each kind's sum is printed with its share of the 1-rank
// step's CPU time (median over the rounds; CPU time, so that a loaded machine moves both alike),
// the 2x2 max pooling also through the per-element gather that devices run, as the baseline; the
// first layer's backward computes no input gradient, as in the model. The convolutions
// are printed with GFLOP/s (2 x multiply-adds, forward, input and weight gradients) against the
// measured FMA peak, and beside oneDNN's forward, backward-data and backward-weights primitives
// on the same shapes (formats chosen by oneDNN, reorders not timed: its best case; oneDNN has no
// periodic padding, so it pads with zeros there, the same work), and under every lowering and
// direct-kernel instruction set this CPU runs (the measurements behind ConvLayer's automatic
// choice).
// Accuracy (--epochs N > 0, cnn only): both ranks train N epochs on Fashion-MNIST (each rank its
// half of a permutation fixed by (seed, epoch)), then rank 0 prints the test accuracy.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/adamw.hpp>
#include <dtrain/transports/mpi.hpp>

#include "fma_peak.hpp"

#if defined(DTRAIN_BENCH_ONEDNN) && DTRAIN_BENCH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

using Entries = std::vector<dtrain::LayerEntry<float, dtrain::HostExec>>;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

struct Args {
  std::vector<std::string> models{"cnn", "surrogate"};
  int steps = 40, warmup = 5, rounds = 3, layer_reps = 20, epochs = 0;
  std::string data = "/usr/share/datasets/fashion-mnist";
};

struct ModelDef {
  std::string name;
  Entries layers;
  std::int64_t batch;
  bool classify;  // softmax cross-entropy on 10 classes, else MSE on the output grid
};

ModelDef make_model(const std::string& name) {
  using namespace dtrain;
  if (name == "cnn")
    return {name,
            {Input{1, 28, 28}, Conv2d(1, 16, 3).with_padding(1), Relu{}, MaxPool2d(2),
             Conv2d(16, 32, 3).with_padding(1), Relu{}, MaxPool2d(2), Linear(32 * 7 * 7, 128),
             Relu{}, Linear(128, 10)},
            64,
            true};
  if (name == "surrogate")
    return {name,
            {Input{1, 40, 64}, Conv2d(1, 8, 3).with_padding(1, dtrain::Padding::periodic),
             Residual{Relu{}, Conv2d(8, 8, 3).with_padding(1, dtrain::Padding::periodic), Relu{},
                      Conv2d(8, 8, 3).with_padding(1, dtrain::Padding::periodic)},
             Conv2d(8, 1, 3).with_padding(1, dtrain::Padding::periodic)},
            2,
            false};
  std::fprintf(stderr, "model_bench: unknown model %s (cnn, surrogate)\n", name.c_str());
  std::exit(2);
}

// Synthetic batches: inputs N(0, 1), labels uniform (cnn) or targets N(0, 1) (surrogate).
struct Data {
  std::vector<std::vector<float>> x, target;
  std::vector<std::vector<std::int32_t>> labels;
};

Data make_data(dtrain::BasicSequential<float>& m, const ModelDef& d, int rank) {
  Data data;
  dtrain::RngStream rng(7, static_cast<std::uint64_t>(rank));
  for (int b = 0; b < 8; ++b) {
    std::vector<float> x(static_cast<std::size_t>(d.batch * m.in_features()));
    for (auto& v : x) v = static_cast<float>(rng.normal());
    data.x.push_back(std::move(x));
    std::vector<std::int32_t> l(static_cast<std::size_t>(d.batch));
    for (auto& v : l) v = static_cast<std::int32_t>(rng.uniform_double() * 10) % 10;
    data.labels.push_back(std::move(l));
    std::vector<float> t(static_cast<std::size_t>(d.batch * m.out_features()));
    for (auto& v : t) v = static_cast<float>(rng.normal());
    data.target.push_back(std::move(t));
  }
  return data;
}

// One training step as the guide writes it.
template <class Sync>
double train_step(dtrain::BasicSequential<float>& m, dtrain::AdamW& opt, Sync& sync,
                  const ModelDef& d, const float* x, const std::int32_t* labels,
                  const float* target) {
  m.zero_grad();
  const double loss =
      d.classify ? m.forward_backward(x, labels, d.batch, dtrain::Loss::softmax_cross_entropy, sync)
                 : m.forward_backward(x, target, d.batch, dtrain::Loss::mse, sync);
  sync.wait();
  opt.step();
  return loss;
}

struct Rate {
  double samples_per_s = 0, cpu_ms_per_step = 0;  // CPU: this process, every thread
};

// samples/s of --steps timed steps on `comm` (all its ranks; the slowest rank's wall time), after
// --warmup steps, and this rank's CPU time per step.
Rate throughput(dtrain::Communicator<dtrain::MpiTransport>& comm, const ModelDef& d, const Args& a,
                MPI_Comm mpi) {
  dtrain::BasicSequential<float> m(d.layers);
  m.init(1);
  dtrain::AdamW opt(m, dtrain::Schedule::constant(1e-3));
  dtrain::GradientSync sync(comm, m.gradients(), 256 << 10);
  const Data data = make_data(m, d, comm.rank());
  double t0 = 0, c0 = 0;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup) {
      MPI_Barrier(mpi);
      t0 = seconds();
      c0 = dtrain_bench::cpu_seconds();
    }
    const std::size_t b = static_cast<std::size_t>(s) % data.x.size();
    train_step(m, opt, sync, d, data.x[b].data(), data.labels[b].data(), data.target[b].data());
  }
  const double cpu = dtrain_bench::cpu_seconds() - c0;
  double t = seconds() - t0, slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, mpi);
  return {static_cast<double>(a.steps) * static_cast<double>(d.batch * comm.size()) / slowest,
          1e3 * cpu / a.steps};
}

// ---- Layers one by one --------------------------------------------------------------------

struct LayerTime {
  std::string kind;
  double fwd_ms = 0, bwd_ms = 0, flops = 0;  // flops: convolutions only (forward + 2 gradients)
  dtrain::ConvGeometry conv;
  bool is_conv = false, first = false;
  double gather_ms = 0;  // 2x2 max pooling: the per-element gather's time on the same shapes
};

// Forward and backward of one layer alone on input samples `in` (CPU ms, median of `reps`).
LayerTime time_layer(const dtrain::LayerEntry<float, dtrain::HostExec>& entry, dtrain::Shape& shape,
                     std::int64_t batch, bool first, int reps) {
  dtrain::HostExec& exec = dtrain::HostExec::instance();
  dtrain::RngStream rng(3, 0);
  auto layer = entry.build();
  const dtrain::Shape in = shape;
  shape = layer->setup(in);
  const auto n_in = static_cast<std::size_t>(dtrain::element_count(in)) * batch;
  const auto n_out = static_cast<std::size_t>(dtrain::element_count(shape)) * batch;
  std::vector<float> params(std::max<std::size_t>(1, layer->param_count())), grads(params.size()),
      x(n_in), y(n_out), dy(n_out), dx(n_in);
  layer->bind(exec, params.data(), grads.data());
  layer->init(1, 0, params.data());
  layer->reserve(batch);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  for (auto& v : dy) v = static_cast<float>(rng.normal());
  const dtrain::PassContext ctx{};
  const auto s = exec.compute_stream();
  std::vector<double> f, b;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = dtrain_bench::cpu_seconds();
    layer->forward(s, x.data(), y.data(), batch, ctx);
    const double t1 = dtrain_bench::cpu_seconds();
    layer->backward(s, x.data(), y.data(), dy.data(), first ? nullptr : dx.data(), batch, ctx);
    const double t2 = dtrain_bench::cpu_seconds();
    if (r >= 2) {
      f.push_back(t1 - t0);
      b.push_back(t2 - t1);
    }
  }
  LayerTime t;
  t.kind = layer->kind();
  t.fwd_ms = 1e3 * median(f);
  t.bwd_ms = 1e3 * median(b);
  t.first = first;
  if (const auto* c =
          dynamic_cast<const dtrain::ConvLayer<float, dtrain::HostExec>*>(layer.get())) {
    t.is_conv = true;
    t.conv = c->geometry();
    const auto& g = t.conv;
    const double macs = static_cast<double>(batch * g.out_cells() * g.out_channels * g.in_channels *
                                            g.kernel_cells());
    t.flops = 2.0 * macs * (first ? 2.0 : 3.0);
    const dtrain::ConvLowering lw = c->lowering();
    t.kind += lw == dtrain::ConvLowering::direct
                  ? std::string(" (direct ") + dtrain::host::conv_isa_name(c->direct_isa()) + ")"
              : lw == dtrain::ConvLowering::shifted ? " (shifted)"
                                                    : " (im2col)";
  }
  return t;
}

// 2x2 max pooling (stride 2) of samples `in` [channels, h, w] through the per-element gather
// functors that devices run (and that host policies ran before the loops over windows), as host
// loops: CPU ms of forward and backward, the baseline of the host pooling.
std::pair<double, double> gather_pool_ms(const dtrain::Shape& in, std::int64_t batch, int reps) {
  dtrain::GridGeometry g;
  g.channels = in[0];
  g.in[1] = in[1], g.in[2] = in[2];
  g.window[1] = g.window[2] = g.stride[1] = g.stride[2] = 2;
  g.out[1] = (in[1] - 2) / 2 + 1, g.out[2] = (in[2] - 2) / 2 + 1;
  const std::int64_t nx = batch * g.channels * g.in_cells(),
                     ny = batch * g.channels * g.out_cells();
  std::vector<float> x(static_cast<std::size_t>(nx)), y(static_cast<std::size_t>(ny)), dy(y.size()),
      dx(x.size());
  dtrain::RngStream rng(5, 0);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  for (auto& v : dy) v = static_cast<float>(rng.normal());
  const dtrain::detail::PoolForward<float> fwd{g, true, x.data(), y.data()};
  const dtrain::detail::PoolBackward<float> bwd{g, true, x.data(), dy.data(), dx.data()};
  std::vector<double> f, b;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = dtrain_bench::cpu_seconds();
    for (std::int64_t i = 0; i < ny; ++i) fwd(i);
    const double t1 = dtrain_bench::cpu_seconds();
    for (std::int64_t i = 0; i < nx; ++i) bwd(i);
    const double t2 = dtrain_bench::cpu_seconds();
    if (r >= 2) {
      f.push_back(t1 - t0);
      b.push_back(t2 - t1);
    }
  }
  return {1e3 * median(f), 1e3 * median(b)};
}

std::vector<LayerTime> time_layers(const ModelDef& d, int reps) {
  dtrain::Shape shape = d.layers.front().input()->shape;
  std::vector<LayerTime> out;
  for (std::size_t i = 1; i < d.layers.size(); ++i) {
    const dtrain::Shape in = shape;
    out.push_back(time_layer(d.layers[i], shape, d.batch, i == 1, reps));
    if (out.back().kind == "maxpool2d") {
      const auto [f, b] = gather_pool_ms(in, d.batch, reps);
      out.back().gather_ms = f + b;
    }
  }
  return out;
}

// One convolution of the model under every lowering this machine runs (the data behind the
// automatic choice): CPU ms of forward + backward, or a negative time where it does not apply.
void print_lowerings(const LayerTime& l, std::int64_t batch, int reps) {
  using dtrain::ConvLowering;
  using dtrain::host::ConvIsa;
  const auto& g = l.conv;
  auto spec = [&](ConvLowering how) {
    dtrain::Conv c = dtrain::Conv2d(g.in_channels, g.out_channels, g.kernel[2]);
    if (g.periodic)
      c.with_padding(g.pad[2], dtrain::Padding::periodic);
    else
      c.with_padding(g.pad[2]);
    return c.with_lowering(how);
  };
  auto ms = [&](ConvLowering how) {
    dtrain::Shape shape{g.in_channels, g.in[1], g.in[2]};
    const LayerTime t = time_layer(spec(how), shape, batch, l.first, reps);
    return t.fwd_ms + t.bwd_ms;
  };
  std::printf("    lowerings (CPU ms):");
  const ConvIsa was = dtrain::host::conv_isa();
  for (const ConvIsa isa : {ConvIsa::avx512, ConvIsa::avx2, ConvIsa::portable}) {
    if (!dtrain::host::conv_isa_supported(isa)) continue;
    dtrain::host::force_conv_isa(isa);
    std::printf(" direct-%s %.3f", dtrain::host::conv_isa_name(isa), ms(ConvLowering::direct));
  }
  dtrain::host::force_conv_isa(was);
  std::printf(" im2col %.3f shifted %.3f\n", ms(ConvLowering::im2col), ms(ConvLowering::shifted));
}

#if defined(DTRAIN_BENCH_ONEDNN) && DTRAIN_BENCH_ONEDNN
// oneDNN's convolution primitives on one layer's shape: forward (with bias), backward data
// (unless the first layer), backward weights (with bias); formats chosen by oneDNN. CPU ms.
double onednn_conv_ms(const dtrain::ConvGeometry& g, std::int64_t batch, bool first, int reps) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  const memory::dims src{batch, g.in_channels, g.in[1], g.in[2]},
      wei{g.out_channels, g.in_channels, g.kernel[1], g.kernel[2]}, bias{g.out_channels},
      dst{batch, g.out_channels, g.out[1], g.out[2]}, strides{1, 1}, pad{g.pad[1], g.pad[2]};
  auto any = [](const memory::dims& d) { return memory::desc(d, dt::f32, tag::any); };
  const auto fwd_pd = convolution_forward::primitive_desc(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                any(src), any(wei), any(bias), any(dst), strides, pad, pad),
      eng);
  const auto bwd_d_pd = convolution_backward_data::primitive_desc(
      convolution_backward_data::desc(algorithm::convolution_direct, any(src), any(wei), any(dst),
                                      strides, pad, pad),
      eng, fwd_pd);
  const auto bwd_w_pd = convolution_backward_weights::primitive_desc(
      convolution_backward_weights::desc(algorithm::convolution_direct, any(src), any(wei),
                                         any(bias), any(dst), strides, pad, pad),
      eng, fwd_pd);
  auto filled = [&](const memory::desc& md) {
    memory m(md, eng);
    float* p = static_cast<float*>(m.get_data_handle());
    for (std::size_t i = 0; i < md.get_size() / sizeof(float); ++i) p[i] = 0.01f * float(i % 97);
    return m;
  };
  memory x = filled(fwd_pd.src_desc()), w = filled(fwd_pd.weights_desc()),
         b = filled(fwd_pd.bias_desc()), y = filled(fwd_pd.dst_desc()),
         dy = filled(bwd_w_pd.diff_dst_desc()), dx = filled(bwd_d_pd.diff_src_desc()),
         dw = filled(bwd_w_pd.diff_weights_desc()), db = filled(bwd_w_pd.diff_bias_desc()),
         dy_d = filled(bwd_d_pd.diff_dst_desc()), w_d = filled(bwd_d_pd.weights_desc()),
         x_w = filled(bwd_w_pd.src_desc());
  convolution_forward fwd(fwd_pd);
  convolution_backward_data bwd_d(bwd_d_pd);
  convolution_backward_weights bwd_w(bwd_w_pd);
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = dtrain_bench::cpu_seconds();
    fwd.execute(st,
                {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, y}});
    if (!first)
      bwd_d.execute(st,
                    {{DNNL_ARG_DIFF_DST, dy_d}, {DNNL_ARG_WEIGHTS, w_d}, {DNNL_ARG_DIFF_SRC, dx}});
    bwd_w.execute(st, {{DNNL_ARG_SRC, x_w},
                       {DNNL_ARG_DIFF_DST, dy},
                       {DNNL_ARG_DIFF_WEIGHTS, dw},
                       {DNNL_ARG_DIFF_BIAS, db}});
    st.wait();
    if (r >= 2) t.push_back(dtrain_bench::cpu_seconds() - t0);
  }
  return 1e3 * median(t);
}
#endif

void print_layers(const ModelDef& d, const std::vector<LayerTime>& layers, double step_ms,
                  double peak, int reps) {
  std::printf("# %s, batch %lld, 1 rank: layers one by one (CPU ms, median of the reps)\n",
              d.name.c_str(), static_cast<long long>(d.batch));
  std::printf("# %-26s %9s %9s %9s %8s\n", "layer", "fwd ms", "bwd ms", "total", "of step");
  std::vector<std::pair<std::string, double>> kinds;
  double sum = 0;
  for (const auto& l : layers) {
    const double t = l.fwd_ms + l.bwd_ms;
    sum += t;
    std::printf("  %-26s %9.3f %9.3f %9.3f %7.1f%%", l.kind.c_str(), l.fwd_ms, l.bwd_ms, t,
                100 * t / step_ms);
    if (l.gather_ms > 0)
      std::printf("  (per-element gather: %.3f ms, %.1fx the loops' time)", l.gather_ms,
                  l.gather_ms / t);
    std::printf("\n");
    std::string k = l.kind.substr(0, l.kind.find(' '));
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](auto& p) { return p.first == k; });
    if (it == kinds.end())
      kinds.emplace_back(k, t);
    else
      it->second += t;
  }
  std::printf("# by kind (share of the 1-rank step's %.3f CPU ms):", step_ms);
  for (const auto& k : kinds) std::printf(" %s %.1f%%", k.first.c_str(), 100 * k.second / step_ms);
  std::printf(" rest (loss, staging, sync, optimizer) %.1f%%\n", 100 * (step_ms - sum) / step_ms);
  for (const auto& l : layers) {
    if (!l.is_conv) continue;
    const double ms = l.fwd_ms + l.bwd_ms, gf = l.flops / (ms * 1e-3) / 1e9;
    std::printf("  conv %lld->%lld %lldx%lld: dtrain %.3f ms, %.1f GFLOP/s (%.0f%% of peak)",
                static_cast<long long>(l.conv.in_channels),
                static_cast<long long>(l.conv.out_channels), static_cast<long long>(l.conv.in[1]),
                static_cast<long long>(l.conv.in[2]), ms, gf, 100 * gf / peak);
#if defined(DTRAIN_BENCH_ONEDNN) && DTRAIN_BENCH_ONEDNN
    const double dn = onednn_conv_ms(l.conv, d.batch, l.first, reps);
    std::printf(", oneDNN %.3f ms (dtrain %.2fx its speed), %.1f GFLOP/s", dn, dn / ms,
                l.flops / (dn * 1e-3) / 1e9);
#endif
    std::printf("\n");
    print_lowerings(l, d.batch, reps);
  }
}

// ---- Accuracy ---------------------------------------------------------------------------

double train_epochs(dtrain::Communicator<dtrain::MpiTransport>& comm, const ModelDef& d,
                    const Args& a) {
  const std::string dir = a.data + "/";
  dtrain::IdxDataset train(dir + "train-images-idx3-ubyte.gz", dir + "train-labels-idx1-ubyte.gz");
  dtrain::IdxDataset test(dir + "t10k-images-idx3-ubyte.gz", dir + "t10k-labels-idx1-ubyte.gz");
  dtrain::BasicSequential<float> m(d.layers);
  m.init(1);
  dtrain::AdamW opt(m, dtrain::Schedule::constant(1e-3));
  dtrain::GradientSync sync(comm, m.gradients(), 256 << 10);
  const std::size_t n = train.size(), p = static_cast<std::size_t>(comm.size());
  const std::size_t per_rank = n / p, steps = per_rank / static_cast<std::size_t>(d.batch);
  const std::size_t elems = 28 * 28;
  std::vector<float> x(static_cast<std::size_t>(d.batch) * elems);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(d.batch));
  std::vector<std::size_t> order(n);
  for (int e = 0; e < a.epochs; ++e) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(1000 + static_cast<unsigned>(e)));
    for (std::size_t s = 0; s < steps; ++s) {
      for (std::size_t r = 0; r < static_cast<std::size_t>(d.batch); ++r) {
        const std::size_t i = order[static_cast<std::size_t>(comm.rank()) * per_rank +
                                    s * static_cast<std::size_t>(d.batch) + r];
        const std::uint8_t* img = train.image(i);
        for (std::size_t k = 0; k < elems; ++k) x[r * elems + k] = img[k] / 255.0f;
        labels[r] = train.label(i);
      }
      train_step(m, opt, sync, d, x.data(), labels.data(), nullptr);
    }
  }
  std::size_t right = 0;
  std::vector<float> tx(elems);
  std::int32_t cls = 0;
  for (std::size_t i = 0; i < test.size(); ++i) {
    for (std::size_t k = 0; k < elems; ++k) tx[k] = test.image(i)[k] / 255.0f;
    m.predict(tx.data(), 1, &cls);
    right += cls == test.label(i);
  }
  return static_cast<double>(right) / static_cast<double>(test.size());
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "model_bench: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (k == "--models") {
      a.models.clear();
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        a.models.push_back(v.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (k == "--steps") {
      a.steps = std::atoi(v.c_str());
    } else if (k == "--warmup") {
      a.warmup = std::atoi(v.c_str());
    } else if (k == "--rounds") {
      a.rounds = std::atoi(v.c_str());
    } else if (k == "--layer-reps") {
      a.layer_reps = std::atoi(v.c_str());
    } else if (k == "--epochs") {
      a.epochs = std::atoi(v.c_str());
    } else if (k == "--data") {
      a.data = v;
    } else {
      std::fprintf(stderr, "model_bench: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.steps < 1 || a.warmup < 0 || a.rounds < 1 || a.layer_reps < 1 || a.epochs < 0) {
    std::fprintf(stderr, "model_bench: --steps, --rounds, --layer-reps must be >= 1\n");
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const Args a = parse(argc, argv);
  const char* isa = "none";
  double peak = 0;
  if (rank == 0) {
    peak = dtrain_bench::fma_peak_gflops(&isa);
    std::printf("# model_bench: %d ranks, FMA peak %.1f GFLOP/s per core (%s), default GEMM %s\n",
                world, peak, isa,
                dtrain::host::linked_gemm<float>().load() ? "CBLAS (registered)" : "blocked");
  }
  {
    MPI_Comm solo = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
    dtrain::MpiTransport world_transport(MPI_COMM_WORLD);
    dtrain::Communicator world_comm(world_transport);
    for (const std::string& name : a.models) {
      const ModelDef d = make_model(name);
      std::vector<double> one, all, one_cpu;
      for (int r = 0; r < a.rounds; ++r) {
        if (rank == 0) {
          dtrain::MpiTransport t(solo);
          dtrain::Communicator c(t);
          const Rate rate = throughput(c, d, a, solo);
          one.push_back(rate.samples_per_s);
          one_cpu.push_back(rate.cpu_ms_per_step);
        }
        MPI_Request req;
        MPI_Ibarrier(MPI_COMM_WORLD, &req);
        for (int done = 0; !done;) {
          MPI_Test(&req, &done, MPI_STATUS_IGNORE);
          if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (world > 1) all.push_back(throughput(world_comm, d, a, MPI_COMM_WORLD).samples_per_s);
      }
      if (rank == 0) {
        const double s1 = median(one), sp = median(all);
        std::printf("%s batch %lld/rank: 1 rank %.1f samples/s (rounds", name.c_str(),
                    static_cast<long long>(d.batch), s1);
        for (double v : one) std::printf(" %.1f", v);
        std::printf(")");
        if (world > 1) {
          std::printf(", %d ranks %.1f samples/s (rounds", world, sp);
          for (double v : all) std::printf(" %.1f", v);
          std::printf("), scaling efficiency %.3f", sp / (world * s1));
        }
        std::printf("\n");
        const auto layers = time_layers(d, a.layer_reps);
        print_layers(d, layers, median(one_cpu), peak, a.layer_reps);
        std::fflush(stdout);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (a.epochs > 0 && d.classify) {
        const double t0 = seconds();
        const double acc = train_epochs(world_comm, d, a);
        if (rank == 0)
          std::printf("%s: test accuracy %.4f after %d epochs on %d ranks (%.1f s)\n", name.c_str(),
                      acc, a.epochs, world, seconds() - t0);
      }
    }
    if (solo != MPI_COMM_NULL) MPI_Comm_free(&solo);
  }
  MPI_Finalize();
  return 0;
}
