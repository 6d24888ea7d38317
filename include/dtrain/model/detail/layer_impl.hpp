// SPDX-License-Identifier: BSD-3-Clause
// dtrain: private layer implementations behind Sequential. Each layer is bound to a slice of the
// parameter arena and the matching slice of the gradient arena (both exec memory of the model's
// execution policy); backward accumulates into its gradient slice, so micro-batches add up until
// zero_grad. Every kernel is queued through the policy on its compute stream; a layer body never
// reads or writes exec memory from the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/model/layers.hpp>

namespace dtrain {
namespace detail {

/// Where a forward pass is: decides dropout masks. `sample_ids` (optional, exec memory) names the
/// global sample index of each row; otherwise row r is sample `sample_offset + r`.
struct PassContext {
  bool training = true;
  std::uint64_t step = 0;
  std::int64_t sample_offset = 0;
  const std::int64_t* sample_ids = nullptr;
};

/// One learnable tensor of a layer: name, shape and offset (elements) inside the layer's slice.
struct LayerParam {
  const char* name;
  Shape shape;
  std::size_t offset;
};

/// A layer over scalar T whose kernels run through execution policy Exec. Pointers handed to
/// forward/backward/bind are exec memory; init writes host memory that the model uploads.
template <class T, class Exec>
class LayerImpl {
 public:
  using stream_type = typename Exec::stream_type;
  virtual ~LayerImpl() = default;
  virtual const char* kind() const noexcept = 0;
  virtual std::int64_t in_features() const noexcept = 0;  // 0: keeps whatever width it gets
  virtual std::int64_t out_features(std::int64_t in) const noexcept { return in; }
  virtual std::size_t param_count() const noexcept { return 0; }
  virtual std::vector<LayerParam> params() const { return {}; }
  /// Binds the layer to its arena slices (exec memory) and the policy that runs it.
  virtual void bind(Exec& exec, T* params, T* grads) noexcept {
    exec_ = &exec;
    (void)params;
    (void)grads;
  }
  /// Writes the initial parameters for `seed` into `host_params` (host memory, param_count()
  /// elements) and derives any per-layer keys.
  virtual void init(std::uint64_t /*seed*/, std::uint64_t /*layer_index*/, T* /*host_params*/) {}
  /// Makes room for `rows` rows of per-row scratch (exec memory). Not called concurrently with
  /// queued work that uses the old scratch; the policy's deallocation orders itself after it.
  virtual void reserve(std::int64_t /*rows*/, std::int64_t /*in*/) {}
  /// Queues y = f(x) for `rows` rows on `s`; x stays alive until backward.
  virtual void forward(stream_type s, const T* x, T* y, std::int64_t rows, std::int64_t in,
                       const PassContext& ctx) = 0;
  /// Queues the accumulation of parameter gradients and dx (null: the caller needs none) on `s`.
  virtual void backward(stream_type s, const T* x, const T* y, const T* dy, T* dx,
                        std::int64_t rows, std::int64_t in, const PassContext& ctx) = 0;

