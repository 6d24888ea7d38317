// dtrain: Sequential, a stack of layers with explicit forward and backward over one parameter
// arena and one gradient arena.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/model/detail/layer_impl.hpp>
#include <dtrain/model/layers.hpp>
#include <dtrain/model/loss.hpp>
#include <dtrain/model/metrics.hpp>

namespace dtrain {

namespace detail {
// Anything with ready(offset, count), such as GradientSync.
template <class S, class = void>
struct is_grad_sink : std::false_type {};
template <class S>
struct is_grad_sink<S,
                    std::void_t<decltype(std::declval<S&>().ready(std::size_t{}, std::size_t{}))>>
    : std::true_type {};
// A loader batch: features and labels tensors, per-row dataset indices and a row count.
template <class B, class = void>
struct is_loader_batch : std::false_type {};
template <class B>
struct is_loader_batch<B,
                       std::void_t<decltype(BufferView(std::declval<const B&>().features.view())),
                                   decltype(BufferView(std::declval<const B&>().labels.view())),
                                   decltype(std::declval<const B&>().indices.data()),
                                   decltype(std::size_t(std::declval<const B&>().size))>>
    : std::true_type {};
}  // namespace detail

/// Called during backward, once per layer that has parameters, as soon as that layer's gradients
/// are final: `offset` and `count` are in ELEMENTS of the gradient arena. Layers finish from last
/// to first, so offsets decrease. Runs on the thread that calls backward; it may start an
/// all-reduce of that range but must not touch ranges it has not been given yet.
using GradReadyCallback = std::function<void(std::size_t offset, std::size_t count)>;

/// Options of one forward (and backward) pass.
struct PassOptions {
  /// Training mode enables dropout; evaluation passes do not advance the step counter.
  bool training = true;
  /// Step that selects dropout masks; negative: the model's own count of training forwards.
  /// Pass the optimizer step when micro-batch counts differ between runs (e.g. other rank
  /// counts), so that masks depend only on (seed, step, sample, element).
  std::int64_t step = -1;
  /// Global index of the first sample of the batch (row r is sample sample_offset + r) ...
  std::int64_t sample_offset = 0;
  /// ... unless sample_ids (batch entries, caller-owned) names each row's global sample.
  const std::int64_t* sample_ids = nullptr;
  /// Gradients are scaled by this: 1/k when k equal micro-batches are accumulated.
  double loss_scale = 1.0;
};

/// One learnable tensor of a model: its checkpoint name ("layers/0_linear/weight"), true shape
/// and place (elements) in the arenas.
struct ParameterInfo {
  std::string name;
  Shape shape;
  std::size_t offset = 0;
  std::size_t count = 0;
  std::size_t layer = 0;
};

/// A feed-forward stack of layers over rows of features (row-major [batch, features]) in scalar
/// type T (float for training, double for gradient checks). All parameters live in one contiguous
/// arena and all gradients in another, in layer order, both from the allocator given at
/// construction (host memory: the layers run on the CPU). Local object: not thread-safe; every
/// call is blocking. Parameters are identical on every rank after init(seed) with the same seed.
template <class T>
class BasicSequential {
 public:
  using value_type = T;

  /// Builds the layers, allocates the arenas and initialises as init(0). Widths are checked layer
  /// to layer; throws InvalidArgument on a mismatch or when no layer fixes the input width.
  BasicSequential(std::initializer_list<LayerSpec> layers, Allocator& alloc = default_allocator())
      : BasicSequential(std::vector<LayerSpec>(layers), alloc) {}
  explicit BasicSequential(const std::vector<LayerSpec>& layers,
                           Allocator& alloc = default_allocator()) {
    DTRAIN_REQUIRE(!layers.empty(), "Sequential", "needs at least one layer");
    DTRAIN_REQUIRE(alloc.space() == Space::host, "Sequential",
                   "the layers run on the host but the allocator gives " << name_of(alloc.space())
                                                                         << " memory");
    std::int64_t width = 0;
    std::size_t total = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      auto layer = detail::make_layer<T>(layers[i]);
      const std::int64_t need = layer->in_features();
      if (need > 0) {
        DTRAIN_REQUIRE(width == 0 || width == need, "Sequential",
                       "layer " << i << " (" << layer->kind() << ") expects " << need
                                << " features but receives " << width);
        if (width == 0) width = need;
      }
      DTRAIN_REQUIRE(width > 0, "Sequential",
                     "layer " << i << " (" << layer->kind()
                              << ") comes before any layer that fixes the input width");
      if (widths_.empty()) widths_.push_back(width);
      const std::string prefix =
          "layers/" + std::to_string(i) + "_" + std::string(layer->kind()) + "/";
      for (auto& p : layer->params()) {
        ParameterInfo info;
        info.name = prefix + p.name;
        info.shape = p.shape;
        info.offset = total + p.offset;
        info.count = element_count(p.shape);
        info.layer = i;
        info_.push_back(std::move(info));
      }
      offsets_.push_back(total);
      total += layer->param_count();
      width = layer->out_features(width);
      widths_.push_back(width);
      layers_.push_back(std::move(layer));
    }
    params_ = Tensor({static_cast<std::int64_t>(total)}, dtype_of_v<T>, alloc);
    grads_ = Tensor({static_cast<std::int64_t>(total)}, dtype_of_v<T>, alloc);
    T* p = static_cast<T*>(params_.raw());
    T* g = static_cast<T*>(grads_.raw());
    for (std::size_t i = 0; i < layers_.size(); ++i)
      layers_[i]->bind(p ? p + offsets_[i] : nullptr, g ? g + offsets_[i] : nullptr);
    // Never leave the arena as whatever the allocator returned (it need not be zeroed).
    init(0);
  }

