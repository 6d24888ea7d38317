// SPDX-License-Identifier: BSD-3-Clause
// dtrain: N-dimensional convolution (Conv1d/2d/3d) as a Layer<T, Exec>, written once for every
// policy: im2col turns each sample into a [in_channels * kernel cells, output cells] matrix, the
// policy's GEMM multiplies it by the weights, col2im brings the input gradient back. The lowering
// kernels live here, not in the policies: host functions (contiguous row copies) on host-running
// policies, element-wise functors through for_each_index on a device. On the host per sample, so
// the lowered matrix stays in cache and its scratch is one sample's; on a device per batch (as
// many samples as Conv::device_workspace holds), so a layer queues a fixed number of launches
// (forward 3, backward 6 per chunk) instead of a few per sample.
//
// On host-running policies, float convolutions with stride 1, dilation 1 and more than one kernel
// cell (any size up to 512 cells, zero or periodic padding, 1-, 2- and 3-D, any width and channel
// count) skip the GEMM: they run the direct kernel of <dtrain/kernels/host/conv_direct.hpp>, when
// this CPU has AVX2 or AVX-512 (the version is chosen once per process at run time; without
// either, or for double, the lowering below stays). ConvLowering::direct forces it (double and
// the portable version included); ConvLowering::im2col and ::shifted force the others.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/launch.hpp>
#include <dtrain/kernels/host/conv_direct.hpp>
#include <dtrain/model/layer.hpp>
#include <dtrain/model/layers.hpp>

namespace dtrain {

/// Extents of one convolution, every layout axis padded to three (a 2-D convolution has depth 1,
/// kernel depth 1 and no padding in depth). Trivially copyable: device kernels take it by value.
struct ConvGeometry {
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t in[3] = {1, 1, 1};      // input extents (depth, height, width)
  std::int64_t out[3] = {1, 1, 1};     // output extents
  std::int64_t kernel[3] = {1, 1, 1};  // kernel extents
  std::int64_t stride[3] = {1, 1, 1};
  std::int64_t pad[3] = {0, 0, 0};
  std::int64_t dilation[3] = {1, 1, 1};
  bool periodic = false;

  DTRAIN_HOST_DEVICE std::int64_t in_cells() const { return in[0] * in[1] * in[2]; }
  DTRAIN_HOST_DEVICE std::int64_t out_cells() const { return out[0] * out[1] * out[2]; }
  DTRAIN_HOST_DEVICE std::int64_t kernel_cells() const { return kernel[0] * kernel[1] * kernel[2]; }
  /// Rows of the lowered matrix: in_channels x kernel cells.
  DTRAIN_HOST_DEVICE std::int64_t lowered_rows() const { return in_channels * kernel_cells(); }
  /// Input coordinate on `axis` read by output coordinate `o` at kernel offset `k`, or -1 for a
  /// zero-padding cell.
  DTRAIN_HOST_DEVICE std::int64_t source(int axis, std::int64_t o, std::int64_t k) const {
    std::int64_t i = o * stride[axis] - pad[axis] + k * dilation[axis];
    const std::int64_t n = in[axis];
    if (periodic) {
      i %= n;
      return i < 0 ? i + n : i;
    }
    return i >= 0 && i < n ? i : -1;
  }
};

namespace detail {

/// Lowered-matrix element `i` of `samples` samples laid one after another from x: row-major
/// [lowered_rows, samples x out_cells], each row sample by sample, so one GEMM lowers the batch.
template <class T>
struct Im2col {
  ConvGeometry g;
  std::int64_t samples;
  const T* x;
  T* col;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int64_t cols = samples * g.out_cells(), j = i % cols, r = i / cols;
    const std::int64_t p = j % g.out_cells(), n = j / g.out_cells();
    const std::int64_t ow = p % g.out[2], oh = (p / g.out[2]) % g.out[1],
                       od = p / (g.out[2] * g.out[1]);
    const std::int64_t kw = r % g.kernel[2], kh = (r / g.kernel[2]) % g.kernel[1];
    const std::int64_t kd = (r / (g.kernel[2] * g.kernel[1])) % g.kernel[0];
    const std::int64_t c = n * g.in_channels + r / g.kernel_cells();
    const std::int64_t id = g.source(0, od, kd), ih = g.source(1, oh, kh), iw = g.source(2, ow, kw);
    col[i] =
        id < 0 || ih < 0 || iw < 0 ? T(0) : x[((c * g.in[0] + id) * g.in[1] + ih) * g.in[2] + iw];
  }
};

/// Input-gradient element `i` of `samples` samples from the batch's lowered gradient (layout of
/// Im2col): the sum of every lowered cell that read it (a gather, so the order of the sum is
/// fixed and no atomics are needed).
template <class T>
struct Col2im {
  ConvGeometry g;
  std::int64_t samples;
  const T* col;
  T* dx;
  // Output coordinates o on `axis` with source(axis, o, k) == i, as [first, step, count).
  DTRAIN_HOST_DEVICE void add_axis(int axis, std::int64_t i, std::int64_t k, std::int64_t* os,
                                   int& count) const {
    count = 0;
    const std::int64_t s = g.stride[axis], n = g.in[axis],
                       base = i + g.pad[axis] - k * g.dilation[axis];
    if (!g.periodic) {
      if (base >= 0 && base % s == 0 && base / s < g.out[axis]) os[count++] = base / s;
      return;
    }
    // base + m * n for every wrap m that lands on a multiple of the stride inside the output.
    const std::int64_t hi = (g.out[axis] - 1) * s;
    std::int64_t m = base >= 0 ? -(base / n) : (-base + n - 1) / n;
    for (std::int64_t v = base + m * n; v <= hi && count < 8; v += n)
      if (v >= 0 && v % s == 0) os[count++] = v / s;
  }
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int64_t iw = i % g.in[2], ih = (i / g.in[2]) % g.in[1];
    const std::int64_t id = (i / (g.in[2] * g.in[1])) % g.in[0];
    const std::int64_t c = (i / g.in_cells()) % g.in_channels;
    const std::int64_t n = i / (g.in_cells() * g.in_channels), P = g.out_cells(),
                       cols = samples * P;
    const T* sample = col + n * P;
    T sum = T(0);
    std::int64_t od[8], oh[8], ow[8];
    int nd = 0, nh = 0, nw = 0;
    for (std::int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      add_axis(0, id, kd, od, nd);
      for (std::int64_t kh = 0; kh < g.kernel[1]; ++kh) {
        add_axis(1, ih, kh, oh, nh);
        for (std::int64_t kw = 0; kw < g.kernel[2]; ++kw) {
          add_axis(2, iw, kw, ow, nw);
          const std::int64_t row = ((c * g.kernel[0] + kd) * g.kernel[1] + kh) * g.kernel[2] + kw;
          for (int a = 0; a < nd; ++a)
            for (int b = 0; b < nh; ++b)
              for (int e = 0; e < nw; ++e)
                sum += sample[row * cols + (od[a] * g.out[1] + oh[b]) * g.out[2] + ow[e]];
        }
      }
    }
    dx[i] = sum;
  }
};

