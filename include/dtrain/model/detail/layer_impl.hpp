// dtrain: private layer implementations behind Sequential. Each layer is bound to a slice of the
// parameter arena and the matching slice of the gradient arena; backward accumulates into its
// gradient slice, so micro-batches add up until zero_grad.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/kernels/host/dropout.hpp>
#include <dtrain/kernels/host/gemm.hpp>
#include <dtrain/kernels/host/layernorm.hpp>
#include <dtrain/model/layers.hpp>

namespace dtrain {
namespace detail {

/// Where a forward pass is: decides dropout masks. `sample_ids` (optional) names the global
/// sample index of each row; otherwise row r is sample `sample_offset + r`.
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

template <class T>
class LayerImpl {
 public:
  virtual ~LayerImpl() = default;
  virtual const char* kind() const noexcept = 0;
  virtual std::int64_t in_features() const noexcept = 0;  // 0: keeps whatever width it gets
  virtual std::int64_t out_features(std::int64_t in) const noexcept { return in; }
  virtual std::size_t param_count() const noexcept { return 0; }
  virtual std::vector<LayerParam> params() const { return {}; }
  virtual void bind(T* /*params*/, T* /*grads*/) noexcept {}
  virtual void init(std::uint64_t /*seed*/, std::uint64_t /*layer_index*/) {}
  /// y = f(x) for `rows` rows; x stays alive until backward.
  virtual void forward(const T* x, T* y, std::int64_t rows, std::int64_t in,
                       const PassContext& ctx) = 0;
  /// Accumulates parameter gradients and writes dx (dx null: the caller needs no input gradient).
  virtual void backward(const T* x, const T* y, const T* dy, T* dx, std::int64_t rows,
                        std::int64_t in, const PassContext& ctx) = 0;
};

template <class T>
class LinearImpl final : public LayerImpl<T> {
 public:
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
  void bind(T* p, T* g) noexcept override {
    w_ = p;
    b_ = p + weight_count();
    dw_ = g;
    db_ = g + weight_count();
  }
  void init(std::uint64_t seed, std::uint64_t index) override {
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
          w_[i] = static_cast<T>((2.0 * rng.uniform_double() - 1.0) * bound);
        break;
      }
      case Init::kaiming_normal:
      case Init::xavier_normal: {
        const double stddev = spec_.init == Init::kaiming_normal
                                  ? std::sqrt(2.0 / fan_in)
                                  : std::sqrt(2.0 / (fan_in + fan_out));
        for (std::size_t i = 0; i < n; ++i) w_[i] = static_cast<T>(rng.normal() * stddev);
        break;
      }
    }
    for (std::int64_t i = 0; i < spec_.out_features; ++i) b_[i] = T(0);
  }
  void forward(const T* x, T* y, std::int64_t rows, std::int64_t in, const PassContext&) override {
    const std::int64_t out = spec_.out_features;
    host::gemm<T>(false, true, rows, out, in, T(1), x, in, w_, in, T(0), y, out);
    host::bias_add(y, b_, rows, out);
  }
  void backward(const T* x, const T*, const T* dy, T* dx, std::int64_t rows, std::int64_t in,
                const PassContext&) override {
    const std::int64_t out = spec_.out_features;
    host::gemm<T>(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dw_, in);
    host::bias_grad(dy, db_, rows, out);
    if (dx) host::gemm<T>(false, false, rows, in, out, T(1), dy, out, w_, in, T(0), dx, in);
  }

 private:
  std::size_t weight_count() const noexcept {
    return static_cast<std::size_t>(spec_.out_features * spec_.in_features);
  }
  Linear spec_;
  T* w_ = nullptr;
  T* b_ = nullptr;
  T* dw_ = nullptr;
  T* db_ = nullptr;
};

template <class T>
class ActivationImpl final : public LayerImpl<T> {
 public:
  explicit ActivationImpl(host::Activation f) : f_(f) {}
  const char* kind() const noexcept override { return host::name_of(f_); }
  std::int64_t in_features() const noexcept override { return 0; }
  void forward(const T* x, T* y, std::int64_t rows, std::int64_t in, const PassContext&) override {
    host::activation_forward(f_, x, y, static_cast<std::size_t>(rows * in));
  }
  void backward(const T* x, const T* y, const T* dy, T* dx, std::int64_t rows, std::int64_t in,
                const PassContext&) override {
    if (dx) host::activation_backward(f_, x, y, dy, dx, static_cast<std::size_t>(rows * in));
  }

 private:
  host::Activation f_;
};

