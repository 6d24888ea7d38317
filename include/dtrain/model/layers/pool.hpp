// SPDX-License-Identifier: BSD-3-Clause
// dtrain: pooling (max, average) and nearest-neighbour upsampling as Layer<T, Exec>. On a device
// each kernel is an element-wise functor run by for_each_index: backward passes gather (each input
// cell sums the output cells that used it), so their sums have a fixed order and no atomics. On
// host-running policies the same results come from loops over windows (the *_host functions): a
// gather recomputes every window's argmax once per cell it covers, and its index arithmetic per
// element cost a small CNN's step more than its convolutions. The host backward passes zero dx
// and scatter each window into it in output order, which adds in the order the gather does, so
// both give the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/launch.hpp>
#include <dtrain/model/layer.hpp>
#include <dtrain/model/layers.hpp>

namespace dtrain {

/// Extents of a pooling or upsampling layer, padded to three axes (depth, height, width).
/// `window` and `stride` are the pooling window; upsampling uses `stride` as its scale.
struct GridGeometry {
  std::int64_t channels = 0;
  std::int64_t in[3] = {1, 1, 1};
  std::int64_t out[3] = {1, 1, 1};
  std::int64_t window[3] = {1, 1, 1};
  std::int64_t stride[3] = {1, 1, 1};
  DTRAIN_HOST_DEVICE std::int64_t in_cells() const { return in[0] * in[1] * in[2]; }
  DTRAIN_HOST_DEVICE std::int64_t out_cells() const { return out[0] * out[1] * out[2]; }
  DTRAIN_HOST_DEVICE std::int64_t window_cells() const { return window[0] * window[1] * window[2]; }
};

namespace detail {

// Splits a flat cell index of extents e into (channel, d, h, w).
DTRAIN_HOST_DEVICE inline void split_cell(std::int64_t i, const std::int64_t* e, std::int64_t& c,
                                          std::int64_t* at) {
  at[2] = i % e[2];
  at[1] = (i / e[2]) % e[1];
  at[0] = (i / (e[2] * e[1])) % e[0];
  c = i / (e[0] * e[1] * e[2]);
}

// The input cell at offset (a, b, e) of output window `o`, within a channel plane.
DTRAIN_HOST_DEVICE inline std::int64_t window_cell(const GridGeometry& g, const std::int64_t* o,
                                                   std::int64_t a, std::int64_t b, std::int64_t e) {
  return ((o[0] * g.stride[0] + a) * g.in[1] + o[1] * g.stride[1] + b) * g.in[2] +
         o[2] * g.stride[2] + e;
}

// The first cell of the largest value in output window `o` of channel plane x (ties: the first).
template <class T>
DTRAIN_HOST_DEVICE std::int64_t window_argmax(const GridGeometry& g, const T* plane,
                                              const std::int64_t* o) {
  std::int64_t best = -1;
  T best_value = T(0);
  for (std::int64_t a = 0; a < g.window[0]; ++a)
    for (std::int64_t b = 0; b < g.window[1]; ++b)
      for (std::int64_t e = 0; e < g.window[2]; ++e) {
        const std::int64_t cell = window_cell(g, o, a, b, e);
        const T v = plane[cell];
        if (best < 0 || v > best_value || v != v) {  // a NaN wins, as it propagates
          best = cell;
          best_value = v;
          if (v != v) return best;
        }
      }
  return best;
}

template <class T>
struct PoolForward {
  GridGeometry g;
  bool max;
  const T* x;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    std::int64_t c, o[3];
    split_cell(i, g.out, c, o);
    const T* plane = x + c * g.in_cells();
    if (max) {
      y[i] = plane[window_argmax(g, plane, o)];
      return;
    }
    T sum = T(0);
    for (std::int64_t a = 0; a < g.window[0]; ++a)
      for (std::int64_t b = 0; b < g.window[1]; ++b)
        for (std::int64_t e = 0; e < g.window[2]; ++e) sum += plane[window_cell(g, o, a, b, e)];
    y[i] = sum / static_cast<T>(g.window_cells());
  }
};

// Output coordinates on one axis whose window holds input coordinate i: [first, last].
DTRAIN_HOST_DEVICE inline void windows_holding(const GridGeometry& g, int axis, std::int64_t i,
                                               std::int64_t& first, std::int64_t& last) {
  const std::int64_t s = g.stride[axis], k = g.window[axis];
  first = i - k + 1 <= 0 ? 0 : (i - k + 1 + s - 1) / s;
  last = i / s;
  if (last > g.out[axis] - 1) last = g.out[axis] - 1;
}

template <class T>
struct PoolBackward {
  GridGeometry g;
  bool max;
  const T* x;
  const T* dy;
  T* dx;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    std::int64_t c, at[3], lo[3], hi[3];
    split_cell(i, g.in, c, at);
    for (int a = 0; a < 3; ++a) windows_holding(g, a, at[a], lo[a], hi[a]);
    const T* plane = x + c * g.in_cells();
    const std::int64_t cell = i - c * g.in_cells();
    T sum = T(0);
    std::int64_t o[3];
    for (o[0] = lo[0]; o[0] <= hi[0]; ++o[0])
      for (o[1] = lo[1]; o[1] <= hi[1]; ++o[1])
        for (o[2] = lo[2]; o[2] <= hi[2]; ++o[2]) {
          const T g_out = dy[c * g.out_cells() + (o[0] * g.out[1] + o[1]) * g.out[2] + o[2]];
          if (!max)
            sum += g_out;
          else if (window_argmax(g, plane, o) == cell)
            sum += g_out;
        }
    dx[i] = max ? sum : sum / static_cast<T>(g.window_cells());
  }
};