/// Element `i` of `samples` samples [samples, channels, cells] from the channel-major matrix
/// [channels, samples x cells] the batched GEMM writes, plus the channel's bias.
template <class T>
struct FromChannelMajor {
  std::int64_t samples, channels, cells;
  const T* cm;
  const T* bias;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int64_t p = i % cells, c = (i / cells) % channels, n = i / (cells * channels);
    y[i] = cm[(c * samples + n) * cells + p] + bias[c];
  }
};

/// Element `i` of the channel-major matrix [channels, samples x cells] from `samples` samples
/// [samples, channels, cells] (the output gradient, as the batched GEMMs read it).
template <class T>
struct ToChannelMajor {
  std::int64_t samples, channels, cells;
  const T* y;
  T* cm;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int64_t p = i % cells, n = (i / cells) % samples, c = i / (cells * samples);
    cm[i] = y[(n * channels + c) * cells + p];
  }
};

/// One row of the lowered matrix over one output row: the input channel and kernel column it
/// reads, the input row (-1: a zero-padding row), and for a unit stride without wrap the output
/// columns [lo, hi) that read inside the input, `offset` columns to the right of their own.
struct LoweredRow {
  std::int64_t channel, kernel_w, in_d, in_h, lo, hi, offset;
  bool contiguous;
  bool padding() const noexcept { return in_d < 0 || in_h < 0; }
};

/// Calls f(LoweredRow) for every (lowered row, output row) pair in lowered-matrix order: each
/// call covers the next out[2] cells of the matrix. The host im2col and col2im share this walk.
template <class F>
void walk_lowered_rows(const ConvGeometry& g, F&& f) {
  const std::int64_t OW = g.out[2];
  for (std::int64_t c = 0; c < g.in_channels; ++c)
    for (std::int64_t kd = 0; kd < g.kernel[0]; ++kd)
      for (std::int64_t kh = 0; kh < g.kernel[1]; ++kh)
        for (std::int64_t kw = 0; kw < g.kernel[2]; ++kw) {
          LoweredRow r{c, kw, 0, 0, 0, 0, kw * g.dilation[2] - g.pad[2], false};
          r.contiguous = g.stride[2] == 1 && !g.periodic;
          r.lo = r.contiguous ? std::min(OW, std::max<std::int64_t>(0, -r.offset)) : 0;
          r.hi = r.contiguous ? std::max(r.lo, std::min(OW, g.in[2] - r.offset)) : 0;
          for (std::int64_t od = 0; od < g.out[0]; ++od) {
            r.in_d = g.source(0, od, kd);
            for (std::int64_t oh = 0; oh < g.out[1]; ++oh) {
              r.in_h = g.source(1, oh, kh);
              f(static_cast<const LoweredRow&>(r));
            }
          }
        }
}

/// Host im2col of one sample: whole output rows at once (a copy with zero borders when the
/// stride is 1 and the padding is zeros).
template <class T>
void im2col_host(ConvGeometry g, const T* x, T* col) {
  const std::int64_t OW = g.out[2];
  T* dst = col;
  walk_lowered_rows(g, [&](const LoweredRow& r) {
    if (r.padding()) {
      std::fill(dst, dst + OW, T(0));
    } else {
      const T* src = x + ((r.channel * g.in[0] + r.in_d) * g.in[1] + r.in_h) * g.in[2];
      if (r.contiguous) {
        std::fill(dst, dst + r.lo, T(0));
        std::memcpy(dst + r.lo, src + r.lo + r.offset,
                    static_cast<std::size_t>(r.hi - r.lo) * sizeof(T));
        std::fill(dst + r.hi, dst + OW, T(0));
      } else {
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const std::int64_t iw = g.source(2, ow, r.kernel_w);
          dst[ow] = iw < 0 ? T(0) : src[iw];
        }
      }
    }
    dst += OW;
  });
}