template <class T>
class LayerNormImpl final : public LayerImpl<T> {
 public:
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
  void bind(T* p, T* g) noexcept override {
    gamma_ = p;
    beta_ = p + spec_.features;
    dgamma_ = g;
    dbeta_ = g + spec_.features;
  }
  void init(std::uint64_t, std::uint64_t) override {
    for (std::int64_t i = 0; i < spec_.features; ++i) {
      gamma_[i] = T(1);
      beta_[i] = T(0);
    }
  }
  void forward(const T* x, T* y, std::int64_t rows, std::int64_t in, const PassContext&) override {
    if (mean_.size() < static_cast<std::size_t>(rows)) {
      mean_.resize(static_cast<std::size_t>(rows));
      rstd_.resize(static_cast<std::size_t>(rows));
    }
    host::layernorm_forward(x, gamma_, beta_, y, mean_.data(), rstd_.data(), rows, in, spec_.eps);
  }
  void backward(const T* x, const T*, const T* dy, T* dx, std::int64_t rows, std::int64_t in,
                const PassContext&) override {
    // dx is needed by the formula's row terms anyway; use scratch when the caller wants none.
    T* out = dx;
    if (!out) {
      scratch_.resize(static_cast<std::size_t>(rows * in));
      out = scratch_.data();
    }
    host::layernorm_backward(x, gamma_, mean_.data(), rstd_.data(), dy, out, dgamma_, dbeta_, rows,
                             in);
  }

 private:
  LayerNorm spec_;
  T* gamma_ = nullptr;
  T* beta_ = nullptr;
  T* dgamma_ = nullptr;
  T* dbeta_ = nullptr;
  std::vector<T> mean_, rstd_, scratch_;
};

template <class T>
class DropoutImpl final : public LayerImpl<T> {
 public:
  explicit DropoutImpl(const Dropout& s) : spec_(s) {}
  const char* kind() const noexcept override { return "dropout"; }
  std::int64_t in_features() const noexcept override { return 0; }
  void init(std::uint64_t seed, std::uint64_t index) override {
    // A per-layer key: two dropout layers in one model must not share masks.
    const auto block = Philox(seed)(0x64726f706f7574ull /* "dropout" */, index);
    key_ = (static_cast<std::uint64_t>(block[1]) << 32) | block[0];
  }
  void forward(const T* x, T* y, std::int64_t rows, std::int64_t in,
               const PassContext& ctx) override {
    if (!ctx.training || spec_.p == 0.0f) {
      if (x != y)
        for (std::int64_t i = 0; i < rows * in; ++i) y[i] = x[i];
      return;
    }
    host::dropout_forward(x, y, rows, in, spec_.p, key_, ctx.step, ctx.sample_offset,
                          ctx.sample_ids);
  }
  void backward(const T*, const T*, const T* dy, T* dx, std::int64_t rows, std::int64_t in,
                const PassContext& ctx) override {
    if (!dx) return;
    if (!ctx.training || spec_.p == 0.0f) {
      for (std::int64_t i = 0; i < rows * in; ++i) dx[i] = dy[i];
      return;
    }
    host::dropout_backward(dy, dx, rows, in, spec_.p, key_, ctx.step, ctx.sample_offset,
                           ctx.sample_ids);
  }

 private:
  Dropout spec_;
  std::uint64_t key_ = 0;
};

template <class T>
std::unique_ptr<LayerImpl<T>> make_layer(const LayerSpec& spec) {
  struct Maker {
    std::unique_ptr<LayerImpl<T>> operator()(const Linear& s) const {
      return std::make_unique<LinearImpl<T>>(s);
    }
    std::unique_ptr<LayerImpl<T>> operator()(const Relu&) const {
      return std::make_unique<ActivationImpl<T>>(host::Activation::relu);
    }
    std::unique_ptr<LayerImpl<T>> operator()(const Gelu&) const {
      return std::make_unique<ActivationImpl<T>>(host::Activation::gelu);
    }
    std::unique_ptr<LayerImpl<T>> operator()(const Tanh&) const {
      return std::make_unique<ActivationImpl<T>>(host::Activation::tanh);
    }
    std::unique_ptr<LayerImpl<T>> operator()(const LayerNorm& s) const {
      return std::make_unique<LayerNormImpl<T>>(s);
    }
    std::unique_ptr<LayerImpl<T>> operator()(const Dropout& s) const {
      return std::make_unique<DropoutImpl<T>>(s);
    }
  };
  return std::visit(Maker{}, spec);
}

}  // namespace detail
}  // namespace dtrain
