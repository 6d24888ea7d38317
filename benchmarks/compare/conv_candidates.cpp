// SPDX-License-Identifier: BSD-3-Clause
// conv_candidates: the host convolution candidates side by side on conv_bench's stack (Input{1,
// 64, 64}, Conv2d(1, 32, 3).with_padding(1), ReLU, Conv2d(32, 32, 3).with_padding(1), ReLU,
// Conv2d(32, 1, 3).with_padding(1), MSE, batch 16, float32, one thread). A step: forward, weight,
// bias and input gradients (none for the first layer's input) with (a) dtrain's Sequential on
// HostBlasExec (im2col / shifted views + OpenBLAS), (b) the direct blocked 3x3 kernel below, (c)
// oneDNN 2.6 (libdnnl-dev): convolution forward (ReLU fused), backward data, backward weights,
// eltwise ReLU backward, formats chosen by oneDNN (format_tag::any). (c)'s timed step includes the
// reorders a model would run every step (printed): nchw input in, output to nchw for the loss and
// its gradient back, parameters kept in the forward's weight format and reordered where a backward
// primitive wants another. Then the 32 -> 32 layer alone (forward and the three gradients, no ReLU,
// data in each one's layout). (b) and (c) are checked against (a) first: max |diff| / max |ref|
// below 1e-4, else exit 1. Times: process CPU time per step, median of `steps` steps per round,
// candidates interleaved round by round, median and range over rounds; GFLOP/s count
// conv_bench's 3.85 GFLOP per step. Build (from the repository root; libopenblas-dev, libdnnl-dev):
//   g++ -std=c++17 -O3 -march=native -DNDEBUG -DDTRAIN_HAVE_CBLAS=1 -Iinclude -Ikernels
//     -I/usr/include/x86_64-linux-gnu/openblas-pthread benchmarks/compare/conv_candidates.cpp
//     -o /tmp/conv_candidates -lopenblas -ldnnl -lpthread
// Run: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /tmp/conv_candidates [rounds=5] [steps=10]
#include <dirent.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/kernels/host/blas_exec.hpp>
#include <dtrain/model/model.hpp>
#include <oneapi/dnnl/dnnl.hpp>