/// Host col2im of one sample: dx = 0, then every lowered cell added to the input cell it read,
/// row by row (a fixed order).
template <class T>
void col2im_host(ConvGeometry g, const T* col, T* dx) {
  std::fill(dx, dx + g.in_channels * g.in_cells(), T(0));
  const std::int64_t OW = g.out[2];
  const T* src = col;
  walk_lowered_rows(g, [&](const LoweredRow& r) {
    if (!r.padding()) {
      T* dst = dx + ((r.channel * g.in[0] + r.in_d) * g.in[1] + r.in_h) * g.in[2];
      if (r.contiguous) {
        for (std::int64_t ow = r.lo; ow < r.hi; ++ow) dst[ow + r.offset] += src[ow];
      } else {
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const std::int64_t iw = g.source(2, ow, r.kernel_w);
          if (iw >= 0) dst[iw] += src[ow];
        }
      }
    }
    src += OW;
  });
}

template <class T>
struct Fill {
  T* x;
  T value;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const { x[i] = value; }
};

/// The padded grid of the shifted lowering: each input channel copied onto (in + 2 pad) cells
/// per axis, `plane` elements apart (the grid plus slack that the last kernel cell's view reads);
/// the wide output has `wide` = out[0] x padded[1] x padded[2] cells per channel, of which the
/// cells past out[1] or out[2] on their axis are never used. Stride 1 only.
struct ShiftedGrid {
  ConvGeometry g;
  std::int64_t padded[3] = {1, 1, 1};
  std::int64_t plane = 0, wide = 0;
  explicit ShiftedGrid(const ConvGeometry& geometry = {}) : g(geometry) {
    for (int a = 0; a < 3; ++a) padded[a] = g.in[a] + 2 * g.pad[a];
    wide = g.out[0] * padded[1] * padded[2];
    const std::int64_t last = shift(g.kernel_cells() - 1);
    plane = std::max(padded[0] * padded[1] * padded[2], last + wide);
  }
  /// Offset of kernel cell k's view into a padded channel.
  DTRAIN_HOST_DEVICE std::int64_t shift(std::int64_t k) const {
    const std::int64_t kw = k % g.kernel[2], kh = (k / g.kernel[2]) % g.kernel[1];
    const std::int64_t kd = k / (g.kernel[2] * g.kernel[1]);
    return ((kd * g.dilation[0]) * padded[1] + kh * g.dilation[1]) * padded[2] + kw * g.dilation[2];
  }
  /// Input coordinate of padded coordinate p on `axis`, or -1 (zero padding). Periodic padding
  /// never exceeds the axis, so one wrap suffices.
  DTRAIN_HOST_DEVICE std::int64_t source(int axis, std::int64_t p) const {
    const std::int64_t i = p - g.pad[axis], n = g.in[axis];
    if (i >= 0 && i < n) return i;
    if (!g.periodic) return -1;
    return i < 0 ? i + n : i - n;
  }
};

/// Padded row r (channel, depth, height) of one sample: the input row, its borders zero or
/// wrapped.
template <class T>
struct PadRows {
  ShiftedGrid s;
  const T* x;
  T* xpad;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t r) const {
    const std::int64_t hp = s.padded[1], dp = s.padded[0], wp = s.padded[2];
    const std::int64_t h = r % hp, d = (r / hp) % dp, c = r / (hp * dp);
    T* dst = xpad + c * s.plane + (d * hp + h) * wp;
    const std::int64_t sd = s.source(0, d), sh = s.source(1, h);
    if (sd < 0 || sh < 0) {
      for (std::int64_t w = 0; w < wp; ++w) dst[w] = T(0);
      return;
    }
    const T* src = x + ((c * s.g.in[0] + sd) * s.g.in[1] + sh) * s.g.in[2];
    for (std::int64_t w = 0; w < wp; ++w) {
      const std::int64_t iw = s.source(2, w);
      dst[w] = iw < 0 ? T(0) : src[iw];
    }
  }
};

/// Output row r (channel, depth, height) taken out of the wide output.
template <class T>
struct CropRows {
  ShiftedGrid s;
  const T* wide;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t r) const {
    const std::int64_t oh = r % s.g.out[1], od = (r / s.g.out[1]) % s.g.out[0];
    const std::int64_t co = r / (s.g.out[1] * s.g.out[0]);
    const T* src = wide + co * s.wide + (od * s.padded[1] + oh) * s.padded[2];
    T* dst = y + r * s.g.out[2];
    for (std::int64_t w = 0; w < s.g.out[2]; ++w) dst[w] = src[w];
  }
};