 protected:
  Exec* exec_ = nullptr;
};

template <class T, class Exec>
class LinearImpl final : public LayerImpl<T, Exec> {
 public:
  using typename LayerImpl<T, Exec>::stream_type;
  explicit LinearImpl(const Linear& s) : spec_(s) {}
  const char* kind() const noexcept override { return "linear"; }
  std::int64_t in_features() const noexcept override { return spec_.in_features; }
  std::int64_t out_features(std::int64_t) const noexcept override { return spec_.out_features; }
  std::size_t param_count() const noexcept override {
    return static_cast<std::size_t>(spec_.out_features * spec_.in_features + spec_.out_features);
  }
  std::vector<LayerParam> params() const override {
    return {{"weight", {spec_.out_features, spec_.in_features}, 0},
            {"bias", {spec_.out_features}, weight_count()}};
  }
  void bind(Exec& exec, T* p, T* g) noexcept override {
    this->exec_ = &exec;
    weight_ = p;
    bias_ = p ? p + weight_count() : nullptr;
    weight_grad_ = g;
    bias_grad_ = g ? g + weight_count() : nullptr;
  }
  void init(std::uint64_t seed, std::uint64_t index, T* w) override {
    RngStream rng(seed, index);
    const double fan_in = static_cast<double>(spec_.in_features);
    const double fan_out = static_cast<double>(spec_.out_features);
    const std::size_t n = weight_count();
    switch (spec_.init) {
      case Init::kaiming_uniform:
      case Init::xavier_uniform: {
        const double bound = spec_.init == Init::kaiming_uniform
                                 ? std::sqrt(6.0 / fan_in)
                                 : std::sqrt(6.0 / (fan_in + fan_out));
        for (std::size_t i = 0; i < n; ++i)
          w[i] = static_cast<T>((2.0 * rng.uniform_double() - 1.0) * bound);
        break;
      }
      case Init::kaiming_normal:
      case Init::xavier_normal: {
        const double stddev = spec_.init == Init::kaiming_normal
                                  ? std::sqrt(2.0 / fan_in)
                                  : std::sqrt(2.0 / (fan_in + fan_out));
        for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>(rng.normal() * stddev);
        break;
      }
    }
    for (std::int64_t i = 0; i < spec_.out_features; ++i) w[n + static_cast<std::size_t>(i)] = T(0);
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, std::int64_t in,
               const PassContext&) override {
    const std::int64_t out = spec_.out_features;
    this->exec_->gemm(s, false, true, rows, out, in, T(1), x, in, weight_, in, T(0), y, out);
    this->exec_->bias_add(s, y, static_cast<const T*>(bias_), rows, out);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                std::int64_t in, const PassContext&) override {
    const std::int64_t out = spec_.out_features;
    this->exec_->gemm(s, true, false, out, in, rows, T(1), dy, out, x, in, T(1), weight_grad_, in);
    this->exec_->bias_grad(s, dy, bias_grad_, rows, out);
    if (dx)
      this->exec_->gemm(s, false, false, rows, in, out, T(1), dy, out, weight_, in, T(0), dx, in);
  }

 private:
  std::size_t weight_count() const noexcept {
    return static_cast<std::size_t>(spec_.out_features * spec_.in_features);
  }
  Linear spec_;
  const T* weight_ = nullptr;
  T* bias_ = nullptr;
  T* weight_grad_ = nullptr;
  T* bias_grad_ = nullptr;
};

template <class T, class Exec>
class ActivationImpl final : public LayerImpl<T, Exec> {
 public:
  using typename LayerImpl<T, Exec>::stream_type;
  explicit ActivationImpl(host::Activation f) : activation_(f) {}
  const char* kind() const noexcept override { return host::name_of(activation_); }
  std::int64_t in_features() const noexcept override { return 0; }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, std::int64_t in,
               const PassContext&) override {
    this->exec_->activation_forward(s, activation_, x, y, static_cast<std::size_t>(rows * in));
  }
  void backward(stream_type s, const T* x, const T* y, const T* dy, T* dx, std::int64_t rows,
                std::int64_t in, const PassContext&) override {
    if (dx)
      this->exec_->activation_backward(s, activation_, x, y, dy, dx,
                                       static_cast<std::size_t>(rows * in));
  }

 private:
  host::Activation activation_;
};

template <class T, class Exec>
class LayerNormImpl final : public LayerImpl<T, Exec> {
 public:
  using typename LayerImpl<T, Exec>::stream_type;
  explicit LayerNormImpl(const LayerNorm& s) : spec_(s) {}
  const char* kind() const noexcept override { return "layernorm"; }
  std::int64_t in_features() const noexcept override { return spec_.features; }
  std::size_t param_count() const noexcept override {
    return static_cast<std::size_t>(2 * spec_.features);
  }
  std::vector<LayerParam> params() const override {
    return {{"weight", {spec_.features}, 0},
            {"bias", {spec_.features}, static_cast<std::size_t>(spec_.features)}};
  }
  void bind(Exec& exec, T* p, T* g) noexcept override {
    this->exec_ = &exec;
    gamma_ = p;
    beta_ = p ? p + spec_.features : nullptr;
    dgamma_ = g;
    dbeta_ = g ? g + spec_.features : nullptr;
  }
  void init(std::uint64_t, std::uint64_t, T* p) override {
    for (std::int64_t i = 0; i < spec_.features; ++i) {
      p[i] = T(1);
      p[spec_.features + i] = T(0);
    }
  }
  void reserve(std::int64_t rows, std::int64_t in) override {
    if (rows <= rows_) return;
    Allocator& a = this->exec_->allocator();
    mean_ = Tensor({rows}, dtype_of_v<T>, a);
    rstd_ = Tensor({rows}, dtype_of_v<T>, a);
    scratch_ = Tensor({rows, in}, dtype_of_v<T>, a);
    rows_ = rows;
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, std::int64_t in,
               const PassContext&) override {
    this->exec_->layernorm_forward(s, x, static_cast<const T*>(gamma_),
                                   static_cast<const T*>(beta_), y, mean(), rstd(), rows, in,
                                   spec_.eps);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                std::int64_t in, const PassContext&) override {
    // dx is needed by the formula's row terms anyway; use scratch when the caller wants none.
    T* out = dx ? dx : static_cast<T*>(scratch_.raw());
    this->exec_->layernorm_backward(s, x, static_cast<const T*>(gamma_),
                                    static_cast<const T*>(mean()), static_cast<const T*>(rstd()),
                                    dy, out, dgamma_, dbeta_, rows, in);
  }