  BasicSequential(BasicSequential&&) noexcept = default;
  BasicSequential& operator=(BasicSequential&&) noexcept = default;
  BasicSequential(const BasicSequential&) = delete;
  BasicSequential& operator=(const BasicSequential&) = delete;

  /// Deterministic initialisation from `seed` (Kaiming/Xavier per layer, counter-based RNG):
  /// every rank that passes the same seed holds identical parameters, without communication.
  /// Also resets the training step counter and zeroes the gradients. Local.
  void init(std::uint64_t seed) {
    seed_ = seed;
    for (std::size_t i = 0; i < layers_.size(); ++i) layers_[i]->init(seed, i);
    forward_count_ = 0;
    zero_grad();
  }

  std::int64_t in_features() const noexcept { return widths_.front(); }
  std::int64_t out_features() const noexcept { return widths_.back(); }
  std::size_t layer_count() const noexcept { return layers_.size(); }
  /// Number of learnable scalars (elements of each arena).
  std::size_t parameter_count() const noexcept { return params_.size(); }

  /// The whole parameter arena (dtype of T, host). The model owns it; the view stays valid for the
  /// model's lifetime and may be written (optimizers, broadcasts, checkpoint restore).
  BufferView parameters() const noexcept { return params_.view(); }
  /// The whole gradient arena, same layout as parameters(); hand it to the gradient all-reduce.
  BufferView gradients() const noexcept { return grads_.view(); }
  span<T> parameter_span() noexcept {
    return span<T>(static_cast<T*>(params_.raw()), params_.size());
  }
  span<T> gradient_span() noexcept { return span<T>(static_cast<T*>(grads_.raw()), grads_.size()); }
  /// Name, shape and arena range of every learnable tensor, in arena order.
  const std::vector<ParameterInfo>& parameter_info() const noexcept { return info_; }

  /// Zeroes the gradient arena (gradients accumulate over backward calls until then). Local.
  void zero_grad() noexcept {
    if (grads_.bytes()) std::fill_n(static_cast<T*>(grads_.raw()), grads_.size(), T(0));
  }