template <class T>
struct UpsampleForward {
  GridGeometry g;
  const T* x;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    std::int64_t c, o[3];
    split_cell(i, g.out, c, o);
    y[i] = x[c * g.in_cells() + ((o[0] / g.stride[0]) * g.in[1] + o[1] / g.stride[1]) * g.in[2] +
             o[2] / g.stride[2]];
  }
};

template <class T>
struct UpsampleBackward {
  GridGeometry g;
  const T* dy;
  T* dx;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const {
    std::int64_t c, at[3];
    split_cell(i, g.in, c, at);
    T sum = T(0);
    for (std::int64_t a = 0; a < g.stride[0]; ++a)
      for (std::int64_t b = 0; b < g.stride[1]; ++b)
        for (std::int64_t e = 0; e < g.stride[2]; ++e)
          sum += dy[c * g.out_cells() +
                    ((at[0] * g.stride[0] + a) * g.out[1] + at[1] * g.stride[1] + b) * g.out[2] +
                    at[2] * g.stride[2] + e];
    dx[i] = sum;
  }
};

// ---- Host loops over windows ----------------------------------------------------------------
// Planes are (sample, channel) pairs, each in[0] x in[1] x in[2] cells (out[...] for outputs).

// Whether the gather's window_argmax moves from `best` (the window's earlier cells) to a later
// cell v: v is larger, or v is NaN and best is not (the first NaN wins). Written as one unordered
// comparison and one ordered one, which GCC vectorises.
template <class T>
inline bool takes(T best, T v) {
  return !(v <= best) && best == best;
}
template <class T>
inline T keep_max(T best, T v) {
  return takes(best, v) ? v : best;
}

// Whether the max-pooling fast path applies: 2-D (depth 1), 2 x 2 windows at stride 2, the
// windows tiling the plane without overlap (a CNN's usual pooling).
inline bool max_pool_2x2(const GridGeometry& g) {
  return g.in[0] == 1 && g.window[1] == 2 && g.window[2] == 2 && g.stride[1] == 2 &&
         g.stride[2] == 2;
}

// 2 x 2 max pooling, stride 2, of one row of windows: input rows r0, r1, output row y. Branchless
// (a select per window cell, in the gather's order), so the compiler vectorises it.
template <class T>
inline void max_pool_2x2_row(const T* __restrict r0, const T* __restrict r1, T* __restrict y,
                             std::int64_t ow_count) {
  for (std::int64_t ow = 0; ow < ow_count; ++ow) {
    const std::int64_t w = 2 * ow;
    y[ow] = keep_max(keep_max(keep_max(r0[w], r0[w + 1]), r1[w]), r1[w + 1]);
  }
}