namespace {
constexpr int kN = 16, kH = 64, kW = 64, kC = 32;
const int kIn[3] = {1, kC, kC}, kOut[3] = {kC, kC, 1};
using Vec = std::vector<float>;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
// One core's FMA throughput with L-wide vectors (as the build's ISA allows): 12 independent chains
// (12 + 2 registers: no spills even with 16 vector registers), per second of CPU time.
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
template <class v, int L = sizeof(v) / 4>
double fma_peak() {
  v acc[12], a = v{} + 0.999999f, b = v{} + 1e-7f;
  for (int i = 0; i < 12; ++i) acc[i] = v{} + 1e-3f * float(i);
  const long iters = 20'000'000;
  const double t0 = cpu_seconds();
  for (long k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * a + b;
  const double t = cpu_seconds() - t0;
  for (int i = 1; i < 12; ++i) acc[0] += acc[i];
  if (acc[0][0] == 12345.0f) std::printf(" ");
  return 2.0 * L * 12 * double(iters) / t / 1e9;
}

// ---- (b) the direct kernel. Activations and their gradients are kept padded: [batch][channel]
// [kH + 2 rows][kPW], a row's pixels at columns kLeft.. (64-byte aligned), zeros before them and
// the next row's zero columns after them, so every 3x3 window is in bounds.
#if defined(__AVX512F__)
constexpr int VL = 16, CB = 6;  // 6 output channels x 4 vectors of 16 pixels: 24 accumulators
#else
constexpr int VL = 8, CB = 2;  // 16 registers: 2 x 4 accumulators of 8 pixels (1 x 9 for dw)
#endif
constexpr int NV = 4, WCB = VL == 16 ? 3 : 1, kLeft = 16, kPW = kLeft + kW, kPlane = (kH + 2) * kPW;
static_assert(kW % (NV * VL) == 0, "rows split into whole tiles");
using vf = float __attribute__((vector_size(4 * VL)));
inline vf ld(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void st(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline std::size_t at(int c, int h, int w) {
  return std::size_t(c) * kPlane + (h + 1) * kPW + kLeft + w;
}
struct Pad {  // a zeroed, 64-byte aligned padded tensor of `channels` planes (+ kLeft zeros)
  Vec v;
  explicit Pad(std::size_t channels = 0) : v(channels * kPlane + kLeft + 16, 0.0f) {}
  float* data() {
    return v.data() + (64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64 / 4;
  }
  float& operator[](std::size_t i) { return data()[i]; }
  void load(const float* x, int planes) {  // from [planes][kH][kW]
    for (int c = 0; c < planes; ++c)
      for (int h = 0; h < kH; ++h)
        std::memcpy(&(*this)[at(c, h, 0)], x + (c * kH + h) * kW, 4 * kW);
  }
};

// Output channels co0..co0+C-1 of row h, pixels w0..w0+NV*VL-1: the sum over input channels and
// taps of a packed weight wk[(ci * 9 + tap) * cout + co] times an input row shifted by the tap.
template <int C>
void tile(const float* x, int cin, int cout, const float* wk, int co0, int h, int w0,
          const float* bias, const float* mask, bool relu, float* y) {
  vf acc[C][NV];
  for (int c = 0; c < C; ++c)
    for (int v = 0; v < NV; ++v) acc[c][v] = (bias ? bias[co0 + c] : 0.0f) - vf{};
  for (int ci = 0; ci < cin; ++ci)
    for (int kh = 0; kh < 3; ++kh) {
      const float* r = x + std::size_t(ci) * kPlane + (h + kh) * kPW + kLeft - 1 + w0;
      const float* wr = wk + std::size_t(ci * 9 + kh * 3) * cout + co0;
      for (int kw = 0; kw < 3; ++kw) {
        vf xv[NV];
        for (int v = 0; v < NV; ++v) xv[v] = ld(r + kw + v * VL);
        for (int c = 0; c < C; ++c) {
          const vf b = wr[kw * cout + c] - vf{};  // a broadcast (s - 0 == s, so no add)
          for (int v = 0; v < NV; ++v) acc[c][v] += b * xv[v];
        }
      }
    }
  for (int c = 0; c < C; ++c)
    for (int v = 0; v < NV; ++v) {
      const std::size_t o = at(co0 + c, h, w0 + v * VL);
      vf r = acc[c][v];
      if (relu) r = r > vf{} ? r : vf{};
      if (mask) r = ld(mask + o) > vf{} ? r : vf{};  // the ReLU backward of the layer below
      st(y + o, r);
    }
}
// y = conv(x) + bias over the batch; with x = dy, cin = the layer's out channels and flipped,
// transposed weights, the input gradient (times mask > 0).
void conv3x3(const float* x, float* y, int cin, int cout, const float* wk, const float* bias,
             const float* mask, bool relu) {
  for (int s = 0; s < kN; ++s) {
    const float *xs = x + std::size_t(s) * cin * kPlane,
                *ms = mask ? mask + std::size_t(s) * cout * kPlane : nullptr;
    float* ys = y + std::size_t(s) * cout * kPlane;
    for (int h = 0; h < kH; ++h)
      for (int w0 = 0; w0 < kW; w0 += NV * VL) {
        int co = 0;
        for (; co + CB <= cout; co += CB)
          tile<CB>(xs, cin, cout, wk, co, h, w0, bias, ms, relu, ys);
        for (; co + 2 <= cout; co += 2) tile<2>(xs, cin, cout, wk, co, h, w0, bias, ms, relu, ys);
        for (; co < cout; ++co) tile<1>(xs, cin, cout, wk, co, h, w0, bias, ms, relu, ys);
      }
  }
}
// dw[co][ci][tap] += the sum over one sample's pixels of dy[co] times x[ci] shifted by the tap.
template <int C>
void wgrad_block(const float* xs, const float* dys, int cin, int ci, int co0, float* dw) {
  vf acc[C][9] = {};
  for (int h = 0; h < kH; ++h)
    for (int w0 = 0; w0 < kW; w0 += VL) {
      vf d[C];
      for (int c = 0; c < C; ++c) d[c] = ld(dys + at(co0 + c, h, w0));
      for (int kh = 0; kh < 3; ++kh)
        for (int kw = 0; kw < 3; ++kw) {
          vf xv = ld(xs + std::size_t(ci) * kPlane + (h + kh) * kPW + kLeft - 1 + w0 + kw);
          asm("" : "+v"(xv));  // one load per tap: GCC would fold it into each of the C FMAs
          for (int c = 0; c < C; ++c) acc[c][kh * 3 + kw] += d[c] * xv;
        }
    }
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < 9; ++t) {
      float sum = 0;
      for (int j = 0; j < VL; ++j) sum += acc[c][t][j];
      dw[(std::size_t(co0 + c) * cin + ci) * 9 + t] += sum;
    }
}
void wgrad(const float* x, const float* dy, int cin, int cout, float* dw, float* db) {
  for (int s = 0; s < kN; ++s) {
    const float *xs = x + std::size_t(s) * cin * kPlane, *dys = dy + std::size_t(s) * cout * kPlane;
    int co = 0;
    for (; co + WCB <= cout; co += WCB)
      for (int ci = 0; ci < cin; ++ci) wgrad_block<WCB>(xs, dys, cin, ci, co, dw);
    for (; co < cout; ++co)
      for (int ci = 0; ci < cin; ++ci) wgrad_block<1>(xs, dys, cin, ci, co, dw);
    for (int c = 0; c < cout; ++c) {
      vf acc = {};
      for (int h = 0; h < kH; ++h)
        for (int w = 0; w < kW; w += VL) acc += ld(dys + at(c, h, w));
      for (int j = 0; j < VL; ++j) db[c] += acc[j];
    }
  }
}
// OIHW weights packed for the forward (wk[ci][tap][co]) or the input gradient (wk[co][8 -
// tap][ci]).
void pack(const float* w, int cin, int cout, bool backward, float* wk) {
  for (int co = 0; co < cout; ++co)
    for (int ci = 0; ci < cin; ++ci)
      for (int t = 0; t < 9; ++t)
        wk[backward ? (std::size_t(co) * 9 + 8 - t) * cin + ci
                    : (std::size_t(ci) * 9 + t) * cout + co] =
            w[(std::size_t(co) * cin + ci) * 9 + t];
}
struct Direct {  // the stack: weights OIHW, activations and gradients padded
  Vec w[3], b[3], dw[3], db[3], wk[3];
  Pad act[4], grad[4];  // act[0]: the input, act[3]: the output
  Direct() {
    for (int l = 0; l < 4; ++l) act[l] = grad[l] = Pad(std::size_t(kN) * (l < 3 ? kIn[l] : 1));
    for (int l = 0; l < 3; ++l)
      w[l] = dw[l] = wk[l] = Vec(std::size_t(kIn[l]) * kOut[l] * 9), b[l] = db[l] = Vec(kOut[l]);
  }
  void step(const float* x, const float* target) {
    act[0].load(x, kN);
    for (int l = 0; l < 3; ++l) {
      pack(w[l].data(), kIn[l], kOut[l], false, wk[l].data());
      conv3x3(act[l].data(), act[l + 1].data(), kIn[l], kOut[l], wk[l].data(), b[l].data(), nullptr,
              l < 2);
    }
    const float scale = 2.0f / (kN * kH * kW);  // MSE: d/dy mean((y - t)^2)
    for (int s = 0; s < kN; ++s)
      for (int h = 0; h < kH; ++h)
        for (int j = 0; j < kW; ++j)
          grad[3][at(s, h, j)] = scale * (act[3][at(s, h, j)] - target[(s * kH + h) * kW + j]);
    for (int l = 2; l >= 0; --l) {
      std::fill(dw[l].begin(), dw[l].end(), 0.0f), std::fill(db[l].begin(), db[l].end(), 0.0f);
      wgrad(act[l].data(), grad[l + 1].data(), kIn[l], kOut[l], dw[l].data(), db[l].data());
      if (l == 0) break;
      pack(w[l].data(), kIn[l], kOut[l], true, wk[l].data());
      conv3x3(grad[l + 1].data(), grad[l].data(), kOut[l], kIn[l], wk[l].data(), nullptr,
              act[l].data(), false);
    }
  }
};

// ---- (c) oneDNN: a chain of convolutions, ReLU fused into the forward where asked.
using namespace dnnl;
using tag = memory::format_tag;
memory::desc md(const memory::dims& d, tag t) { return {d, memory::data_type::f32, t}; }
std::string fmt(const memory::desc& d) {  // "abcd" plus inner blocks, e.g. "abcd:16b" (nChw16c)
  const auto& b = d.data.format_desc.blocking;
  std::string s = "abcd";
  s.resize(std::size_t(d.data.ndims));
  std::sort(s.begin(), s.end(),
            [&](char x, char y) { return b.strides[x - 'a'] > b.strides[y - 'a']; });
  for (int i = 0; i < b.inner_nblks; ++i)
    s += (i ? "" : ":") + std::to_string(b.inner_blks[i]) + char('a' + b.inner_idxs[i]);
  return s;
}
struct Net {
  using Op = std::pair<primitive, std::unordered_map<int, memory>>;
  struct Conv {
    int cin, cout;
    bool relu;
  };
  engine eng{engine::kind::cpu, 0};
  stream strm{eng};
  std::vector<Op> fwd, bwd;
  std::vector<memory> w, b, dw, db, src, dst;  // w, dw in the forward's weight format
  memory input, out, dy;  // nchw with user_io, else in the convolutions' formats
  std::string log;        // implementations and per-step reorders
  memory to(std::vector<Op>& ops, const memory& m, const memory::desc& d, const char* what) {
    if (m.get_desc() == d) return m;
    memory r(d, eng);
    ops.push_back({reorder(m, r), {{DNNL_ARG_FROM, m}, {DNNL_ARG_TO, r}}});
    log += std::string("  per-step reorder of ") + what + " " + fmt(m.get_desc()) + " -> " +
           fmt(d) + "\n";
    return r;
  }
  // data_grad_first: the input gradient of the first layer too.
  Net(const std::vector<Conv>& layers, bool user_io, bool data_grad_first) {
    const memory::dims st{1, 1}, pad{1, 1};
    std::vector<convolution_forward::primitive_desc> fpd;
    memory cur;
    for (const Conv& c : layers) {
      const memory::dims sd{kN, c.cin, kH, kW}, wd{c.cout, c.cin, 3, 3}, dd{kN, c.cout, kH, kW};
      post_ops po;
      if (c.relu) po.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      primitive_attr attr;
      attr.set_post_ops(po);
      fpd.emplace_back(
          convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                    md(sd, tag::any), md(wd, tag::any), md({c.cout}, tag::x),
                                    md(dd, tag::any), st, pad, pad),
          attr, eng);
      if (!cur) cur = input = memory(user_io ? md(sd, tag::nchw) : fpd.back().src_desc(), eng);
      src.push_back(to(fwd, cur, fpd.back().src_desc(), "activation"));
      w.emplace_back(fpd.back().weights_desc(), eng), b.emplace_back(md({c.cout}, tag::x), eng);
      dst.emplace_back(fpd.back().dst_desc(), eng), cur = dst.back();
      fwd.push_back({convolution_forward(fpd.back()),
                     {{DNNL_ARG_SRC, src.back()},
                      {DNNL_ARG_WEIGHTS, w.back()},
                      {DNNL_ARG_BIAS, b.back()},
                      {DNNL_ARG_DST, cur}}});
      log += "  fwd " + std::to_string(c.cin) + "->" + std::to_string(c.cout) + " " +
             fpd.back().impl_info_str() + " src " + fmt(src.back().get_desc()) + " weights " +
             fmt(w.back().get_desc()) + " dst " + fmt(cur.get_desc()) + "\n";
    }
    const memory::desc od = md({kN, layers.back().cout, kH, kW}, tag::nchw);
    out = user_io ? to(fwd, cur, od, "output") : cur;
    memory g = dy = memory(user_io ? od : cur.get_desc(), eng);  // the current output's gradient
    dw.resize(layers.size()), db.resize(layers.size());
    for (int l = int(layers.size()) - 1; l >= 0; --l) {
      const memory::dims wd{layers[l].cout, layers[l].cin, 3, 3};
      const memory::desc smd = src[l].get_desc(), dmd = dst[l].get_desc();
      g = to(bwd, g, dmd, "output gradient");
      if (layers[l].relu) {
        const algorithm a = algorithm::eltwise_relu_use_dst_for_bwd;
        eltwise_forward::primitive_desc hint({prop_kind::forward_training, a, dmd, 0.0f}, eng);
        bwd.push_back({eltwise_backward({{a, dmd, dmd, 0.0f}, eng, hint}),
                       {{DNNL_ARG_DST, dst[l]}, {DNNL_ARG_DIFF_DST, g}, {DNNL_ARG_DIFF_SRC, g}}});
      }
      convolution_backward_weights::primitive_desc pw(
          {algorithm::convolution_direct, smd, md(wd, tag::any), md({wd[0]}, tag::x), dmd, st, pad,
           pad},
          eng, fpd[l]);
      memory dwl(pw.diff_weights_desc(), eng);
      db[l] = memory(md({wd[0]}, tag::x), eng);
      bwd.push_back({convolution_backward_weights(pw),
                     {{DNNL_ARG_SRC, src[l]},
                      {DNNL_ARG_DIFF_DST, g},
                      {DNNL_ARG_DIFF_WEIGHTS, dwl},
                      {DNNL_ARG_DIFF_BIAS, db[l]}}});
      dw[l] = to(bwd, dwl, w[l].get_desc(), "weight gradient");
      log += std::string("  bwd_w ") + pw.impl_info_str() + " diff_weights " + fmt(dwl.get_desc()) +
             "\n";
      if (l == 0 && !data_grad_first) break;
      convolution_backward_data::primitive_desc pd(
          {algorithm::convolution_direct, smd, md(wd, tag::any), dmd, st, pad, pad}, eng, fpd[l]);
      memory wb = to(bwd, w[l], pd.weights_desc(), "weights"), ds(smd, eng);
      bwd.push_back({convolution_backward_data(pd),
                     {{DNNL_ARG_DIFF_DST, g}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_DIFF_SRC, ds}}});
      log += std::string("  bwd_d ") + pd.impl_info_str() + " weights " + fmt(wb.get_desc()) + "\n";
      g = ds;
    }
  }
  void run(std::vector<Op>& ops) {
    for (auto& o : ops) o.first.execute(strm, o.second);
    strm.wait();
  }
  void copy(memory from, memory to) {  // untimed
    reorder(from, to).execute(strm, from, to), strm.wait();
  }
  memory user(const float* p, const memory::dims& d, tag t) {
    return memory(md(d, t), eng, const_cast<float*>(p));
  }
};

double max_rel(const float* a, const float* b, std::size_t n) {  // max |a - b| / max |a|
  double d = 0, m = 0;
  for (std::size_t i = 0; i < n; ++i)
    d = std::max(d, double(std::fabs(a[i] - b[i]))), m = std::max(m, double(std::fabs(a[i])));
  return m > 0 ? d / m : d;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
int threads_in_process() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5, steps = argc > 2 ? std::atoi(argv[2]) : 10;
  dtrain::blas::apply_threads(1);
  dtrain::HostBlasExec exec;  // (a), built as conv_bench builds it
  dtrain::BasicSequential<float, dtrain::HostBlasExec> model(
      {dtrain::Input{1, kH, kW}, dtrain::Conv2d(1, kC, 3).with_padding(1), dtrain::Relu{},
       dtrain::Conv2d(kC, kC, 3).with_padding(1), dtrain::Relu{},
       dtrain::Conv2d(kC, 1, 3).with_padding(1)},
      exec);
  model.init(1);
  dtrain::RngStream rng(2, 0);
  const std::size_t pixels = std::size_t(kN) * kH * kW;
  Vec x(pixels), y(pixels), ref_out(pixels), out(pixels), tmp(kC * kC * 9);
  for (auto& v : x) v = float(rng.normal());
  for (auto& v : y) v = float(rng.normal());
  auto params = model.parameter_span();
  const auto& info = model.parameter_info();  // weight, bias of each convolution, in order
  for (int i = 1; i < 6; i += 2)              // non-zero biases, so that they are checked too
    for (std::size_t k = 0; k < info[i].count; ++k)
      params[info[i].offset + k] = 0.1f * float(rng.normal());
  Direct direct;
  Net net({{1, kC, true}, {kC, kC, true}, {kC, 1, false}}, true, false);
  for (int l = 0; l < 3; ++l) {
    const float *wl = &params[info[2 * l].offset], *bl = &params[info[2 * l + 1].offset];
    std::copy(wl, wl + info[2 * l].count, direct.w[l].begin());
    std::copy(bl, bl + kOut[l], direct.b[l].begin());
    net.copy(net.user(wl, {kOut[l], kIn[l], 3, 3}, tag::oihw), net.w[l]);
    net.copy(net.user(bl, {kOut[l]}, tag::x), net.b[l]);
  }
  auto onednn_step = [&] {
    std::memcpy(net.input.get_data_handle(), x.data(), 4 * pixels);
    net.run(net.fwd);
    const float* o = static_cast<const float*>(net.out.get_data_handle());
    float* g = static_cast<float*>(net.dy.get_data_handle());
    for (std::size_t i = 0; i < pixels; ++i) g[i] = 2.0f / float(pixels) * (o[i] - y[i]);  // MSE
    net.run(net.bwd);
  };

  // ---- correctness: (b) and (c) against (a), same weights, input and targets
  model.forward(x.data(), kN);
  model.copy_output(ref_out.data());
  model.zero_grad();
  model.forward_backward(x.data(), y.data(), kN, dtrain::Loss::mse);
  const auto grads = model.gradient_span();
  direct.step(x.data(), y.data());
  onednn_step();
  double worst = 0;
  auto check = [&](const std::string& what, const float* ref, const float* b, const float* c,
                   std::size_t n) {
    const double eb = max_rel(ref, b, n), ec = max_rel(ref, c, n);
    worst = std::max({worst, eb, ec});
    std::printf("check %-7s max|diff|/max|ref|: direct %.2e, oneDNN %.2e\n", what.c_str(), eb, ec);
  };
  for (int s = 0; s < kN; ++s)
    for (int h = 0; h < kH; ++h)
      std::memcpy(&out[(s * kH + h) * kW], &direct.act[3][at(s, h, 0)], 4 * kW);
  check("output", ref_out.data(), out.data(), static_cast<const float*>(net.out.get_data_handle()),
        pixels);
  for (int l = 0; l < 3; ++l) {
    const std::size_t nw = info[2 * l].count;
    net.copy(net.dw[l], net.user(tmp.data(), {kOut[l], kIn[l], 3, 3}, tag::oihw));
    check("dW" + std::to_string(l + 1), &grads[info[2 * l].offset], direct.dw[l].data(), tmp.data(),
          nw);
    net.copy(net.db[l], net.user(tmp.data(), {kOut[l]}, tag::x));
    check("db" + std::to_string(l + 1), &grads[info[2 * l].offset + nw], direct.db[l].data(),
          tmp.data(), kOut[l]);
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf(
      "oneDNN %d.%d.%d (%s); threads in the process after its step: %d (OMP_NUM_THREADS=%s)\n"
      "oneDNN stack:\n%s",
      dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch,
      dnnl_version()->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime",
      threads_in_process(), omp ? omp : "unset", net.log.c_str());
  if (!(worst < 1e-4))
    return std::printf("FAILED: relative error %.2e, not below 1e-4\n", worst), 1;

  // ---- the 32 -> 32 layer alone, each candidate in its own layout
  auto layer = dtrain::detail::make_layer<float, dtrain::HostBlasExec>(
      dtrain::LayerSpec(dtrain::Conv2d(kC, kC, 3).with_padding(1)));
  layer->setup(dtrain::Shape{kC, kH, kW});
  Vec lp(layer->param_count()), lg(lp.size()), lwk(lp.size()), ldb(kC);
  layer->bind(exec, lp.data(), lg.data());
  layer->init(1, 0, lp.data());
  layer->reserve(kN);
  const std::size_t cells = std::size_t(kN) * kC * kH * kW;
  Vec lx(cells), ly(cells), ldy(cells), ldx(cells);
  Pad px(kN * kC), py(kN * kC), pdy(kN * kC), pdx(kN * kC);
  for (std::size_t i = 0; i < cells; ++i) lx[i] = float(rng.normal()), ldy[i] = float(rng.normal());
  px.load(lx.data(), kN * kC), pdy.load(ldy.data(), kN * kC);
  dtrain::PassContext ctx;
  auto layer_a = [&] {
    layer->forward(exec.compute_stream(), lx.data(), ly.data(), kN, ctx);
    layer->backward(exec.compute_stream(), lx.data(), ly.data(), ldy.data(), ldx.data(), kN, ctx);
  };
  auto layer_b = [&] {
    pack(lp.data(), kC, kC, false, lwk.data());
    conv3x3(px.data(), py.data(), kC, kC, lwk.data(), lp.data() + kC * kC * 9, nullptr, false);
    std::fill(lg.begin(), lg.end(), 0.0f);
    wgrad(px.data(), pdy.data(), kC, kC, lg.data(), lg.data() + kC * kC * 9);
    pack(lp.data(), kC, kC, true, lwk.data());
    conv3x3(pdy.data(), pdx.data(), kC, kC, lwk.data(), nullptr, nullptr, false);
  };
  Net lnet({{kC, kC, false}}, false, true);
  lnet.copy(lnet.user(lx.data(), {kN, kC, kH, kW}, tag::nchw), lnet.input);
  lnet.copy(lnet.user(ldy.data(), {kN, kC, kH, kW}, tag::nchw), lnet.dy);
  lnet.copy(lnet.user(lp.data(), {kC, kC, 3, 3}, tag::oihw), lnet.w[0]);
  std::printf("oneDNN 32->32 layer:\n%s", lnet.log.c_str());
  auto layer_c = [&] { lnet.run(lnet.fwd), lnet.run(lnet.bwd); };

  // ---- timing, candidates interleaved round by round
  struct Cand {
    const char* name;
    std::function<void()> step;
    std::vector<double> ms;
  };
  auto dtrain_step = [&] {
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), kN, dtrain::Loss::mse);
  };
  std::vector<Cand> cands = {{"(a) dtrain Sequential", dtrain_step, {}},
                             {"(b) direct blocked", [&] { direct.step(x.data(), y.data()); }, {}},
                             {"(c) oneDNN 2.6", onednn_step, {}},
                             {"(a) 32->32 layer", layer_a, {}},
                             {"(b) 32->32 layer", layer_b, {}},
                             {"(c) 32->32 layer", layer_c, {}}};
  for (int r = 0; r < rounds; ++r)
    for (auto& c : cands) {
      c.step();  // warm
      std::vector<double> t;
      for (int i = 0; i < steps; ++i) {
        const double t0 = cpu_seconds();
        c.step();
        t.push_back(1e3 * (cpu_seconds() - t0));
      }
      c.ms.push_back(median(t));
    }
#if defined(__AVX512F__)
  const double p2 = fma_peak<v8>(), p5 = fma_peak<v16>();
#else
  const double p2 = fma_peak<v8>(), p5 = 0.0;  // a build without AVX-512
#endif
  const double gstep = 6.0 * kN * kH * kW * 9 * (kC + kC * kC + kC) / 1e9,
               glayer = 6.0 * kN * kH * kW * 9 * kC * kC / 1e9;
  std::printf(
      "FMA peak (CPU time): %.1f GFLOP/s 8 wide (AVX2), %.1f 16 wide (AVX-512); %.3f GFLOP "
      "per step, %.3f per 32->32 layer; %d rounds x %d steps\n",
      p2, p5, gstep, glayer, rounds, steps);
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const auto& c = cands[i];
    const double m = median(c.ms), g = (i < 3 ? gstep : glayer) / (m * 1e-3);
    std::printf(
        "%-22s %6.2f ms CPU (rounds %6.2f-%6.2f) %6.1f GFLOP/s, %3.0f%% of the AVX2 peak, "
        "%3.0f%% of the AVX-512 peak, %.2fx the time of (a)\n",
        c.name, m, *std::min_element(c.ms.begin(), c.ms.end()),
        *std::max_element(c.ms.begin(), c.ms.end()), g, 100 * g / p2, 100 * g / p5,
        m / median(cands[i < 3 ? 0 : 3].ms));
  }
  std::printf("threads in the process at the end: %d\n", threads_in_process());
  return 0;
}
