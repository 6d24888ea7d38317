// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the layer interface. Every layer of a Sequential, built-in or the user's own, is a
// Layer<T, Exec>: it checks its input shape, declares its learnable tensors, initialises them,
// and queues its forward and backward kernels on the stream it is given. The model lays every
// layer's parameters and gradients into its two arenas, so bucketed all-reduce, sharded optimizer
// steps, clipping and checkpoints treat a user layer like a built-in one.
//
// Data layout: a batch is `rows` samples, each a dense row-major tensor of input_shape() (no
// batch axis), one after the other: a convolution's [batch, channels, height, width] input is
// rows of channels * height * width elements. Pointers given to forward/backward are exec memory
// (the policy's allocator); a layer queues kernels and never touches exec memory from the host.
// How a layer runs its own kernels on each policy: <dtrain/exec/launch.hpp>.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/exec/launch.hpp>

namespace dtrain {

/// Weight initialisation. Kaiming (He) scales by fan_in with the ReLU gain; Xavier (Glorot) by
/// fan_in + fan_out. Biases start at zero.
enum class Init : unsigned char { kaiming_uniform, kaiming_normal, xavier_uniform, xavier_normal };

/// Where a forward pass is: decides dropout masks. `sample_ids` (optional, exec memory) names the
/// global sample index of each row; otherwise row r is sample `sample_offset + r`.
struct PassContext {
  bool training = true;
  std::uint64_t step = 0;
  std::int64_t sample_offset = 0;
  const std::int64_t* sample_ids = nullptr;
};

/// One learnable tensor of a layer: name (the last part of its checkpoint name), shape and offset
/// (elements) inside the layer's slice of the arenas.
struct LayerParam {
  std::string name;
  Shape shape;
  std::size_t offset = 0;
};

/// "[1, 64, 64]": a shape for messages.
inline std::string shape_string(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

/// Writes `n` initial weights for a layer with the given fans, from a stream that depends only
/// on (seed, layer index): every rank draws the same values. Local.
template <class T>
void init_weights(Init how, std::uint64_t seed, std::uint64_t layer_index, T* w, std::size_t n,
                  double fan_in, double fan_out) {
  RngStream rng(seed, layer_index);
  switch (how) {
    case Init::kaiming_uniform:
    case Init::xavier_uniform: {
      const double bound = how == Init::kaiming_uniform ? std::sqrt(6.0 / fan_in)
                                                        : std::sqrt(6.0 / (fan_in + fan_out));
      for (std::size_t i = 0; i < n; ++i)
        w[i] = static_cast<T>((2.0 * rng.uniform_double() - 1.0) * bound);
      break;
    }
    case Init::kaiming_normal:
    case Init::xavier_normal: {
      const double stddev = how == Init::kaiming_normal ? std::sqrt(2.0 / fan_in)
                                                        : std::sqrt(2.0 / (fan_in + fan_out));
      for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>(rng.normal() * stddev);
      break;
    }
  }
}

/// A layer over scalar T (float for training, double for gradient checks) whose kernels run
/// through execution policy Exec. Implement configure, forward and backward (and params, init
/// when the layer learns something); Sequential calls them in this order: setup (once), bind
/// (once), init (per model init), reserve (when the batch grows), then forward/backward per pass.
/// A layer object belongs to one model; it is used from one thread at a time.
template <class T, class Exec = HostExec>
class Layer {
 public:
  using value_type = T;
  using exec_type = Exec;
  using stream_type = typename Exec::stream_type;

  virtual ~Layer() = default;

  /// Short lower-case name, part of checkpoint names ("layers/3_conv2d/weight") and errors.
  virtual const char* kind() const noexcept = 0;

  /// Checks one sample's input shape and returns its output shape. Called once, when the model is
  /// built; throws InvalidArgument naming the layer and both shapes when the input does not fit.
  virtual Shape configure(const Shape& input) = 0;

  /// The layer's learnable tensors, in the order and at the offsets of its arena slice.
  virtual std::vector<LayerParam> params() const { return {}; }

  /// Writes the initial parameters for `seed` into `host_params` (host memory, param_count()
  /// elements; null for a layer without parameters) and derives any per-layer keys. The same
  /// (seed, layer_index) must give the same values on every rank.
  virtual void init(std::uint64_t /*seed*/, std::uint64_t /*layer_index*/, T* /*host_params*/) {}

  /// Binds the layer to its slices of the parameter and gradient arenas (exec memory) and to the
  /// policy that runs it. An override calls this one first.
  virtual void bind(Exec& exec, T* params, T* grads) {
    exec_ = &exec;
    params_ = params;
    grads_ = grads;
  }

  /// Moves the layer to other slices of the same size (exec memory; null for a layer without
  /// parameters, and for the gradients during a forward): a fully sharded model gathers a unit's
  /// parameters into a working buffer before its forward and its backward, and its gradients go
  /// to a working buffer of their own (FullyShardedSync). No allocation, no kernel. A layer that
  /// keeps pointers derived from its slices, or holds other layers, overrides this and calls it
  /// first; one that reads parameters() and gradients() at each call (the built-in layers) need
  /// not.
  virtual void rebind(T* params, T* grads) {
    params_ = params;
    grads_ = grads;
  }

  /// Makes room for `rows` samples of per-sample scratch (exec memory), when a batch is larger
  /// than any before. Replacing the old scratch is safe: the policy's deallocation orders itself
  /// after the queued work that uses it.
  virtual void reserve(std::int64_t /*rows*/) {}

  /// Queues y = f(x) for `rows` samples on `stream`; x stays alive and unchanged until backward.
  virtual void forward(stream_type stream, const T* x, T* y, std::int64_t rows,
                       const PassContext& ctx) = 0;

  /// Queues the ACCUMULATION of the parameter gradients (into gradients()) and, unless dx is
  /// null (the caller needs none), the input gradient dx (overwritten) for the x, y of the last
  /// forward and the output gradient dy.
  virtual void backward(stream_type stream, const T* x, const T* y, const T* dy, T* dx,
                        std::int64_t rows, const PassContext& ctx) = 0;

  /// Learnable scalars of the layer (the size of its arena slices).
  virtual std::size_t param_count() const {
    std::size_t n = 0;
    for (const auto& p : params()) n += element_count(p.shape);
    return n;
  }

  /// Runs configure and remembers both shapes. Called by the model.
  const Shape& setup(const Shape& input) {
    input_shape_ = input;
    output_shape_ = configure(input);
    return output_shape_;
  }
  const Shape& input_shape() const noexcept { return input_shape_; }
  const Shape& output_shape() const noexcept { return output_shape_; }
  /// Elements of one input (output) sample.
  std::int64_t input_size() const { return static_cast<std::int64_t>(element_count(input_shape_)); }
  std::int64_t output_size() const {
    return static_cast<std::int64_t>(element_count(output_shape_));
  }

 protected:
  /// The policy the layer was bound to (valid from bind on).
  Exec& exec() const noexcept { return *exec_; }
  /// The layer's slice of the parameter (gradient) arena, exec memory; null without parameters.
  T* parameters() const noexcept { return params_; }
  T* gradients() const noexcept { return grads_; }

 private:
  Exec* exec_ = nullptr;
  T* params_ = nullptr;
  T* grads_ = nullptr;
  Shape input_shape_, output_shape_;
};

namespace detail {
// Runs f(); an InvalidArgument from it is thrown again as `op`'s, its detail after `where`
// ("layer 3 (conv)"), with one "dtrain: rank R: " prefix, not two.
template <class F>
decltype(auto) in_layer(const char* op, const std::string& where, F&& f) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    std::string inner = e.what();
    const std::string prefix = "dtrain: rank ";
    if (inner.compare(0, prefix.size(), prefix) == 0) {
      const auto colon = inner.find(": ", prefix.size());
      if (colon != std::string::npos) inner.erase(0, colon + 2);
    }
    raise<InvalidArgument>(op, where + ": " + inner);
  }
}

// A configured layer's own account of its tensors, taken on trust until now: each named (a
// checkpoint path relative to the layer), once, with non-negative extents, inside the layer's
// param_count() elements, no two overlapping (they would alias one another in checkpoints and
// optimizers). Throws InvalidArgument naming the tensors.
template <class T, class Exec>
void check_layer_params(const Layer<T, Exec>& layer) {
  constexpr const char* op = "Layer::params";
  const std::size_t n = layer.param_count();
  const std::vector<LayerParam> ps = layer.params();
  std::vector<std::pair<std::size_t, std::size_t>> order;  // (offset, index)
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const LayerParam& p = ps[i];
    DTRAIN_REQUIRE(!p.name.empty() && p.name.front() != '/' && p.name.back() != '/' &&
                       p.name.find("//") == std::string::npos,
                   op, "tensor name '" << p.name << "' is empty or has an empty path component");
    for (std::size_t j = 0; j < i; ++j)
      DTRAIN_REQUIRE(ps[j].name != p.name, op, "tensor name '" << p.name << "' given twice");
    for (auto e : p.shape)
      DTRAIN_REQUIRE(
          e >= 0, op,
          "tensor '" << p.name << "' has a negative extent in " << shape_string(p.shape));
    const std::size_t count = element_count(p.shape, op);
    DTRAIN_REQUIRE(p.offset <= n && count <= n - p.offset, op,
                   "tensor '" << p.name << "' at [" << p.offset << ", " << p.offset + count
                              << ") ends past the layer's param_count() of " << n);
    if (count) order.emplace_back(p.offset, i);
  }
  std::sort(order.begin(), order.end());
  for (std::size_t k = 1; k < order.size(); ++k) {
    const LayerParam& a = ps[order[k - 1].second];
    const LayerParam& b = ps[order[k].second];
    const std::size_t a_end = a.offset + element_count(a.shape);
    DTRAIN_REQUIRE(b.offset >= a_end, op,
                   "tensors '" << a.name << "' at [" << a.offset << ", " << a_end << ") and '"
                               << b.name << "' at [" << b.offset << ", "
                               << b.offset + element_count(b.shape) << ") overlap");
  }
}
}  // namespace detail

}  // namespace dtrain
