// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the skip connection y = x + body(x) as a Layer<T, Exec>, and make_layer, which builds
// any built-in layer description (the body of a residual block included) for scalar T and
// policy Exec.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/launch.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/model/layer.hpp>
#include <dtrain/model/layers.hpp>
#include <dtrain/model/layers/conv.hpp>
#include <dtrain/model/layers/dense.hpp>
#include <dtrain/model/layers/pool.hpp>

namespace dtrain {

namespace detail {
template <class T>
struct SumOf {
  const T* a;
  const T* b;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const { y[i] = a[i] + b[i]; }
};
template <class T>
struct AddInto {
  const T* a;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::int64_t i) const { y[i] += a[i]; }
};
}  // namespace detail

/// y = x + body(x): the body's layers run in order on the block's input, and the block's output
/// adds the input back; the body's output shape must equal its input shape. Parameters of the
/// body sit in the block's slice in body order, named "<j>_<kind>/<name>"; a model reports the
/// block's gradients ready once, when the whole body is done.
template <class T, class Exec>
class ResidualLayer final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  using LayerPtr = std::unique_ptr<Layer<T, Exec>>;

  explicit ResidualLayer(std::vector<LayerPtr> body) : body_(std::move(body)) {
    DTRAIN_REQUIRE(!body_.empty(), "Residual", "needs at least one layer");
  }
  const char* kind() const noexcept override { return "residual"; }

  Shape configure(const Shape& in) override {
    Shape shape = in;
    offsets_.clear();
    std::size_t total = 0;
    for (std::size_t j = 0; j < body_.size(); ++j) {
      Layer<T, Exec>& layer = *body_[j];
      detail::in_layer("Residual", "body layer " + std::to_string(j) + " (" + layer.kind() + ")",
                       [&] {
                         shape = layer.setup(shape);
                         detail::check_layer_params(layer);
                       });
      offsets_.push_back(total);
      total += layer.param_count();
    }
    count_ = total;
    DTRAIN_REQUIRE(shape == in, "Residual",
                   "the body maps " << shape_string(in) << " to " << shape_string(shape)
                                    << "; a skip connection needs the same shape");
    return in;
  }
  std::vector<LayerParam> params() const override {
    std::vector<LayerParam> out;
    for (std::size_t j = 0; j < body_.size(); ++j)
      for (auto& p : body_[j]->params())
        out.push_back({std::to_string(j) + "_" + body_[j]->kind() + "/" + p.name, p.shape,
                       offsets_[j] + p.offset});
    return out;
  }
  std::size_t param_count() const override { return count_; }
  void init(std::uint64_t seed, std::uint64_t index, T* host) override {
    // Each body layer draws from a stream of its own, derived from the block's index.
    for (std::size_t j = 0; j < body_.size(); ++j)
      body_[j]->init(seed, ((index + 1) << 20) | j, host ? host + offsets_[j] : nullptr);
  }
  void bind(Exec& exec, T* params, T* grads) override {
    Layer<T, Exec>::bind(exec, params, grads);
    for (std::size_t j = 0; j < body_.size(); ++j)
      body_[j]->bind(exec, params ? params + offsets_[j] : nullptr,
                     grads ? grads + offsets_[j] : nullptr);
  }
  void rebind(T* params, T* grads) override {
    Layer<T, Exec>::rebind(params, grads);
    for (std::size_t j = 0; j < body_.size(); ++j)
      body_[j]->rebind(params ? params + offsets_[j] : nullptr,
                       grads ? grads + offsets_[j] : nullptr);
  }
  void reserve(std::int64_t rows) override {
    if (rows <= rows_) return;
    Allocator& a = this->exec().allocator();
    acts_.clear();
    std::int64_t widest = 0;
    for (auto& layer : body_) {
      acts_.emplace_back(Shape{rows, layer->output_size()}, dtype_of_v<T>, a);
      widest = std::max(widest, layer->input_size());
      layer->reserve(rows);
    }
    for (auto& d : grad_) d = Tensor({rows, widest}, dtype_of_v<T>, a);
    rows_ = rows;
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows,
               const PassContext& ctx) override {
    const T* in = x;
    for (std::size_t j = 0; j < body_.size(); ++j) {
      T* out = act(j);
      body_[j]->forward(s, in, out, rows, ctx);
      in = out;
    }
    for_each_index<detail::SumOf<T>>(this->exec(), s, "residual add", rows * this->input_size(), x,
                                     in, y);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext& ctx) override {
    const T* grad_out = dy;
    for (std::size_t j = body_.size(); j-- > 0;) {
      const T* in = j == 0 ? x : act(j - 1);
      T* grad_in = j == 0 ? dx : static_cast<T*>(grad_[j % 2].raw());
      body_[j]->backward(s, in, act(j), grad_out, grad_in, rows, ctx);
      grad_out = grad_in;
    }
    if (dx)  // the skip path's share
      for_each_index<detail::AddInto<T>>(this->exec(), s, "residual backward",
                                         rows * this->input_size(), dy, dx);
  }

 private:
  T* act(std::size_t j) { return static_cast<T*>(acts_[j].raw()); }
  std::vector<LayerPtr> body_;
  std::vector<std::size_t> offsets_;
  std::size_t count_ = 0;
  std::vector<Tensor> acts_;
  Tensor grad_[2];
  std::int64_t rows_ = 0;
};

namespace detail {
/// Builds the layer a built-in description names, for scalar T and policy Exec.
template <class T, class Exec>
std::unique_ptr<Layer<T, Exec>> make_layer(const LayerSpec& spec) {
  using Ptr = std::unique_ptr<Layer<T, Exec>>;
  struct Maker {
    Ptr operator()(const Input&) const {
      raise<InvalidArgument>("Sequential", "Input may only be the first entry of a layer list");
    }
    Ptr operator()(const Linear& s) const {
      s.check();
      return std::make_unique<LinearLayer<T, Exec>>(s);
    }
    Ptr operator()(const Relu&) const {
      return std::make_unique<ActivationLayer<T, Exec>>(host::Activation::relu);
    }
    Ptr operator()(const Gelu&) const {
      return std::make_unique<ActivationLayer<T, Exec>>(host::Activation::gelu);
    }
    Ptr operator()(const Tanh&) const {
      return std::make_unique<ActivationLayer<T, Exec>>(host::Activation::tanh);
    }
    Ptr operator()(const LayerNorm& s) const {
      s.check();
      return std::make_unique<LayerNormLayer<T, Exec>>(s);
    }
    Ptr operator()(const Dropout& s) const {
      s.check();
      return std::make_unique<DropoutLayer<T, Exec>>(s);
    }
    Ptr operator()(const Conv& s) const {
      s.check();
      return std::make_unique<ConvLayer<T, Exec>>(s);
    }
    Ptr operator()(const Pool& s) const {
      s.check();
      return std::make_unique<PoolLayer<T, Exec>>(s);
    }
    Ptr operator()(const Upsample& s) const {
      s.check();
      return std::make_unique<UpsampleLayer<T, Exec>>(s);
    }
    Ptr operator()(const Residual<>& s) const {
      std::vector<Ptr> body;
      for (std::size_t j = 0; j < s.body.size(); ++j)
        body.push_back(in_layer("Residual", "body layer " + std::to_string(j),
                                [&] { return make_layer<T, Exec>(s.body[j]); }));
      return std::make_unique<ResidualLayer<T, Exec>>(std::move(body));
    }
  };
  return std::visit(Maker{}, spec.base());
}
}  // namespace detail

}  // namespace dtrain