/// Wide row r (channel, depth, padded height) of the output gradient: dy's row, zeros past it.
template <class T>
struct ExpandRows {
  ShiftedGrid s;
  const T* dy;
  T* wide;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t r) const {
    const std::int64_t hp = s.padded[1], h = r % hp, od = (r / hp) % s.g.out[0];
    const std::int64_t co = r / (hp * s.g.out[0]);
    T* dst = wide + co * s.wide + (od * hp + h) * s.padded[2];
    const std::int64_t ow = h < s.g.out[1] ? s.g.out[2] : 0;
    const T* src = dy + ((co * s.g.out[0] + od) * s.g.out[1] + h) * s.g.out[2];
    for (std::int64_t w = 0; w < ow; ++w) dst[w] = src[w];
    for (std::int64_t w = ow; w < s.padded[2]; ++w) dst[w] = T(0);
  }
};

/// Input-gradient row r (channel, depth, height): the padded gradient's cells that stand for it
/// (one per axis with zero padding; the wrapped copies too with periodic padding), summed.
template <class T>
struct FoldRows {
  ShiftedGrid s;
  const T* dxpad;
  T* dx;
  // Padded coordinates on `axis` whose source is i.
  DTRAIN_HOST_DEVICE int candidates(int axis, std::int64_t i, std::int64_t* p) const {
    int n = 0;
    const std::int64_t base = i + s.g.pad[axis], len = s.g.in[axis];
    p[n++] = base;
    if (s.g.periodic) {
      if (base - len >= 0) p[n++] = base - len;
      if (base + len < s.padded[axis]) p[n++] = base + len;
    }
    return n;
  }
  DTRAIN_HOST_DEVICE void operator()(std::int64_t r) const {
    const std::int64_t ih = r % s.g.in[1], id = (r / s.g.in[1]) % s.g.in[0];
    const std::int64_t c = r / (s.g.in[1] * s.g.in[0]);
    std::int64_t pd[3], ph[3], pw[3];
    const int nd = candidates(0, id, pd), nh = candidates(1, ih, ph);
    const T* plane = dxpad + c * s.plane;
    T* dst = dx + r * s.g.in[2];
    for (std::int64_t iw = 0; iw < s.g.in[2]; ++iw) {
      const int nw = candidates(2, iw, pw);
      T sum = T(0);
      for (int a = 0; a < nd; ++a)
        for (int b = 0; b < nh; ++b)
          for (int e = 0; e < nw; ++e)
            sum += plane[(pd[a] * s.padded[1] + ph[b]) * s.padded[2] + pw[e]];
      dst[iw] = sum;
    }
  }
};

/// Weights [out, in, kernel cells] reordered to one [out, in] matrix per kernel cell.
template <class T>
struct ReorderWeights {
  std::int64_t out_channels, in_channels, cells;
  const T* w;
  T* per_cell;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int64_t c = i % in_channels, co = (i / in_channels) % out_channels;
    const std::int64_t k = i / (in_channels * out_channels);
    per_cell[i] = w[(co * in_channels + c) * cells + k];
  }
};

/// dw [out, in, kernel cells] += the per-cell gradient matrices.
template <class T>
struct AddPerCell {
  std::int64_t out_channels, in_channels, cells;
  const T* per_cell;
  T* dw;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::int64_t k = i % cells, c = (i / cells) % in_channels;
    const std::int64_t co = i / (cells * in_channels);
    dw[i] += per_cell[(k * out_channels + co) * in_channels + c];
  }
};

}  // namespace detail

