// SPDX-License-Identifier: BSD-3-Clause
// dtrain: pooling (max, average) and nearest-neighbour upsampling as Layer<T, Exec>. One source
// for every policy: each kernel is an element-wise functor run by for_each_index (a host loop or a
// device grid). Backward passes gather (each input cell sums the output cells that used it), so
// their sums have a fixed order and no atomics.
#pragma once

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
    for_each_index<detail::PoolForward<T>>(this->exec(), s, kind(), rows * this->output_size(), g_,
                                           spec_.kind == Pool::max, x, y);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    if (!dx) return;
    for_each_index<detail::PoolBackward<T>>(this->exec(), s, kind(), rows * this->input_size(), g_,
                                            spec_.kind == Pool::max, x, dy, dx);
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
    for_each_index<detail::UpsampleForward<T>>(this->exec(), s, kind(), rows * this->output_size(),
                                               g_, x, y);
  }
  void backward(stream_type s, const T*, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    if (!dx) return;
    for_each_index<detail::UpsampleBackward<T>>(this->exec(), s, kind(), rows * this->input_size(),
                                                g_, dy, dx);
  }

 private:
  Upsample spec_;
  GridGeometry g_;
};

}  // namespace dtrain