// Its backward: each window's gradient stored at the window's first largest cell, zeros at the
// other three (no zero fill first: the windows cover these rows once each).
template <class T>
inline void max_pool_2x2_row_backward(const T* __restrict r0, const T* __restrict r1,
                                      const T* __restrict dy, T* __restrict d0, T* __restrict d1,
                                      std::int64_t ow_count) {
  for (std::int64_t ow = 0; ow < ow_count; ++ow) {
    const std::int64_t w = 2 * ow;
    // T(0) + dy: the gather's sum of one term, +0 for a gradient of -0.
    const T a = r0[w], b = r0[w + 1], c = r1[w], e = r1[w + 1], g = T(0) + dy[ow];
    // The gradient follows the kept cell through the selects (one condition per select).
    const bool sb = takes(a, b);
    const T ab = sb ? b : a;
    T ga = sb ? T(0) : g, gb = sb ? g : T(0);
    const bool sc = takes(ab, c);
    const T abc = sc ? c : ab;
    ga = sc ? T(0) : ga;
    gb = sc ? T(0) : gb;
    T gc = sc ? g : T(0);
    const bool se = takes(abc, e);
    d0[w] = se ? T(0) : ga;
    d0[w + 1] = se ? T(0) : gb;
    d1[w] = se ? T(0) : gc;
    d1[w + 1] = se ? g : T(0);
  }
}