/// The convolution layer (see Conv). Weight [out_channels, in_channels, k...], bias
/// [out_channels]; scratch: on host policies one sample's lowered matrix and its gradient, and a
/// row of ones; on device policies the lowered matrix of as many samples as the batch and
/// Conv::device_workspace allow, their channel-major output, and a row of ones.
template <class T, class Exec>
class ConvLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit ConvLayer(const Conv& s) : spec_(s) {}
  const char* kind() const noexcept override {
    static const char* const names[] = {"conv1d", "conv2d", "conv3d"};
    return names[spec_.dims - 1];
  }

  Shape configure(const Shape& in) override {
    const int n = spec_.dims;
    DTRAIN_REQUIRE(static_cast<int>(in.size()) == n + 1 && in[0] == spec_.in_channels, kind(),
                   "expects samples [" << spec_.in_channels << " channels, " << n
                                       << " grid axes] but receives " << shape_string(in));
    geometry_ = ConvGeometry{};
    geometry_.in_channels = spec_.in_channels;
    geometry_.out_channels = spec_.out_channels;
    geometry_.periodic = spec_.padding_mode == Padding::periodic;
    Shape out{spec_.out_channels};
    for (int a = 0; a < n; ++a) {
      const int axis = 3 - n + a;
      const std::int64_t extent = in[static_cast<std::size_t>(a) + 1];
      const std::int64_t span = spec_.dilation * (spec_.kernel - 1) + 1;
      DTRAIN_REQUIRE(extent + 2 * spec_.padding >= span, kind(),
                     "kernel " << spec_.kernel << " (dilation " << spec_.dilation
                               << ") does not fit axis " << a + 1 << " of input "
                               << shape_string(in) << " with padding " << spec_.padding);
      DTRAIN_REQUIRE(!geometry_.periodic || spec_.padding <= extent, kind(),
                     "periodic padding " << spec_.padding << " exceeds axis " << a + 1
                                         << " of input " << shape_string(in));
      geometry_.in[axis] = extent;
      geometry_.kernel[axis] = spec_.kernel;
      geometry_.stride[axis] = spec_.stride;
      geometry_.pad[axis] = spec_.padding;
      geometry_.dilation[axis] = spec_.dilation;
      geometry_.out[axis] = (extent + 2 * spec_.padding - span) / spec_.stride + 1;
      out.push_back(geometry_.out[axis]);
    }
    DTRAIN_REQUIRE(runs_host_kernels_v<Exec> || spec_.lowering == ConvLowering::automatic ||
                       spec_.lowering == ConvLowering::im2col,
                   kind(),
                   "the shifted and direct lowerings run on host policies only; on a device a "
                   "convolution lowers whole batches by im2col");
    DTRAIN_REQUIRE(spec_.lowering != ConvLowering::shifted || spec_.stride == 1, kind(),
                   "the shifted lowering needs stride 1, not " << spec_.stride);
    // The direct kernel: host code, unit stride and dilation, its tap offsets on the stack.
    const bool direct_fits = runs_host_kernels_v<Exec> && spec_.stride == 1 &&
                             spec_.dilation == 1 &&
                             geometry_.kernel_cells() <= host::conv_direct_max_taps;
    DTRAIN_REQUIRE(spec_.lowering != ConvLowering::direct || direct_fits, kind(),
                   "the direct lowering needs a host policy, stride 1, dilation 1 and at most "
                       << host::conv_direct_max_taps << " kernel cells, not stride " << spec_.stride
                       << ", dilation " << spec_.dilation << ", " << geometry_.kernel_cells()
                       << " cells");
    isa_ = host::conv_isa();
    lowering_ = spec_.lowering;
    if (lowering_ == ConvLowering::automatic)
      lowering_ = direct_fits && prefer_direct(geometry_, isa_) ? ConvLowering::direct
                  : runs_host_kernels_v<Exec> && spec_.stride == 1 && prefer_shifted(geometry_)
                      ? ConvLowering::shifted
                      : ConvLowering::im2col;
    shifted_ = lowering_ == ConvLowering::shifted;
    return out;
  }

  /// The automatic choice of the direct kernel (once it fits, see configure), from
  /// benchmarks/conv_bench.cpp and benchmarks/model_bench.cpp (RESULTS.md, "Convolutions" and
  /// "Whole models"): float, more than one kernel cell (a 1x1 convolution is a plain GEMM), and a
  /// CPU with AVX2 or AVX-512 (the portable version is there for correctness, not speed). A rule
  /// of shapes, type and instruction set, never a timing, so every rank of a job on one kind of
  /// CPU chooses alike. Measured on an AVX-512 Xeon (family 6, model 207; both versions, the AVX2
  /// one forced: the direct kernel beat the better of im2col and shifted views on every layer of
  /// the two model CNNs, 2.6x to 9.8x and 2.0x to 8.3x, model_bench 07 Dec 06:18-06:26) and, for
  /// the AVX2 version, on a 2-core AVX2 EPYC (conv_bench's stack: 81-124 ms against 110-116 ms
  /// for the GEMM lowering, 06 Dec).
  static bool prefer_direct(const ConvGeometry& g, host::ConvIsa isa) {
    return std::is_same_v<T, float> && g.kernel_cells() > 1 && isa != host::ConvIsa::portable;
  }

  /// The automatic choice for a stride-1 convolution, from benchmarks/conv_bench.cpp (RESULTS.md,
  /// "Convolutions"): shifted views for periodic padding (3.8x faster there: im2col wraps every
  /// cell) and when fewer channels come out than go in (1.3x for 32 -> 1: the window matrix is
  /// large next to the output); im2col otherwise (equal for 32 -> 32 and 8 -> 8, 1.9x faster for
  /// 1 -> 32, where a GEMM per kernel cell has one input channel).
  static bool prefer_shifted(const ConvGeometry& g) {
    return g.kernel_cells() > 1 && (g.periodic || g.out_channels < g.in_channels);
  }

  const ConvGeometry& geometry() const noexcept { return geometry_; }

  std::vector<LayerParam> params() const override {
    Shape w{spec_.out_channels, spec_.in_channels};
    for (int a = 0; a < spec_.dims; ++a) w.push_back(spec_.kernel);
    return {{"weight", w, 0}, {"bias", {spec_.out_channels}, weight_count()}};
  }
  void init(std::uint64_t seed, std::uint64_t index, T* w) override {
    const double cells = static_cast<double>(geometry_.kernel_cells());
    init_weights(spec_.weight_init, seed, index, w, weight_count(),
                 static_cast<double>(spec_.in_channels) * cells,
                 static_cast<double>(spec_.out_channels) * cells);
    std::fill(w + weight_count(), w + weight_count() + spec_.out_channels, T(0));
  }

  /// Whether this layer lowers by shifted views (see ConvLowering) rather than im2col.
  bool uses_shifted() const noexcept { return shifted_; }
  /// The lowering this layer runs (never `automatic` once configured).
  ConvLowering lowering() const noexcept { return lowering_; }
  /// The instruction set of the direct kernel (see host::conv_isa), fixed at configure.
  host::ConvIsa direct_isa() const noexcept { return isa_; }

  void bind(Exec& exec, T* params, T* grads) override {
    Layer<T, Exec>::bind(exec, params, grads);
    Allocator& a = exec.allocator();
    const std::int64_t C = spec_.out_channels, Cin = spec_.in_channels;
    std::int64_t ones = geometry_.out_cells();
    if (lowering_ == ConvLowering::direct) return bind_direct(exec);
    if constexpr (!runs_host_kernels_v<Exec>) {
      batch_ = 0;
      return reserve(1);
    }
    if (shifted_) {
      grid_ = detail::ShiftedGrid(geometry_);
      xpad_ = Tensor({Cin, grid_.plane}, dtype_of_v<T>, a);
      dxpad_ = Tensor({Cin, grid_.plane}, dtype_of_v<T>, a);
      wide_ = Tensor({C, grid_.wide}, dtype_of_v<T>, a);
      dwide_ = Tensor({C, grid_.wide}, dtype_of_v<T>, a);
      per_cell_ = Tensor({geometry_.kernel_cells(), C, Cin}, dtype_of_v<T>, a);
      dper_cell_ = Tensor({geometry_.kernel_cells(), C, Cin}, dtype_of_v<T>, a);
      // The slack past the padded grid is read by the last cells' views: zero, never written.
      exec.fill(exec.compute_stream(), buf(xpad_), static_cast<std::size_t>(Cin * grid_.plane),
                T(0));
      ones = grid_.wide;
    } else {
      const std::int64_t K = geometry_.lowered_rows(), P = geometry_.out_cells();
      col_ = Tensor({K, P}, dtype_of_v<T>, a);
      dcol_ = Tensor({K, P}, dtype_of_v<T>, a);
    }
    ones_ = Tensor({ones}, dtype_of_v<T>, a);
    exec.fill(exec.compute_stream(), buf(ones_), static_cast<std::size_t>(ones), T(1));
  }

  /// Device policies: grows the batched scratch to min(rows, what Conv::device_workspace holds)
  /// samples. Host policies keep one sample's scratch.
  void reserve(std::int64_t rows) override {
    if constexpr (!runs_host_kernels_v<Exec>) {
      const std::int64_t P = geometry_.out_cells();
      const std::int64_t per_sample =
          (geometry_.lowered_rows() + spec_.out_channels + 1) * P * std::int64_t(sizeof(T));
      const std::int64_t fit = static_cast<std::int64_t>(spec_.device_workspace) / per_sample;
      const std::int64_t want = std::max<std::int64_t>(1, std::min(rows, fit));
      if (want <= batch_) return;
      Allocator& a = this->exec().allocator();
      col_ = Tensor({geometry_.lowered_rows(), want * P}, dtype_of_v<T>, a);
      cm_ = Tensor({spec_.out_channels, want * P}, dtype_of_v<T>, a);
      ones_ = Tensor({want * P}, dtype_of_v<T>, a);
      this->exec().fill(this->exec().compute_stream(), buf(ones_),
                        static_cast<std::size_t>(want * P), T(1));
      batch_ = want;
    } else {
      (void)rows;
    }
  }

  /// Samples a device policy lowers per chunk (0 on host policies): forward queues 3 kernels per
  /// chunk, backward 6 (4 without dx), whatever the batch.
  std::int64_t device_chunk() const noexcept { return batch_; }

  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    if constexpr (!runs_host_kernels_v<Exec>) return forward_batched(s, x, y, rows);
    if constexpr (runs_host_kernels_v<Exec>)
      if (lowering_ == ConvLowering::direct)
        return this->exec().host_kernel(s, "conv direct forward", &host::conv_direct_forward<T>,
                                        plan_, isa_, rows, x, this->parameters(),
                                        this->parameters() + weight_count(), y, buf(per_cell_),
                                        buf(xpad_), buf(wide_));
    if (shifted_) return forward_shifted(s, x, y, rows);
    const std::int64_t K = geometry_.lowered_rows(), P = geometry_.out_cells();
    const std::int64_t C = spec_.out_channels;
    const T* w = this->parameters();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xs = x + r * this->input_size();
      T* ys = y + r * this->output_size();
      lower(s, xs);
      // y = bias * ones^T, then y += W col.
      this->exec().gemm(s, false, false, C, P, 1, T(1), w + weight_count(), 1, ones(), P, T(0), ys,
                        P);
      this->exec().gemm(s, false, false, C, P, K, T(1), w, K, col(), P, T(1), ys, P);
    }
  }

  void backward(stream_type s, const T* x, const T* y, const T* dy, T* dx, std::int64_t rows,
                const PassContext& ctx) override {
    (void)y;
    (void)ctx;
    if constexpr (!runs_host_kernels_v<Exec>) return backward_batched(s, x, dy, dx, rows);
    if constexpr (runs_host_kernels_v<Exec>)
      if (lowering_ == ConvLowering::direct)
        return this->exec().host_kernel(
            s, "conv direct backward", &host::conv_direct_backward<T>, plan_, isa_, rows, x, dy,
            static_cast<const T*>(this->parameters()), this->gradients(),
            this->gradients() + weight_count(), dx, buf(per_cell_), buf(xpad_), buf(dwide_),
            buf(dxpad_), buf(dper_cell_));
    if (shifted_) return backward_shifted(s, x, dy, dx, rows);
    const std::int64_t K = geometry_.lowered_rows(), P = geometry_.out_cells();
    const std::int64_t C = spec_.out_channels;
    const T* w = this->parameters();
    T* dw = this->gradients();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* dys = dy + r * this->output_size();
      lower(s, x + r * this->input_size());
      // dW += dy col^T; db += dy ones.
      this->exec().gemm(s, false, true, C, K, P, T(1), dys, P, col(), P, T(1), dw, K);
      this->exec().gemm(s, false, false, C, 1, P, T(1), dys, P, ones(), 1, T(1),
                        dw + weight_count(), 1);
      if (!dx) continue;
      // dcol = W^T dy, then back onto the input grid.
      this->exec().gemm(s, true, false, K, P, C, T(1), w, K, dys, P, T(0), dcol(), P);
      T* dxs = dx + r * this->input_size();
      if constexpr (runs_host_kernels_v<Exec>)
        this->exec().host_kernel(s, "conv col2im", &detail::col2im_host<T>, geometry_,
                                 static_cast<const T*>(dcol()), dxs);
    }
  }

 private:
  static T* buf(Tensor& t) noexcept { return static_cast<T*>(t.raw()); }

  // The direct kernel's scratch, zero-filled once (the kernels rely on the cells they never
  // write staying zero): the padded input (xpad_), the wide output (wide_) and output gradient
  // (dwide_), the wide input gradient (dxpad_) and the packed weights (per_cell_); and the weight
  // gradient's lanes (dper_cell_, filled by each backward).
  void bind_direct(Exec& exec) {
    Allocator& a = exec.allocator();
    const std::int64_t C = spec_.out_channels, Cin = spec_.in_channels;
    plan_ = host::ConvDirectPlan(Cin, C, geometry_.in, geometry_.kernel, geometry_.pad,
                                 geometry_.periodic);
    auto zeros = [&](Tensor& t, std::int64_t rows, std::int64_t cols) {
      t = Tensor({rows, cols}, dtype_of_v<T>, a);
      exec.fill(exec.compute_stream(), buf(t), static_cast<std::size_t>(rows * cols), T(0));
    };
    zeros(xpad_, Cin, plan_.x_stride);
    zeros(wide_, C, plan_.y_stride);
    zeros(dwide_, C, plan_.dy_stride);
    zeros(dxpad_, Cin, plan_.dx_stride);
    zeros(per_cell_, C * Cin, plan_.taps);
    zeros(dper_cell_, C * Cin * plan_.taps,
          host::ConvDirectPlan::lane_bytes / static_cast<std::int64_t>(sizeof(T)));
  }

  // Weights as one [out, in] matrix per kernel cell.
  void reorder_weights(stream_type s) {
    for_each_index<detail::ReorderWeights<T>>(
        this->exec(), s, "conv reorder weights", static_cast<std::int64_t>(weight_count()),
        spec_.out_channels, spec_.in_channels, geometry_.kernel_cells(),
        static_cast<const T*>(this->parameters()), buf(per_cell_));
  }
  void pad(stream_type s, const T* xs) {
    for_each_index<detail::PadRows<T>>(this->exec(), s, "conv pad",
                                       spec_.in_channels * grid_.padded[0] * grid_.padded[1], grid_,
                                       xs, buf(xpad_));
  }

  void forward_shifted(stream_type s, const T* x, T* y, std::int64_t rows) {
    const std::int64_t C = spec_.out_channels, Cin = spec_.in_channels, P = grid_.wide;
    reorder_weights(s);
    const T* bias = this->parameters() + weight_count();
    const T* cells = buf(per_cell_);
    for (std::int64_t r = 0; r < rows; ++r) {
      pad(s, x + r * this->input_size());
      T* wide = buf(wide_);
      this->exec().gemm(s, false, false, C, P, 1, T(1), bias, 1, ones(), P, T(0), wide, P);
      for (std::int64_t k = 0; k < geometry_.kernel_cells(); ++k)
        this->exec().gemm(s, false, false, C, P, Cin, T(1), cells + k * C * Cin, Cin,
                          buf(xpad_) + grid_.shift(k), grid_.plane, T(1), wide, P);
      for_each_index<detail::CropRows<T>>(this->exec(), s, "conv crop",
                                          C * geometry_.out[0] * geometry_.out[1], grid_,
                                          static_cast<const T*>(wide), y + r * this->output_size());
    }
  }

  void backward_shifted(stream_type s, const T* x, const T* dy, T* dx, std::int64_t rows) {
    const std::int64_t C = spec_.out_channels, Cin = spec_.in_channels, P = grid_.wide;
    const std::int64_t cells = geometry_.kernel_cells();
    reorder_weights(s);
    T* dcells = buf(dper_cell_);
    this->exec().fill(s, dcells, static_cast<std::size_t>(cells * C * Cin), T(0));
    T* db = this->gradients() + weight_count();
    for (std::int64_t r = 0; r < rows; ++r) {
      pad(s, x + r * this->input_size());
      T* dwide = buf(dwide_);
      for_each_index<detail::ExpandRows<T>>(this->exec(), s, "conv expand",
                                            C * geometry_.out[0] * grid_.padded[1], grid_,
                                            dy + r * this->output_size(), dwide);
      for (std::int64_t k = 0; k < cells; ++k)
        this->exec().gemm(s, false, true, C, Cin, P, T(1), static_cast<const T*>(dwide), P,
                          static_cast<const T*>(buf(xpad_)) + grid_.shift(k), grid_.plane, T(1),
                          dcells + k * C * Cin, Cin);
      this->exec().gemm(s, false, false, C, 1, P, T(1), static_cast<const T*>(dwide), P, ones(), 1,
                        T(1), db, 1);
      if (!dx) continue;
      T* dxpad = buf(dxpad_);
      this->exec().fill(s, dxpad, static_cast<std::size_t>(Cin * grid_.plane), T(0));
      for (std::int64_t k = 0; k < cells; ++k)
        this->exec().gemm(
            s, true, false, Cin, P, C, T(1), static_cast<const T*>(buf(per_cell_)) + k * C * Cin,
            Cin, static_cast<const T*>(dwide), P, T(1), dxpad + grid_.shift(k), grid_.plane);
      for_each_index<detail::FoldRows<T>>(
          this->exec(), s, "conv fold", Cin * geometry_.in[0] * geometry_.in[1], grid_,
          static_cast<const T*>(dxpad), dx + r * this->input_size());
    }
    for_each_index<detail::AddPerCell<T>>(this->exec(), s, "conv weight gradient",
                                          static_cast<std::int64_t>(weight_count()), C, Cin, cells,
                                          static_cast<const T*>(dcells), this->gradients());
  }

  void lower(stream_type s, const T* xs) {
    if constexpr (runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, "conv im2col", &detail::im2col_host<T>, geometry_, xs, col());
  }

  // Device policies: the batch in chunks of batch_ samples, each lowered into one matrix
  // [K, n x P] so that one GEMM convolves the chunk (launches per chunk, not per sample). Every
  // sum has a fixed order (the GEMMs', and Col2im's gather): no atomics.
  void forward_batched(stream_type s, const T* x, T* y, std::int64_t rows) {
    const std::int64_t K = geometry_.lowered_rows(), P = geometry_.out_cells();
    const std::int64_t C = spec_.out_channels;
    const T* w = this->parameters();
    for (std::int64_t b = 0; b < rows; b += batch_) {
      const std::int64_t n = std::min(batch_, rows - b), cols = n * P;
      for_each_index<detail::Im2col<T>>(this->exec(), s, "conv im2col", K * cols, geometry_, n,
                                        x + b * this->input_size(), col());
      this->exec().gemm(s, false, false, C, cols, K, T(1), w, K, static_cast<const T*>(col()), cols,
                        T(0), buf(cm_), cols);
      for_each_index<detail::FromChannelMajor<T>>(this->exec(), s, "conv bias", C * cols, n, C, P,
                                                  static_cast<const T*>(buf(cm_)),
                                                  w + weight_count(), y + b * this->output_size());
    }
  }

  void backward_batched(stream_type s, const T* x, const T* dy, T* dx, std::int64_t rows) {
    const std::int64_t K = geometry_.lowered_rows(), P = geometry_.out_cells();
    const std::int64_t C = spec_.out_channels;
    const T* w = this->parameters();
    T* dw = this->gradients();
    const T* dcm = buf(cm_);
    for (std::int64_t b = 0; b < rows; b += batch_) {
      const std::int64_t n = std::min(batch_, rows - b), cols = n * P;
      for_each_index<detail::Im2col<T>>(this->exec(), s, "conv im2col", K * cols, geometry_, n,
                                        x + b * this->input_size(), col());
      for_each_index<detail::ToChannelMajor<T>>(this->exec(), s, "conv output gradient", C * cols,
                                                n, C, P, dy + b * this->output_size(), buf(cm_));
      // dW += dy col^T and db += dy ones, summed over the chunk's samples inside the GEMMs.
      this->exec().gemm(s, false, true, C, K, cols, T(1), dcm, cols, static_cast<const T*>(col()),
                        cols, T(1), dw, K);
      this->exec().gemm(s, false, false, C, 1, cols, T(1), dcm, cols, ones(), 1, T(1),
                        dw + weight_count(), 1);
      if (!dx) continue;
      // The lowered gradient W^T dy replaces the lowered input (queued after the GEMM reading it).
      this->exec().gemm(s, true, false, K, cols, C, T(1), w, K, dcm, cols, T(0), col(), cols);
      for_each_index<detail::Col2im<T>>(
          this->exec(), s, "conv col2im", n * geometry_.in_channels * geometry_.in_cells(),
          geometry_, n, static_cast<const T*>(col()), dx + b * this->input_size());
    }
  }
  std::size_t weight_count() const noexcept {
    return static_cast<std::size_t>(geometry_.out_channels * geometry_.lowered_rows());
  }
  T* col() noexcept { return buf(col_); }
  T* dcol() noexcept { return buf(dcol_); }
  const T* ones() noexcept { return buf(ones_); }

  Conv spec_;
  ConvGeometry geometry_;
  bool shifted_ = false;
  ConvLowering lowering_ = ConvLowering::im2col;
  host::ConvIsa isa_ = host::ConvIsa::portable;
  host::ConvDirectPlan plan_;
  detail::ShiftedGrid grid_;
  Tensor col_, dcol_, ones_;                                   // im2col
  Tensor cm_;                                                  // device: channel-major output
  std::int64_t batch_ = 0;                                     // device: samples per chunk
  Tensor xpad_, dxpad_, wide_, dwide_, per_cell_, dper_cell_;  // shifted, direct (bind_direct)
};

}  // namespace dtrain