 private:
  T* mean() noexcept { return static_cast<T*>(mean_.raw()); }
  T* rstd() noexcept { return static_cast<T*>(rstd_.raw()); }
  LayerNorm spec_;
  T* gamma_ = nullptr;
  T* beta_ = nullptr;
  T* dgamma_ = nullptr;
  T* dbeta_ = nullptr;
  Tensor mean_, rstd_, scratch_;
  std::int64_t rows_ = 0;
};

template <class T, class Exec>
class DropoutImpl final : public LayerImpl<T, Exec> {
 public:
  using typename LayerImpl<T, Exec>::stream_type;
  explicit DropoutImpl(const Dropout& s) : spec_(s) {}
  const char* kind() const noexcept override { return "dropout"; }
  std::int64_t in_features() const noexcept override { return 0; }
  void init(std::uint64_t seed, std::uint64_t index, T*) override {
    // A per-layer key: two dropout layers in one model must not share masks.
    const auto block = Philox(seed)(0x64726f706f7574ull /* "dropout" */, index);
    key_ = (static_cast<std::uint64_t>(block[1]) << 32) | block[0];
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, std::int64_t in,
               const PassContext& ctx) override {
    if (!ctx.training || spec_.p == 0.0f) {
      this->exec_->copy_d2d(s, y, x, static_cast<std::size_t>(rows * in) * sizeof(T));
      return;
    }
    this->exec_->dropout_forward(s, x, y, rows, in, spec_.p, key_, ctx.step, ctx.sample_offset,
                                 ctx.sample_ids);
  }
  void backward(stream_type s, const T*, const T*, const T* dy, T* dx, std::int64_t rows,
                std::int64_t in, const PassContext& ctx) override {
    if (!dx) return;
    if (!ctx.training || spec_.p == 0.0f) {
      this->exec_->copy_d2d(s, dx, dy, static_cast<std::size_t>(rows * in) * sizeof(T));
      return;
    }
    this->exec_->dropout_backward(s, dy, dx, rows, in, spec_.p, key_, ctx.step, ctx.sample_offset,
                                  ctx.sample_ids);
  }

 private:
  Dropout spec_;
  std::uint64_t key_ = 0;
};

template <class T, class Exec>
std::unique_ptr<LayerImpl<T, Exec>> make_layer(const LayerSpec& spec) {
  using Ptr = std::unique_ptr<LayerImpl<T, Exec>>;
  struct Maker {
    Ptr operator()(const Linear& s) const { return std::make_unique<LinearImpl<T, Exec>>(s); }
    Ptr operator()(const Relu&) const {
      return std::make_unique<ActivationImpl<T, Exec>>(host::Activation::relu);
    }
    Ptr operator()(const Gelu&) const {
      return std::make_unique<ActivationImpl<T, Exec>>(host::Activation::gelu);
    }
    Ptr operator()(const Tanh&) const {
      return std::make_unique<ActivationImpl<T, Exec>>(host::Activation::tanh);
    }
    Ptr operator()(const LayerNorm& s) const { return std::make_unique<LayerNormImpl<T, Exec>>(s); }
    Ptr operator()(const Dropout& s) const { return std::make_unique<DropoutImpl<T, Exec>>(s); }
  };
  return std::visit(Maker{}, spec);
}

}  // namespace detail
}  // namespace dtrain