// Forward pooling of `planes` planes. Each output row accumulates one window row at a time, so
// the innermost loop runs along the output row (vectorisable when the window's width is its
// stride) and every output sees its window in the gather's (a, b, e) order: the same maximum
// (ties and NaN included) and the same sums.
template <class T>
void pool_forward_host(GridGeometry g, bool max, std::int64_t planes, const T* x, T* y) {
  const std::int64_t OW = g.out[2], KW = g.window[2], SW = g.stride[2];
  if (max && max_pool_2x2(g)) {
    for (std::int64_t p = 0; p < planes; ++p)
      for (std::int64_t o1 = 0; o1 < g.out[1]; ++o1) {
        const T* r0 = x + p * g.in_cells() + 2 * o1 * g.in[2];
        max_pool_2x2_row(r0, r0 + g.in[2], y + (p * g.out[1] + o1) * OW, OW);
      }
    return;
  }
  for (std::int64_t p = 0; p < planes; ++p) {
    const T* plane = x + p * g.in_cells();
    for (std::int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (std::int64_t o1 = 0; o1 < g.out[1]; ++o1) {
        T* yr = y + (p * g.out[0] + o0) * g.out[1] * OW + o1 * OW;
        bool first = true;
        for (std::int64_t a = 0; a < g.window[0]; ++a)
          for (std::int64_t b = 0; b < g.window[1]; ++b) {
            const T* xr =
                plane + ((o0 * g.stride[0] + a) * g.in[1] + o1 * g.stride[1] + b) * g.in[2];
            for (std::int64_t e = 0; e < KW; ++e) {
              const T* xe = xr + e;
              if (first && max) {
                for (std::int64_t ow = 0; ow < OW; ++ow) yr[ow] = xe[ow * SW];
              } else if (first) {
                for (std::int64_t ow = 0; ow < OW; ++ow) yr[ow] = T(0) + xe[ow * SW];
              } else if (max) {
                // A NaN wins and stays (v > NaN is false); ties keep the first value.
                for (std::int64_t ow = 0; ow < OW; ++ow) {
                  const T v = xe[ow * SW], best = yr[ow];
                  yr[ow] = (v > best || (v != v && best == best)) ? v : best;
                }
              } else {
                for (std::int64_t ow = 0; ow < OW; ++ow) yr[ow] += xe[ow * SW];
              }
              first = false;
            }
          }
        if (!max)
          for (std::int64_t ow = 0; ow < OW; ++ow)
            yr[ow] = yr[ow] / static_cast<T>(g.window_cells());
      }
  }
}

// Backward pooling: dx = 0, then each output's gradient goes to its window's first largest cell
// (max, the argmax recomputed from x: no state kept between the passes) or to every cell of its
// window (average, divided once at the end as the gather does). Non-overlapping windows store
// each cell once; overlapping ones add in output order.
template <class T>
void pool_backward_host(GridGeometry g, bool max, std::int64_t planes, const T* x, const T* dy,
                        T* dx) {
  const std::int64_t in_cells = g.in_cells(), out_cells = g.out_cells();
  if (max && max_pool_2x2(g)) {
    const std::int64_t IW = g.in[2], OW = g.out[2];
    for (std::int64_t p = 0; p < planes; ++p) {
      T* dxp = dx + p * in_cells;
      for (std::int64_t o1 = 0; o1 < g.out[1]; ++o1) {
        const std::int64_t at = p * in_cells + 2 * o1 * IW;
        T* d0 = dx + at;
        max_pool_2x2_row_backward(x + at, x + at + IW, dy + (p * g.out[1] + o1) * OW, d0, d0 + IW,
                                  OW);
        if (IW > 2 * OW) {  // a column no window covers
          std::fill(d0 + 2 * OW, d0 + IW, T(0));
          std::fill(d0 + IW + 2 * OW, d0 + 2 * IW, T(0));
        }
      }
      std::fill(dxp + 2 * g.out[1] * IW, dxp + in_cells, T(0));  // rows no window covers
    }
    return;
  }
  std::fill(dx, dx + planes * in_cells, T(0));
  for (std::int64_t p = 0; p < planes; ++p) {
    const T* plane = x + p * in_cells;
    const T* dyp = dy + p * out_cells;
    T* dxp = dx + p * in_cells;
    std::int64_t o[3];
    for (o[0] = 0; o[0] < g.out[0]; ++o[0])
      for (o[1] = 0; o[1] < g.out[1]; ++o[1]) {
        const T* dyr = dyp + (o[0] * g.out[1] + o[1]) * g.out[2];
        for (o[2] = 0; o[2] < g.out[2]; ++o[2]) {
          const T grad = dyr[o[2]];
          if (max) {
            dxp[window_argmax(g, plane, o)] += grad;
            continue;
          }
          for (std::int64_t a = 0; a < g.window[0]; ++a)
            for (std::int64_t b = 0; b < g.window[1]; ++b) {
              T* d = dxp + window_cell(g, o, a, b, 0);
              for (std::int64_t e = 0; e < g.window[2]; ++e) d[e] += grad;
            }
        }
      }
    if (!max)
      for (std::int64_t i = 0; i < in_cells; ++i)
        dxp[i] = dxp[i] / static_cast<T>(g.window_cells());
  }
}

// Upsampling forward: each input row written `stride` times along every axis.
template <class T>
void upsample_forward_host(GridGeometry g, std::int64_t planes, const T* x, T* y) {
  const std::int64_t S2 = g.stride[2], IW = g.in[2], OW = g.out[2];
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (std::int64_t o1 = 0; o1 < g.out[1]; ++o1) {
        const T* xr = x + ((p * g.in[0] + o0 / g.stride[0]) * g.in[1] + o1 / g.stride[1]) * IW;
        T* yr = y + ((p * g.out[0] + o0) * g.out[1] + o1) * OW;
        if (S2 == 2)
          for (std::int64_t i = 0; i < IW; ++i) yr[2 * i] = yr[2 * i + 1] = xr[i];
        else
          for (std::int64_t i = 0; i < IW; ++i)
            for (std::int64_t e = 0; e < S2; ++e) yr[i * S2 + e] = xr[i];
      }
}

// Upsampling backward: each input cell sums its block of output cells in the gather's (a, b, e)
// order, one input row at a time.
template <class T>
void upsample_backward_host(GridGeometry g, std::int64_t planes, const T* dy, T* dx) {
  const std::int64_t S2 = g.stride[2], IW = g.in[2], OW = g.out[2];
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t i0 = 0; i0 < g.in[0]; ++i0)
      for (std::int64_t i1 = 0; i1 < g.in[1]; ++i1) {
        T* dr = dx + ((p * g.in[0] + i0) * g.in[1] + i1) * IW;
        std::fill(dr, dr + IW, T(0));
        for (std::int64_t a = 0; a < g.stride[0]; ++a)
          for (std::int64_t b = 0; b < g.stride[1]; ++b) {
            const T* yr =
                dy + ((p * g.out[0] + i0 * g.stride[0] + a) * g.out[1] + i1 * g.stride[1] + b) * OW;
            for (std::int64_t e = 0; e < S2; ++e)
              for (std::int64_t i = 0; i < IW; ++i) dr[i] += yr[i * S2 + e];
          }
      }
}

