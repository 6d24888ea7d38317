// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the dense built-in layers (Linear, the activations, LayerNorm, Dropout) as
// Layer<T, Exec>. Their kernels are members every policy provides (GEMM and the element-wise
// kernels of <dtrain/exec/exec_traits.hpp>); layers added since bring their own (conv.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/model/layer.hpp>
#include <dtrain/model/layers.hpp>

namespace dtrain {

/// y = x W^T + b over flat samples (see Linear).
template <class T, class Exec>
class LinearLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit LinearLayer(const Linear& s) : spec_(s) {}
  const char* kind() const noexcept override { return "linear"; }
  std::int64_t in_features() const noexcept { return spec_.in_features; }
  Shape configure(const Shape& in) override {
    DTRAIN_REQUIRE(static_cast<std::int64_t>(element_count(in)) == spec_.in_features, "Linear",
                   "expects " << spec_.in_features << " features but receives samples of shape "
                              << shape_string(in));
    return {spec_.out_features};
  }
  std::vector<LayerParam> params() const override {
    return {{"weight", {spec_.out_features, spec_.in_features}, 0},
            {"bias", {spec_.out_features}, weight_count()}};
  }
  void init(std::uint64_t seed, std::uint64_t index, T* w) override {
    init_weights(spec_.init, seed, index, w, weight_count(), static_cast<double>(spec_.in_features),
                 static_cast<double>(spec_.out_features));
    for (std::int64_t i = 0; i < spec_.out_features; ++i)
      w[weight_count() + static_cast<std::size_t>(i)] = T(0);
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    const std::int64_t in = spec_.in_features, out = spec_.out_features;
    this->exec().gemm(s, false, true, rows, out, in, T(1), x, in, this->parameters(), in, T(0), y,
                      out);
    this->exec().bias_add(s, y, static_cast<const T*>(bias()), rows, out);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    const std::int64_t in = spec_.in_features, out = spec_.out_features;
    this->exec().gemm(s, true, false, out, in, rows, T(1), dy, out, x, in, T(1), this->gradients(),
                      in);
    this->exec().bias_grad(s, dy, this->gradients() + weight_count(), rows, out);
    if (dx)
      this->exec().gemm(s, false, false, rows, in, out, T(1), dy, out, this->parameters(), in, T(0),
                        dx, in);
  }

 private:
  std::size_t weight_count() const noexcept {
    return static_cast<std::size_t>(spec_.out_features * spec_.in_features);
  }
  T* bias() const noexcept { return this->parameters() + weight_count(); }
  Linear spec_;
};

/// An element-wise activation (Relu, Gelu, Tanh): any shape, unchanged.
template <class T, class Exec>
class ActivationLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit ActivationLayer(host::Activation f) : activation_(f) {}
  const char* kind() const noexcept override { return host::name_of(activation_); }
  Shape configure(const Shape& in) override { return in; }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    this->exec().activation_forward(s, activation_, x, y, count(rows));
  }
  void backward(stream_type s, const T* x, const T* y, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    if (dx) this->exec().activation_backward(s, activation_, x, y, dy, dx, count(rows));
  }

 private:
  std::size_t count(std::int64_t rows) const {
    return static_cast<std::size_t>(rows * this->input_size());
  }
  host::Activation activation_;
};

/// Layer normalisation over all elements of a sample (see LayerNorm).
template <class T, class Exec>
class LayerNormLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit LayerNormLayer(const LayerNorm& s) : spec_(s) {}
  const char* kind() const noexcept override { return "layernorm"; }
  std::int64_t features() const noexcept { return spec_.features; }
  Shape configure(const Shape& in) override {
    DTRAIN_REQUIRE(static_cast<std::int64_t>(element_count(in)) == spec_.features, "LayerNorm",
                   "expects " << spec_.features << " features but receives samples of shape "
                              << shape_string(in));
    return in;
  }
  std::vector<LayerParam> params() const override {
    return {{"weight", {spec_.features}, 0},
            {"bias", {spec_.features}, static_cast<std::size_t>(spec_.features)}};
  }
  void init(std::uint64_t, std::uint64_t, T* p) override {
    for (std::int64_t i = 0; i < spec_.features; ++i) {
      p[i] = T(1);
      p[spec_.features + i] = T(0);
    }
  }
  void reserve(std::int64_t rows) override {
    if (rows <= rows_) return;
    Allocator& a = this->exec().allocator();
    mean_ = Tensor({rows}, dtype_of_v<T>, a);
    rstd_ = Tensor({rows}, dtype_of_v<T>, a);
    scratch_ = Tensor({rows, spec_.features}, dtype_of_v<T>, a);
    rows_ = rows;
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    this->exec().layernorm_forward(s, x, gamma(), beta(), y, mean(), rstd(), rows, spec_.features,
                                   spec_.eps);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    // dx is needed by the formula's row terms anyway; use scratch when the caller wants none.
    T* out = dx ? dx : static_cast<T*>(scratch_.raw());
    T* dgamma = this->gradients();
    this->exec().layernorm_backward(s, x, gamma(), static_cast<const T*>(mean()),
                                    static_cast<const T*>(rstd()), dy, out, dgamma,
                                    dgamma + spec_.features, rows, spec_.features);
  }

 private:
  const T* gamma() const noexcept { return this->parameters(); }
  const T* beta() const noexcept { return this->parameters() + spec_.features; }
  T* mean() noexcept { return static_cast<T*>(mean_.raw()); }
  T* rstd() noexcept { return static_cast<T*>(rstd_.raw()); }
  LayerNorm spec_;
  Tensor mean_, rstd_, scratch_;
  std::int64_t rows_ = 0;
};

/// Inverted dropout (see Dropout): any shape, unchanged.
template <class T, class Exec>
class DropoutLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit DropoutLayer(const Dropout& s) : spec_(s) {}
  const char* kind() const noexcept override { return "dropout"; }
  Shape configure(const Shape& in) override { return in; }
  void init(std::uint64_t seed, std::uint64_t index, T*) override {
    // A per-layer key: two dropout layers in one model must not share masks.
    const auto block = Philox(seed)(0x64726f706f7574ull /* "dropout" */, index);
    key_ = (static_cast<std::uint64_t>(block[1]) << 32) | block[0];
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows,
               const PassContext& ctx) override {
    const std::int64_t cols = this->input_size();
    if (!ctx.training || spec_.p == 0.0f) {
      this->exec().copy_d2d(s, y, x, static_cast<std::size_t>(rows * cols) * sizeof(T));
      return;
    }
    this->exec().dropout_forward(s, x, y, rows, cols, spec_.p, key_, ctx.step, ctx.sample_offset,
                                 ctx.sample_ids);
  }
  void backward(stream_type s, const T*, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext& ctx) override {
    if (!dx) return;
    const std::int64_t cols = this->input_size();
    if (!ctx.training || spec_.p == 0.0f) {
      this->exec().copy_d2d(s, dx, dy, static_cast<std::size_t>(rows * cols) * sizeof(T));
      return;
    }
    this->exec().dropout_backward(s, dy, dx, rows, cols, spec_.p, key_, ctx.step, ctx.sample_offset,
                                  ctx.sample_ids);
  }

 private:
  Dropout spec_;
  std::uint64_t key_ = 0;
};

}  // namespace dtrain
