// Example 03: a layer of one's own. y = x * sigmoid(slope_j * x) with a learned slope per feature
// (Swish with a trainable beta). Everything it needs lives in this one header: the math (host and
// device), a host function and a hand-written CUDA/HIP kernel for each direction, and the one
// class, the Layer, that calls whichever the model's execution policy runs. A layer list names it
// as dtrain::custom<LearnedSwish>(); nothing else of dtrain changes for it.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>

#include <dtrain/model/layer.hpp>

template <class T>
DTRAIN_HOST_DEVICE T sigmoid(T v) {
  using std::exp;
  return T(1) / (T(1) + exp(-v));
}
// The gradients of y = x * sigmoid(b x): dx (unless null) and the slope's share, accumulated.
template <class T>
DTRAIN_HOST_DEVICE void swish_grads(T b, T x, T dy, T* dx, T& dslope) {
  const T s = sigmoid(b * x), ds = s * (T(1) - s);
  if (dx) *dx = dy * (s + b * x * ds);
  dslope += dy * x * x * ds;
}

template <class T>
void swish_forward_host(const T* x, const T* slope, T* y, std::int64_t rows, std::int64_t n) {
  for (std::int64_t i = 0; i < rows * n; ++i) y[i] = x[i] * sigmoid(slope[i % n] * x[i]);
}
template <class T>
void swish_backward_host(const T* x, const T* slope, const T* dy, T* dx, T* dslope,
                         std::int64_t rows, std::int64_t n) {
  for (std::int64_t i = 0; i < rows * n; ++i)
    swish_grads(slope[i % n], x[i], dy[i], dx ? dx + i : nullptr, dslope[i % n]);
}

#if DTRAIN_DEVICE_CODE  // compiled only by nvcc or hipcc
template <class T>
__global__ void swish_forward_kernel(const T* x, const T* slope, T* y, std::int64_t rows,
                                     std::int64_t n) {
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] * sigmoid(slope[i % n] * x[i]);
}
// One thread per feature: the slope's gradient sums its column in row order (deterministic).
template <class T>
__global__ void swish_backward_kernel(const T* x, const T* slope, const T* dy, T* dx, T* dslope,
                                      std::int64_t rows, std::int64_t n) {
  const std::int64_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  T acc = T(0);
  for (std::int64_t i = j; i < rows * n; i += n)
    swish_grads(slope[j], x[i], dy[i], dx ? dx + i : nullptr, acc);
  dslope[j] += acc;
}
#endif

template <class T, class Exec>
class LearnedSwish final : public dtrain::Layer<T, Exec> {
 public:
  using typename dtrain::Layer<T, Exec>::stream_type;
  const char* kind() const noexcept override { return "learned_swish"; }
  dtrain::Shape configure(const dtrain::Shape& in) override { return in; }  // any shape
  std::vector<dtrain::LayerParam> params() const override {
    return {{"slope", {this->input_size()}, 0}};
  }
  void init(std::uint64_t, std::uint64_t, T* host) override {
    for (std::int64_t j = 0; j < this->input_size(); ++j) host[j] = T(1);
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows,
               const dtrain::PassContext&) override {
    const T* slope = this->parameters();
    if constexpr (dtrain::runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, "swish forward", &swish_forward_host<T>, x, slope, y, rows,
                               this->input_size());
#if DTRAIN_DEVICE_CODE
    else
      swish_forward_kernel<T><<<256, 256, 0, s>>>(x, slope, y, rows, this->input_size());
#endif
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const dtrain::PassContext&) override {
    const T* slope = this->parameters();
    const std::int64_t n = this->input_size();
    if constexpr (dtrain::runs_host_kernels_v<Exec>)
      this->exec().host_kernel(s, "swish backward", &swish_backward_host<T>, x, slope, dy, dx,
                               this->gradients(), rows, n);
#if DTRAIN_DEVICE_CODE
    else
      swish_backward_kernel<T>
          <<<(n + 127) / 128, 128, 0, s>>>(x, slope, dy, dx, this->gradients(), rows, n);
#endif
  }
};