// Reads a channels-first sample shape with `dims` grid axes into g.channels and g.in.
inline void read_grid(const char* layer, int dims, const Shape& in, GridGeometry& g) {
  DTRAIN_REQUIRE(
      static_cast<int>(in.size()) == dims + 1, layer,
      "expects samples [channels, " << dims << " grid axes] but receives " << shape_string(in));
  g.channels = in[0];
  for (int a = 0; a < dims; ++a) g.in[3 - dims + a] = in[static_cast<std::size_t>(a) + 1];
}

}  // namespace detail

/// Max or average pooling (see Pool).
template <class T, class Exec>
class PoolLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit PoolLayer(const Pool& s) : spec_(s) {}
  const char* kind() const noexcept override {
    static const char* const names[2][3] = {{"maxpool1d", "maxpool2d", "maxpool3d"},
                                            {"avgpool1d", "avgpool2d", "avgpool3d"}};
    return names[spec_.kind == Pool::max ? 0 : 1][spec_.dims - 1];
  }
  Shape configure(const Shape& in) override {
    detail::read_grid(kind(), spec_.dims, in, g_);
    Shape out{g_.channels};
    for (int a = 3 - spec_.dims; a < 3; ++a) {
      DTRAIN_REQUIRE(g_.in[a] >= spec_.kernel, kind(),
                     "window " << spec_.kernel << " exceeds input " << shape_string(in));
      g_.window[a] = spec_.kernel;
      g_.stride[a] = spec_.stride;
      g_.out[a] = (g_.in[a] - spec_.kernel) / spec_.stride + 1;
      out.push_back(g_.out[a]);
    }
    return out;
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    if constexpr (runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, kind(), &detail::pool_forward_host<T>, g_,
                               spec_.kind == Pool::max, rows * g_.channels, x, y);
    else
      for_each_index<detail::PoolForward<T>>(this->exec(), s, kind(), rows * this->output_size(),
                                             g_, spec_.kind == Pool::max, x, y);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    if (!dx) return;
    if constexpr (runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, kind(), &detail::pool_backward_host<T>, g_,
                               spec_.kind == Pool::max, rows * g_.channels, x, dy, dx);
    else
      for_each_index<detail::PoolBackward<T>>(this->exec(), s, kind(), rows * this->input_size(),
                                              g_, spec_.kind == Pool::max, x, dy, dx);
  }

 private:
  Pool spec_;
  GridGeometry g_;
};

/// Nearest-neighbour upsampling (see Upsample).
template <class T, class Exec>
class UpsampleLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit UpsampleLayer(const Upsample& s) : spec_(s) {}
  const char* kind() const noexcept override {
    static const char* const names[] = {"upsample1d", "upsample2d", "upsample3d"};
    return names[spec_.dims - 1];
  }
  Shape configure(const Shape& in) override {
    detail::read_grid(kind(), spec_.dims, in, g_);
    Shape out{g_.channels};
    for (int a = 3 - spec_.dims; a < 3; ++a) {
      g_.stride[a] = spec_.scale;
      g_.out[a] = g_.in[a] * spec_.scale;
      out.push_back(g_.out[a]);
    }
    return out;
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    if constexpr (runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, kind(), &detail::upsample_forward_host<T>, g_, rows * g_.channels,
                               x, y);
    else
      for_each_index<detail::UpsampleForward<T>>(this->exec(), s, kind(),
                                                 rows * this->output_size(), g_, x, y);
  }
  void backward(stream_type s, const T*, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    if (!dx) return;
    if constexpr (runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, kind(), &detail::upsample_backward_host<T>, g_,
                               rows * g_.channels, dy, dx);
    else
      for_each_index<detail::UpsampleBackward<T>>(this->exec(), s, kind(),
                                                  rows * this->input_size(), g_, dy, dx);
  }

 private:
  Upsample spec_;
  GridGeometry g_;
};

}  // namespace dtrain