  /// Runs the layers on `x` ([batch, in_features], caller-owned, must stay alive and unchanged
  /// until backward). Returns the output [batch, out_features], owned by the model and valid until
  /// the next forward. Local, blocking.
  const T* forward(const T* x, std::int64_t batch, const PassOptions& options = {}) {
    DTRAIN_REQUIRE(batch >= 0, "Sequential::forward", "negative batch " << batch);
    DTRAIN_REQUIRE(x != nullptr || batch == 0, "Sequential::forward", "null input");
    reserve(batch);
    ctx_.training = options.training;
    ctx_.sample_offset = options.sample_offset;
    ctx_.sample_ids = options.sample_ids;
    if (options.step >= 0)
      ctx_.step = static_cast<std::uint64_t>(options.step);
    else
      ctx_.step = static_cast<std::uint64_t>(forward_count_);
    if (options.training) ++forward_count_;
    input_ = x;
    batch_ = batch;
    const T* in = x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      T* out = acts_[i].data();
      layers_[i]->forward(in, out, batch, widths_[i], ctx_);
      in = out;
    }
    return in;
  }

  /// Back-propagates `dy` (d loss / d output of the last forward, [batch, out_features]),
  /// ACCUMULATING into the gradient arena and calling `on_ready` for each layer with parameters as
  /// soon as its gradients are final, last layer first. With gradient accumulation over
  /// micro-batches pass `on_ready` only on the last one. Local, blocking.
  void backward(const T* dy, const GradReadyCallback& on_ready = {}) {
    DTRAIN_REQUIRE(input_ != nullptr || batch_ == 0, "Sequential::backward",
                   "no forward pass to differentiate");
    const T* grad_out = dy;
    for (std::size_t ri = layers_.size(); ri-- > 0;) {
      const T* x = ri == 0 ? input_ : acts_[ri - 1].data();
      T* dx = ri == 0 ? nullptr : dbuf_[ri % 2].data();
      layers_[ri]->backward(x, acts_[ri].data(), grad_out, dx, batch_, widths_[ri], ctx_);
      const std::size_t count = layers_[ri]->param_count();
      if (on_ready && count) on_ready(offsets_[ri], count);
      grad_out = dx;
    }
  }

  /// Forward, loss and backward on one batch of class labels (int32 in [0, out_features)).
  /// Returns the mean loss of the batch; gradients accumulate (scaled by options.loss_scale).
  /// Local, blocking; `on_ready` as for backward.
  double forward_backward(const T* x, const std::int32_t* labels, std::int64_t batch,
                          Loss loss = Loss::softmax_cross_entropy,
                          const GradReadyCallback& on_ready = {}, const PassOptions& options = {}) {
    const T* out = forward(x, batch, options);
    const std::int64_t classes = out_features();
    T* dy = loss_grad_.data();
    double value = 0;
    if (loss == Loss::softmax_cross_entropy) {
      value = host::softmax_cross_entropy(out, labels, batch, classes, dy, options.loss_scale);
    } else {
      host::detail::check_labels(labels, batch, classes, "Sequential::forward_backward");
      onehot_.assign(static_cast<std::size_t>(batch * classes), T(0));
      for (std::int64_t r = 0; r < batch; ++r) onehot_[r * classes + labels[r]] = T(1);
      value = host::mse(out, onehot_.data(), batch, classes, dy, options.loss_scale);
    }
    backward(dy, on_ready);
    return value;
  }

  /// Span form of the above; checks the sizes against batch and the model's widths.
  double forward_backward(span<const T> x, span<const std::int32_t> labels, std::int64_t batch,
                          Loss loss = Loss::softmax_cross_entropy,
                          const GradReadyCallback& on_ready = {}, const PassOptions& options = {}) {
    check_input(x, batch, "Sequential::forward_backward");
    DTRAIN_REQUIRE(labels.size() == static_cast<std::size_t>(batch), "Sequential::forward_backward",
                   "labels has " << labels.size() << " entries for batch " << batch);
    return forward_backward(x.data(), labels.data(), batch, loss, on_ready, options);
  }

  /// Same, reporting finished gradient ranges to `sync.ready(offset, count)` (e.g. GradientSync,
  /// whose bucket all-reduces then overlap the rest of backward).
  template <class Sync, class = std::enable_if_t<detail::is_grad_sink<Sync>::value>>
  double forward_backward(const T* x, const std::int32_t* labels, std::int64_t batch, Loss loss,
                          Sync& sync, const PassOptions& options = {}) {
    return forward_backward(
        x, labels, batch, loss, [&sync](std::size_t o, std::size_t c) { sync.ready(o, c); },
        options);
  }

  /// One loader batch (f32 features [size, in_features], i32 labels [size], dataset indices):
  /// forward, loss, backward, reporting gradient ranges to `sync.ready`. Dropout masks follow the
  /// batch's dataset indices unless options.sample_ids is set, so they do not depend on the rank
  /// count. Returns the mean loss. Local, blocking; throws InvalidArgument on a shape mismatch.
  template <class Batch, class Sync,
            class = std::enable_if_t<detail::is_loader_batch<Batch>::value &&
                                     detail::is_grad_sink<Sync>::value>>
  double forward_backward(const Batch& batch, Sync& sync, Loss loss = Loss::softmax_cross_entropy,
                          PassOptions options = {}) {
    const BufferView f = batch.features.view(), l = batch.labels.view();
    const auto n = static_cast<std::int64_t>(batch.size);
    DTRAIN_REQUIRE(f.space == Space::host && l.space == Space::host, "Sequential::forward_backward",
                   "batch lives in " << name_of(f.space) << " memory; the layers run on the host");
    const auto x = f.as<T>("Sequential::forward_backward (features)");
    const auto y = l.as<std::int32_t>("Sequential::forward_backward (labels)");
    check_input(span<const T>(x.data(), x.size()), n, "Sequential::forward_backward");
    DTRAIN_REQUIRE(y.size() == batch.size, "Sequential::forward_backward",
                   "batch has " << y.size() << " labels for " << batch.size << " rows");
    if (!options.sample_ids && batch.indices.size() == batch.size)
      options.sample_ids = batch.indices.data();
    return forward_backward(x.data(), y.data(), n, loss, sync, options);
  }

  /// Regression: forward, mean squared error against `targets` ([batch, out_features]) and
  /// backward. Returns the mean loss. Local, blocking.
  double forward_backward(const T* x, const T* targets, std::int64_t batch,
                          const GradReadyCallback& on_ready = {}, const PassOptions& options = {}) {
    const T* out = forward(x, batch, options);
    T* dy = loss_grad_.data();
    const double value = host::mse(out, targets, batch, out_features(), dy, options.loss_scale);
    backward(dy, on_ready);
    return value;
  }

  /// Evaluation forward: writes the argmax class of each row to `classes_out` (batch entries).
  void predict(const T* x, std::int64_t batch, std::int32_t* classes_out) {
    PassOptions eval;
    eval.training = false;
    const T* out = forward(x, batch, eval);
    for (std::int64_t r = 0; r < batch; ++r)
      classes_out[r] = argmax(out + r * out_features(), out_features());
  }

  /// Evaluation forward and the number of rows whose argmax equals the label. Local.
  std::int64_t count_correct(const T* x, const std::int32_t* labels, std::int64_t batch) {
    PassOptions eval;
    eval.training = false;
    const T* out = forward(x, batch, eval);
    return dtrain::count_correct(out, labels, batch, out_features());
  }

  /// Evaluation forward and the fraction of rows classified correctly. Local.
  double accuracy(const T* x, const std::int32_t* labels, std::int64_t batch) {
    return batch ? static_cast<double>(count_correct(x, labels, batch)) / static_cast<double>(batch)
                 : 0.0;
  }

  /// Training forwards so far (the default dropout step). Restored by checkpoints.
  std::int64_t step_count() const noexcept { return forward_count_; }

  /// Checkpoint protocol: every learnable tensor under its ParameterInfo name with its true
  /// shape, then the init seed and the training step counter.
  template <class V>
  void visit_state(V& v) {
    for (const auto& p : info_) v.tensor(p.name, params_.view().slice(p.offset, p.count), p.shape);
    std::int64_t seed = static_cast<std::int64_t>(seed_);
    v.scalar("seed", seed);
    v.scalar("step_count", forward_count_);
    if (v.loading()) {
      seed_ = static_cast<std::uint64_t>(seed);
      // Re-derive per-layer keys (dropout) without touching the restored tensors.
      for (std::size_t i = 0; i < layers_.size(); ++i)
        if (layers_[i]->param_count() == 0) layers_[i]->init(seed_, i);
    }
  }

 private:
  void check_input(span<const T> x, std::int64_t batch, const char* op) const {
    DTRAIN_REQUIRE(batch >= 0 && x.size() == static_cast<std::size_t>(batch * in_features()), op,
                   "input has " << x.size() << " elements, expected batch " << batch << " x "
                                << in_features() << " features");
  }
  // Scratch grows to the largest batch seen; steady-state steps do not allocate.
  void reserve(std::int64_t batch) {
    if (batch <= capacity_ && acts_.size() == layers_.size()) return;
    const auto b = static_cast<std::size_t>(batch);
    acts_.resize(layers_.size());
    std::size_t widest = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      acts_[i].assign(b * static_cast<std::size_t>(widths_[i + 1]), T(0));
      widest = std::max(widest, static_cast<std::size_t>(widths_[i]));
    }
    for (auto& d : dbuf_) d.assign(b * widest, T(0));
    loss_grad_.assign(b * static_cast<std::size_t>(out_features()), T(0));
    capacity_ = batch;
  }

  std::vector<std::unique_ptr<detail::LayerImpl<T>>> layers_;
  std::vector<std::int64_t> widths_;  // widths_[i]: input width of layer i; back(): output
  std::vector<std::size_t> offsets_;  // arena offset of each layer's parameters
  std::vector<ParameterInfo> info_;
  Tensor params_, grads_;
  std::vector<std::vector<T>> acts_;  // acts_[i]: output of layer i
  std::vector<T> dbuf_[2], loss_grad_, onehot_;
  std::int64_t capacity_ = 0;
  const T* input_ = nullptr;
  std::int64_t batch_ = 0;
  detail::PassContext ctx_;
  std::uint64_t seed_ = 0;
  std::int64_t forward_count_ = 0;
};

/// The float32 model used for training.
using Sequential = BasicSequential<float>;

}  // namespace dtrain
