// SPDX-License-Identifier: BSD-3-Clause
// dtrain: Sequential, a stack of layers with explicit forward and backward over one parameter
// arena and one gradient arena, generic over an execution policy (host or device).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_state.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/model/layer.hpp>
#include <dtrain/model/layers.hpp>
#include <dtrain/model/layers/residual.hpp>
#include <dtrain/model/loss.hpp>
#include <dtrain/model/metrics.hpp>
#include <dtrain/model/parameter_units.hpp>
#include <dtrain/model/pending_loss.hpp>

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
// A pointer that a move leaves null, so that a moved-from object knows it owns nothing.
template <class S, class T, class Exec, class = void>
struct has_make_layer : std::false_type {};
template <class S, class T, class Exec>
struct has_make_layer<S, T, Exec,
                      std::void_t<decltype(std::unique_ptr<Layer<T, Exec>>(
                          std::declval<const S&>().template make<T, Exec>()))>> : std::true_type {};
template <class P>
class MovablePtr {
 public:
  MovablePtr() = default;
  MovablePtr(P* p) noexcept : ptr_(p) {}  // NOLINT: stands in for the raw pointer
  MovablePtr(MovablePtr&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}
  MovablePtr& operator=(MovablePtr&& o) noexcept {
    ptr_ = std::exchange(o.ptr_, nullptr);
    return *this;
  }
  P* operator->() const noexcept { return ptr_; }
  P& operator*() const noexcept { return *ptr_; }
  operator P*() const noexcept { return ptr_; }  // NOLINT

 private:
  P* ptr_ = nullptr;
};
}  // namespace detail

/// One entry of a layer list for a model over scalar T and policy Exec: a built-in description
/// (anything LayerSpec holds), a layer of one's own (custom<MyLayer>(args...), or any copyable
/// object with `template <class T, class Exec> std::unique_ptr<Layer<T, Exec>> make() const`),
/// or a Residual block of any of these. So one list mixes them: {Input{1, 64, 64},
/// Conv2d(1, 8, 3).with_padding(1), custom<MyLayer>(), Residual{custom<MyLayer>(), Relu{}}}.
template <class T, class Exec>
class LayerEntry {
 public:
  template <class S, std::enable_if_t<!detail::has_make_layer<S, T, Exec>::value &&
                                          !detail::is_residual<S>::value &&
                                          std::is_constructible_v<LayerSpec, const S&>,
                                      int> = 0>
  LayerEntry(const S& spec)  // NOLINT: implicit, so that lists read as layer lists
      : spec_(LayerSpec(spec)) {}
  template <class S, std::enable_if_t<detail::has_make_layer<S, T, Exec>::value, int> = 0>
  LayerEntry(const S& spec)  // NOLINT
      : make_([spec] { return std::unique_ptr<Layer<T, Exec>>(spec.template make<T, Exec>()); }) {}
  /// A skip connection whose body holds entries of any kind (each made as an entry of its own).
  template <class... S, std::enable_if_t<(sizeof...(S) > 0), int> = 0>
  LayerEntry(const Residual<S...>& block)  // NOLINT
      : make_([body = std::apply(
                   [](const S&... s) { return std::vector<LayerEntry>{LayerEntry(s)...}; },
                   block.body)] {
          std::vector<std::unique_ptr<Layer<T, Exec>>> layers;
          for (std::size_t j = 0; j < body.size(); ++j)
            layers.push_back(detail::in_layer("Residual", "body layer " + std::to_string(j),
                                              [&] { return body[j].build(); }));
          return std::unique_ptr<Layer<T, Exec>>(
              std::make_unique<ResidualLayer<T, Exec>>(std::move(layers)));
        }) {}
  /// The Input shape this entry gives, or null when it is a layer.
  const Input* input() const noexcept {
    return make_ ? nullptr : std::get_if<Input>(&spec_.base());
  }
  std::unique_ptr<Layer<T, Exec>> build() const {
    if (make_) {
      auto layer = make_();
      DTRAIN_REQUIRE(layer != nullptr, "Sequential", "a user layer's make() returned null");
      return layer;
    }
    return detail::make_layer<T, Exec>(spec_);
  }

 private:
  LayerSpec spec_{Relu{}};
  std::function<std::unique_ptr<Layer<T, Exec>>()> make_;
};

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
  /// The pass's inputs, targets and labels (not sample_ids) are exec memory (the policy's
  /// allocator's space, e.g. device arrays of the caller): copied on the compute stream, device
  /// to device, instead of staged from the host. Class labels still come to the host to be
  /// checked (the host waits for that copy).
  bool exec_inputs = false;
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

/// Where backward reports finished gradient ranges: nothing (default), a callable
/// `void(std::size_t offset, std::size_t count)`, or an object with `ready(offset, count)` such as
/// GradientSync (borrowed: it must outlive the pass). Cheap to copy; local.
class GradSink {
 public:
  GradSink() = default;
  template <class S, class = std::enable_if_t<!std::is_same_v<std::decay_t<S>, GradSink> &&
                                              (detail::is_grad_sink<std::decay_t<S>>::value ||
                                               std::is_invocable_v<S&, std::size_t, std::size_t>)>>
  GradSink(S&& sink) {  // NOLINT: implicit, so that a sync or a lambda is passed as it is
    if constexpr (detail::is_grad_sink<std::decay_t<S>>::value) {
      auto* obj = &sink;
      callback_ = [obj](std::size_t o, std::size_t c) { obj->ready(o, c); };
    } else {
      callback_ = GradReadyCallback(std::forward<S>(sink));
    }
  }
  explicit operator bool() const noexcept { return static_cast<bool>(callback_); }
  void operator()(std::size_t offset, std::size_t count) const {
    if (callback_) callback_(offset, count);
  }

 private:
  GradReadyCallback callback_;
};

/// A feed-forward stack of layers over rows of features (row-major [batch, features]) in scalar
/// type T (float for training, double for gradient checks), run by execution policy Exec
/// (HostExec by default; see <dtrain/exec/exec_traits.hpp>). All parameters live in one
/// contiguous arena and all gradients in another, in layer order; the arenas, activations and
/// scratch are exec memory from the policy's allocator, and every kernel is queued on the
/// policy's compute stream, so a device policy keeps the whole pass on the device. Inputs
/// (features, labels, targets, sample ids) are host memory; the model stages them through its
/// own host buffers, so the caller may reuse them as soon as a call returns. The loss comes back
/// to the host only when read (PendingLoss). Local object: not thread-safe. Parameters are
/// identical on every rank after init(seed) with the same seed.
template <class T, class Exec = HostExec>
class BasicSequential {
  static_assert(detail::check_exec_policy<Exec>(), "BasicSequential needs an execution policy");

 public:
  using value_type = T;
  using exec_type = Exec;
  using stream_type = typename Exec::stream_type;
  /// Passes whose loss can be read before its host slot is reused.
  static constexpr std::size_t loss_slots = 16;

  using entry_type = LayerEntry<T, Exec>;

  /// Builds the layers on `exec` (borrowed: it must outlive the model), allocates the arenas and
  /// initialises as init(0). The list may start with Input{...} (the shape of one sample);
  /// otherwise the first Linear or LayerNorm fixes a flat input. Shapes are checked layer to
  /// layer; throws InvalidArgument naming the layer and both shapes on a mismatch, or when no
  /// entry fixes the input shape.
  BasicSequential(std::initializer_list<entry_type> layers, Exec& exec)
      : BasicSequential(std::vector<entry_type>(layers), exec) {}
  BasicSequential(const std::vector<entry_type>& layers, Exec& exec) : exec_(&exec) {
    build(layers);
  }
  BasicSequential(const std::vector<LayerSpec>& layers, Exec& exec)
      : BasicSequential(entries(layers), exec) {}
  /// Same, without the arenas (`deferred_arenas`), for fully sharded training of a model whose
  /// whole parameters and gradients do not fit one rank: FullyShardedSync allocates this rank's
  /// parts only, and init(seed) then draws them (one layer's values at a time, in a host buffer
  /// of the layer's size). Until the model is sharded, parameters() and gradients() are empty
  /// and init, passes and visit_state throw InvalidArgument.
  BasicSequential(const std::vector<entry_type>& layers, Exec& exec, DeferredArenas)
      : exec_(&exec), deferred_(true) {
    build(layers);
  }
  /// Same on a policy of its own made from `alloc` (HostExec: host memory from `alloc`, which
  /// must outlive the model; a non-host allocator throws InvalidArgument).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  BasicSequential(std::initializer_list<entry_type> layers, Allocator& alloc = default_allocator())
      : BasicSequential(std::vector<entry_type>(layers), alloc) {}
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  explicit BasicSequential(const std::vector<entry_type>& layers,
                           Allocator& alloc = default_allocator())
      : owned_exec_(std::make_unique<Exec>(alloc)), exec_(owned_exec_.get()) {
    build(layers);
  }
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  explicit BasicSequential(const std::vector<LayerSpec>& layers,
                           Allocator& alloc = default_allocator())
      : BasicSequential(entries(layers), alloc) {}
  /// Same on a policy of its own, without the arenas (see the DeferredArenas form above).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  BasicSequential(const std::vector<entry_type>& layers, Allocator& alloc, DeferredArenas)
      : owned_exec_(std::make_unique<Exec>(alloc)), exec_(owned_exec_.get()), deferred_(true) {
    build(layers);
  }

  BasicSequential(BasicSequential&&) noexcept = default;
  BasicSequential& operator=(BasicSequential&&) = delete;
  BasicSequential(const BasicSequential&) = delete;
  BasicSequential& operator=(const BasicSequential&) = delete;
  /// Waits (bounded) for the model's queued work, which uses its buffers.
  ~BasicSequential() {
    if (!exec_) return;
    try {
      exec_->synchronize(stream(), Deadline(exec_timeout_s()));
    } catch (...) {  // a device error was already reported to the waits that saw it
    }
  }

  /// The policy the model runs on.
  Exec& exec() const noexcept { return *exec_; }

  /// Deterministic initialisation from `seed` (Kaiming/Xavier per layer, counter-based RNG):
  /// every rank that passes the same seed holds identical parameters, without communication.
  /// Also resets the training step counter and zeroes the gradients. Local, blocking (the
  /// parameters are generated on the host and uploaded).
  void init(std::uint64_t seed) {
    require_arenas("Sequential::init");
    seed_ = seed;
    if (sharded_) {
      init_parts(seed);
      forward_count_ = 0;
      zero_grad();
      return;
    }
    Tensor host(Shape{static_cast<std::int64_t>(params_.size())}, dtype_of_v<T>,
                exec_->host_allocator());
    T* h = static_cast<T*>(host.raw());
    for (std::size_t i = 0; i < layers_.size(); ++i)
      layers_[i]->init(seed, i, h ? h + offsets_[i] : nullptr);
    exec_->copy_h2d(stream(), params_.raw(), h, params_.bytes());
    exec_synchronize(*exec_, stream(), exec_timeout_s(), "Sequential::init");
    forward_count_ = 0;
    zero_grad();
  }

  /// Elements of one input (output) sample.
  std::int64_t in_features() const noexcept { return sizes_.front(); }
  std::int64_t out_features() const noexcept { return sizes_.back(); }
  /// Shape of one input (output) sample, without the batch axis.
  const Shape& input_shape() const noexcept { return shapes_.front(); }
  const Shape& output_shape() const noexcept { return shapes_.back(); }
  std::size_t layer_count() const noexcept { return layers_.size(); }
  /// Layer i (for its shapes and kind; the model owns it).
  const Layer<T, Exec>& layer(std::size_t i) const { return *layers_.at(i); }
  /// Number of learnable scalars (elements of each whole arena).
  std::size_t parameter_count() const noexcept { return arena_count_; }
  /// Offset (elements) of layer i's parameters in the whole arenas.
  std::size_t layer_offset(std::size_t i) const { return offsets_.at(i); }

  /// Fully sharded mode; FullyShardedSync calls it (every rank alike, with its own parts), users
  /// need not. From now on the arenas hold this rank's `parts` only (one per unit, inside it,
  /// ascending), back to back: parameters() and gradients() are those compact arenas, and
  /// arena_parts() says which elements of the whole arenas they hold. Before each unit's forward
  /// and backward the model asks `provider` (borrowed: it must outlive the model or detach
  /// first) for the unit's whole parameters, and its backward accumulates into the provider's
  /// gradient buffer. `units` must tile the layers and the arena in order (plan_parameter_units).
  /// Local, blocking; the whole arenas are freed. Throws InvalidArgument on units or parts that
  /// do not fit, or when sharded already.
  void shard_parameters(std::vector<ParameterUnit> units, StateParts parts,
                        UnitProvider& provider) {
    constexpr const char* op = "Sequential::shard_parameters";
    DTRAIN_REQUIRE(!sharded_, op, "the model is fully sharded already");
    DTRAIN_REQUIRE(!units.empty() && units.size() == parts.size(), op,
                   units.size() << " units and " << parts.size() << " parts");
    std::size_t layer = 0, offset = 0, held = 0;
    std::vector<std::size_t> unit_of(layers_.size(), 0), starts;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const ParameterUnit& x = units[u];
      std::size_t count = 0;
      for (std::size_t i = x.first_layer; i < x.end_layer && i < layers_.size(); ++i) {
        count += layers_[i]->param_count();
        unit_of[i] = u;
      }
      DTRAIN_REQUIRE(x.first_layer == layer && x.end_layer > x.first_layer &&
                         x.end_layer <= layers_.size() && x.offset == offset && x.count == count,
                     op,
                     "unit " << u << " (layers [" << x.first_layer << ", " << x.end_layer
                             << "), elements [" << x.offset << ", " << x.offset + x.count
                             << ")) does not continue the units before it over " << layers_.size()
                             << " layers");
      const auto& [first, n] = parts[u];
      DTRAIN_REQUIRE(first >= x.offset && n <= x.count && first - x.offset <= x.count - n, op,
                     "part [" << first << ", " << first + n << ") outside unit " << u);
      starts.push_back(held);
      held += n;
      layer = x.end_layer;
      offset += count;
    }
    DTRAIN_REQUIRE(layer == layers_.size() && offset == arena_count_, op,
                   "the units end at layer " << layer << " and element " << offset << " of "
                                             << layers_.size() << " layers and " << arena_count_
                                             << " elements");
    Allocator& a = exec_->allocator();
    // Deferred arenas have nothing to copy: the parts are zero until init.
    Tensor p({static_cast<std::int64_t>(held)}, dtype_of_v<T>, a);
    Tensor g({static_cast<std::int64_t>(held)}, dtype_of_v<T>, a);
    for (std::size_t u = 0; u < parts.size(); ++u)
      if (parts[u].second && !deferred_)
        exec_->copy_d2d(stream(), static_cast<T*>(p.raw()) + starts[u],
                        static_cast<const T*>(params_.raw()) + parts[u].first,
                        parts[u].second * sizeof(T));
    if (deferred_ && held) exec_->fill(stream(), static_cast<T*>(p.raw()), held, T(0));
    if (held) exec_->fill(stream(), static_cast<T*>(g.raw()), held, T(0));
    exec_synchronize(*exec_, stream(), exec_timeout_s(), op);
    params_ = std::move(p);
    grads_ = std::move(g);
    units_ = std::move(units);
    parts_ = std::move(parts);
    part_starts_ = std::move(starts);
    unit_of_ = std::move(unit_of);
    provider_ = &provider;
    sharded_ = true;
    for (auto& l : layers_) l->rebind(nullptr, nullptr);
    // Optimizers made before now follow to the parts (the whole arenas are freed).
    binding_->params = params_.view();
    binding_->grads = grads_.view();
    binding_->parts = parts_;
    ++binding_->version;
  }
  /// Whether the arenas hold this rank's parts only (shard_parameters).
  bool fully_sharded() const noexcept { return sharded_; }
  /// Elements of the whole arenas (as parameter_count()).
  std::size_t arena_count() const noexcept { return arena_count_; }
  /// While fully sharded: the elements of the whole arenas that parameters() and gradients()
  /// hold, back to back (ascending, one per unit); empty otherwise.
  const StateParts& arena_parts() const noexcept { return parts_; }
  /// The arenas in use, shared with the optimizers made from the model: an optimizer made
  /// before the model is fully sharded follows it to its parts (the whole arenas it saw are
  /// freed). Local.
  std::shared_ptr<const detail::ArenaBinding> arena_binding() const noexcept { return binding_; }
  /// While fully sharded: the units (empty otherwise).
  const std::vector<ParameterUnit>& units() const noexcept { return units_; }
  /// Forgets `provider` if it is the model's (FullyShardedSync's destructor calls this). The
  /// model stays sharded; its passes throw InvalidArgument from then on. Local.
  void detach_provider(const UnitProvider* provider) noexcept {
    if (provider_ == provider) provider_ = nullptr;
  }

  /// The whole parameter arena (dtype of T, exec memory, space tagged). The model owns it; the
  /// view stays valid for the model's lifetime and may be written (optimizers, broadcasts,
  /// checkpoint restore) in stream order.
  BufferView parameters() const noexcept { return params_.view(); }
  /// The whole gradient arena, same layout as parameters(); hand it to the gradient all-reduce.
  BufferView gradients() const noexcept { return grads_.view(); }
  /// Typed host views of the arenas: only for policies whose memory is host memory.
  span<T> parameter_span() { return params_.template as<T>("Sequential::parameter_span"); }
  span<T> gradient_span() { return grads_.template as<T>("Sequential::gradient_span"); }
  /// Name, shape and arena range of every learnable tensor, in arena order.
  const std::vector<ParameterInfo>& parameter_info() const noexcept { return info_; }

  /// Queues the zeroing of the gradient arena (gradients accumulate over backward calls until
  /// then). Local, non-blocking.
  void zero_grad() {
    // A sharded model's reduce-scatters still running write into the parts: finished first.
    if (sharded_ && provider_) provider_->gradients_zeroed();
    exec_->fill(stream(), static_cast<T*>(grads_.raw()), grads_.size(), T(0));
  }

  /// Runs the layers on `x` (host memory, [batch, in_features]; copied, so it may be reused on
  /// return; exec memory with options.exec_inputs, copied in stream order). Returns the output
  /// [batch, out_features] in exec memory, owned by the model and valid until the next forward
  /// (copy_output brings it to the host). Local; queued on the policy's compute stream (blocking
  /// with HostExec).
  const T* forward(const T* x, std::int64_t batch, const PassOptions& options = {}) {
    DTRAIN_REQUIRE(batch >= 0, "Sequential::forward", "negative batch " << batch);
    DTRAIN_REQUIRE(x != nullptr || batch == 0, "Sequential::forward", "null input");
    Stage& st = begin_stage(batch);
    stage_inputs(st, x, batch, options);
    end_stage(st);
    return run_forward(batch, options);
  }

  /// Copies the output of the last forward ([batch, out_features]) into `out` (host memory).
  /// Local, blocking (bounded).
  void copy_output(T* out) {
    const std::size_t n = static_cast<std::size_t>(batch_ * out_features());
    exec_->copy_d2h(stream(), out, acts_.back().raw(), n * sizeof(T));
    exec_synchronize(*exec_, stream(), exec_timeout_s(), "Sequential::copy_output");
  }

  /// Back-propagates `dy` (exec memory: d loss / d output of the last forward, [batch,
  /// out_features]), ACCUMULATING into the gradient arena and calling `on_ready` for each layer
  /// with parameters as soon as its gradient kernels are queued, last layer first (a GradientSync
  /// records an event there). With gradient accumulation over micro-batches pass `on_ready` only
  /// on the last one. Local; queued on the compute stream.
  void backward(const T* dy, GradSink on_ready = {}) {
    DTRAIN_REQUIRE(forwarded_, "Sequential::backward", "no forward pass to differentiate");
    check_provider("Sequential::backward");
    const T* grad_out = dy;
    for (std::size_t ri = layers_.size(); ri-- > 0;) {
      if (sharded_ && ri + 1 == units_[unit_of_[ri]].end_layer) enter_unit(unit_of_[ri], true);
      const T* x = ri == 0 ? static_cast<const T*>(input_.raw()) : act(ri - 1);
      T* dx = ri == 0 ? nullptr : static_cast<T*>(dbuf_[ri % 2].raw());
      layers_[ri]->backward(stream(), x, act(ri), grad_out, dx, batch_, ctx_);
      const std::size_t count = layers_[ri]->param_count();
      if (on_ready && count) on_ready(offsets_[ri], count);
      if (sharded_ && ri == units_[unit_of_[ri]].first_layer)
        provider_->backward_done(unit_of_[ri]);
      grad_out = dx;
    }
  }

  /// Raw form: forward, loss and backward on `batch` rows of `x` (host, [batch, in_features])
  /// against `target` (host; both exec memory with options.exec_inputs): int32 class labels in [0,
  /// out_features) for Loss::softmax_cross_entropy or Loss::mse (one-hot), or T regression targets
  /// [batch, out_features] for Loss::mse. Gradients accumulate (scaled by options.loss_scale);
  /// `on_ready` as for backward. Returns the mean loss, read on demand. Local; queued on the
  /// compute stream; throws InvalidArgument on labels out of range or a loss that does not fit
  /// the targets.
  template <class Target, class = std::enable_if_t<std::is_same_v<Target, std::int32_t> ||
                                                   std::is_same_v<Target, T>>>
  PendingLoss<Exec> forward_backward(const T* x, const Target* target, std::int64_t batch,
                                     Loss loss = Loss::softmax_cross_entropy,
                                     GradSink on_ready = {}, const PassOptions& options = {}) {
    constexpr const char* op = "Sequential::forward_backward";
    DTRAIN_REQUIRE(batch >= 0, op, "negative batch " << batch);
    DTRAIN_REQUIRE((x != nullptr && target != nullptr) || batch == 0, op, "null input");
    const std::int64_t classes = out_features();
    const std::size_t n = static_cast<std::size_t>(batch * classes);
    Stage& st = begin_stage(batch);
    stage_inputs(st, x, batch, options);
    const T* target_exec = nullptr;
    const std::int32_t* labels_exec = nullptr;
    if constexpr (std::is_same_v<Target, std::int32_t>) {
      if (options.exec_inputs) {
        // Labels index the outputs: checked on the host, as host labels are.
        exec_->copy_d2h(stream(), st.labels.raw(), target,
                        static_cast<std::size_t>(batch) * sizeof(std::int32_t));
        exec_synchronize(*exec_, stream(), exec_timeout_s(), "Sequential (reading exec labels)");
        target = static_cast<const std::int32_t*>(st.labels.raw());
      }
      host::detail::check_labels(target, batch, classes, op);
      if (loss == Loss::softmax_cross_entropy) {
        upload(st.labels, labels_, target, static_cast<std::size_t>(batch));
        labels_exec = static_cast<const std::int32_t*>(labels_.raw());
      } else {
        T* onehot = static_cast<T*>(st.target.raw());
        std::fill_n(onehot, n, T(0));
        for (std::int64_t r = 0; r < batch; ++r) onehot[r * classes + target[r]] = T(1);
        upload(st.target, target_, static_cast<const T*>(onehot), n);
        target_exec = static_cast<const T*>(target_.raw());
      }
    } else {
      DTRAIN_REQUIRE(loss == Loss::mse, op,
                     "real-valued targets need Loss::mse, not " << name_of(loss));
      if (options.exec_inputs)
        exec_->copy_d2d(stream(), target_.raw(), target, n * sizeof(T));
      else
        upload(st.target, target_, target, n);
      target_exec = static_cast<const T*>(target_.raw());
    }
    end_stage(st);
    const T* out = run_forward(batch, options);
    T* dy = static_cast<T*>(loss_grad_.raw());
    const std::size_t slot = passes_ % loss_slots;
    double* loss_exec = static_cast<double*>(loss_exec_.raw()) + slot;
    if (loss == Loss::softmax_cross_entropy)
      exec_->softmax_cross_entropy(stream(), out, labels_exec, batch, classes, dy,
                                   options.loss_scale, loss_exec);
    else
      exec_->mse(stream(), out, target_exec, batch, classes, dy, options.loss_scale, loss_exec);
    backward(dy, std::move(on_ready));
    return finish_loss(slot, loss_exec);
  }

  /// Batch form: one loader batch (f32 features [size, in_features], i32 labels [size], dataset
  /// indices): forward, loss, backward, reporting gradient ranges to `sync`. Dropout masks
  /// follow the batch's dataset indices unless options.sample_ids is set, so they do not depend
  /// on the rank count. Returns the mean loss, read on demand. Local; throws InvalidArgument on
  /// a shape mismatch.
  template <class Batch, class = std::enable_if_t<detail::is_loader_batch<Batch>::value>>
  PendingLoss<Exec> forward_backward(const Batch& batch, GradSink sync = {},
                                     Loss loss = Loss::softmax_cross_entropy,
                                     PassOptions options = {}) {
    constexpr const char* op = "Sequential::forward_backward";
    const BufferView f = batch.features.view(), l = batch.labels.view();
    const auto n = static_cast<std::int64_t>(batch.size);
    const auto x = f.as<T>("Sequential::forward_backward (features)");
    const auto y = l.as<std::int32_t>("Sequential::forward_backward (labels)");
    DTRAIN_REQUIRE(x.size() == batch.size * static_cast<std::size_t>(in_features()), op,
                   "input has " << x.size() << " elements, expected batch " << n << " x "
                                << in_features() << " features");
    DTRAIN_REQUIRE(y.size() == batch.size, op,
                   "batch has " << y.size() << " labels for " << batch.size << " rows");
    if (!options.sample_ids && batch.indices.size() == batch.size)
      options.sample_ids = batch.indices.data();
    return forward_backward(static_cast<const T*>(x.data()),
                            static_cast<const std::int32_t*>(y.data()), n, loss, std::move(sync),
                            options);
  }

  /// Evaluation forward: writes the argmax class of each row to `classes_out` (host, batch
  /// entries). Local, blocking.
  void predict(const T* x, std::int64_t batch, std::int32_t* classes_out) {
    const T* out = eval_to_host(x, batch);
    for (std::int64_t r = 0; r < batch; ++r)
      classes_out[r] = argmax(out + r * out_features(), out_features());
  }

  /// Evaluation forward and the number of rows whose argmax equals the label. Local, blocking.
  std::int64_t count_correct(const T* x, const std::int32_t* labels, std::int64_t batch) {
    const T* out = eval_to_host(x, batch);
    return dtrain::count_correct(out, labels, batch, out_features());
  }

  /// Evaluation forward and the fraction of rows classified correctly. Local, blocking.
  double accuracy(const T* x, const std::int32_t* labels, std::int64_t batch) {
    return batch ? static_cast<double>(count_correct(x, labels, batch)) / static_cast<double>(batch)
                 : 0.0;
  }

  /// Training forwards so far (the default dropout step). Restored by checkpoints.
  std::int64_t step_count() const noexcept { return forward_count_; }

  /// Checkpoint protocol: every learnable tensor under its ParameterInfo name with its true
  /// shape (device tensors staged through host memory, see StateMirror), then the init
  /// seed and the training step counter. Blocking.
  ///
  /// While fully sharded, a saving visitor that takes parts (the checkpointer's) gets this
  /// rank's parts of each tensor (tensor_parts), so the file is the one an unsharded model
  /// writes; other saving visitors are refused (InvalidArgument); a loading visitor that loads
  /// parts (visitor_loads_parts: the checkpointer's restore) fills this rank's parts only, any
  /// other reads each tensor whole into a host buffer of its size and keeps this rank's part.
  template <class V>
  void visit_state(V& v) {
    require_arenas("Sequential::visit_state");
    if (sharded_)
      visit_parts(v);
    else
      for (const auto& p : info_)
        state_mirror_.visit(*exec_, v, p.name, params_, p.offset, p.count, p.shape);
    std::int64_t seed = static_cast<std::int64_t>(seed_);
    v.scalar("seed", seed);
    v.scalar("step_count", forward_count_);
    if (v.loading()) {
      seed_ = static_cast<std::uint64_t>(seed);
      // Re-derive per-layer keys (dropout) without touching the restored tensors: each layer's
      // init writes into a throw-away host buffer of its own size.
      std::vector<T> scratch;
      for (std::size_t i = 0; i < layers_.size(); ++i) {
        scratch.assign(layers_[i]->param_count(), T(0));
        layers_[i]->init(seed_, i, scratch.empty() ? nullptr : scratch.data());
      }
    }
  }

 private:
  // Host buffers the inputs of one pass go through; reused once the uploads from them are done.
  struct Stage {
    Tensor x, ids, labels, target;
    ExecEvent<Exec> uploaded;
    std::int64_t rows = 0;
  };

  stream_type stream() const { return exec_->compute_stream(); }
  const T* act(std::size_t i) const { return static_cast<const T*>(acts_[i].raw()); }

  // A model built with deferred arenas has none until it is sharded.
  void require_arenas(const char* op) const {
    DTRAIN_REQUIRE(!deferred_ || sharded_, op,
                   "the model was built with deferred arenas: shard it (FullyShardedSync) first");
  }
  void check_provider(const char* op) const {
    require_arenas(op);
    DTRAIN_REQUIRE(!sharded_ || provider_, op,
                   "the model is fully sharded but its FullyShardedSync is gone");
  }
  // Points the unit's layers at the unit's whole parameters (and, in a backward, its gradient
  // buffer) that the provider holds now.
  void enter_unit(std::size_t u, bool backward) {
    const ParameterUnit& x = units_[u];
    T* p = static_cast<T*>(provider_->acquire(u, backward));
    T* g = backward ? static_cast<T*>(provider_->gradient_buffer(u)) : nullptr;
    for (std::size_t i = x.first_layer; i < x.end_layer; ++i) {
      const bool has = layers_[i]->param_count() > 0;
      const std::size_t at = offsets_[i] - x.offset;
      layers_[i]->rebind(has && p ? p + at : nullptr, has && g ? g + at : nullptr);
    }
  }
  // This rank's piece of the tensor at [offset, offset + count) of the whole arena: where it
  // starts in the compact arena, where in the tensor, and how many elements (0: none).
  struct Piece {
    std::size_t at = 0, first = 0, count = 0;
  };
  Piece piece_of(std::size_t offset, std::size_t count, std::size_t layer) const {
    const std::size_t u = unit_of_[layer];
    const auto& [pf, pn] = parts_[u];
    const std::size_t lo = std::max(pf, offset), hi = std::min(pf + pn, offset + count);
    if (lo >= hi) return {};
    return {part_starts_[u] + (lo - pf), lo - offset, hi - lo};
  }
  // init() of a fully sharded model: each layer's values drawn into a host buffer of its own
  // size, this rank's piece of it kept.
  void init_parts(std::uint64_t seed) {
    std::vector<T> scratch;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::size_t n = layers_[i]->param_count();
      scratch.assign(n, T(0));
      layers_[i]->init(seed, i, n ? scratch.data() : nullptr);
      if (!n) continue;
      const Piece c = piece_of(offsets_[i], n, i);
      if (!c.count) continue;
      exec_->copy_h2d(stream(), static_cast<T*>(params_.raw()) + c.at, scratch.data() + c.first,
                      c.count * sizeof(T));
      exec_synchronize(*exec_, stream(), exec_timeout_s(), "Sequential::init");
    }
    if (provider_) provider_->parameters_changed();
  }
  template <class V>
  void visit_parts(V& v) {
    constexpr const char* op = "Sequential::visit_state";
    if (!v.loading() || visitor_loads_parts(v)) {
      if constexpr (visitor_takes_parts<V>::value) {
        exec_synchronize(*exec_, stream(), exec_timeout_s(), op);
        part_mirrors_.resize(info_.size());
        for (std::size_t k = 0; k < info_.size(); ++k) {
          const ParameterInfo& p = info_[k];
          const Piece c = piece_of(p.offset, p.count, p.layer);
          StateParts parts;
          if (c.count) parts.emplace_back(c.first, c.count);
          BufferView held = params_.view().slice(c.count ? c.at : 0, c.count);
          if constexpr (Exec::space != Space::host) {
            Tensor& m = part_mirrors_[k];
            if (m.size() != c.count)
              m = Tensor({static_cast<std::int64_t>(c.count)}, dtype_of_v<T>,
                         exec_->host_allocator());
            if (c.count && !v.loading())
              exec_->copy_d2h(stream(), m.raw(), held.data, held.bytes());
            exec_synchronize(*exec_, stream(), exec_timeout_s(), op);
            v.tensor_parts(p.name, m.view(), p.shape, parts);
            if (c.count && v.loading()) {
              exec_->copy_h2d(stream(), held.data, m.raw(), held.bytes());
              exec_synchronize(*exec_, stream(), exec_timeout_s(), op);
            }
            continue;
          }
          v.tensor_parts(p.name, held, p.shape, parts);
        }
        if (v.loading() && provider_) provider_->parameters_changed();
        return;
      }
      raise<InvalidArgument>(op,
                             "the parameters are held in parts (fully sharded): only a "
                             "checkpointer's save takes them as they are");
    }
    for (const ParameterInfo& p : info_) {
      Tensor whole({static_cast<std::int64_t>(p.count)}, dtype_of_v<T>, exec_->host_allocator());
      v.tensor(p.name, whole.view(), p.shape);
      const Piece c = piece_of(p.offset, p.count, p.layer);
      if (c.count)
        exec_->copy_h2d(stream(), static_cast<T*>(params_.raw()) + c.at,
                        static_cast<const T*>(whole.raw()) + c.first, c.count * sizeof(T));
      exec_synchronize(*exec_, stream(), exec_timeout_s(), op);
    }
    if (provider_) provider_->parameters_changed();
  }

  static std::vector<entry_type> entries(const std::vector<LayerSpec>& layers) {
    return std::vector<entry_type>(layers.begin(), layers.end());
  }

  void build(const std::vector<entry_type>& entries) {
    DTRAIN_REQUIRE(!entries.empty(), "Sequential", "needs at least one layer");
    Shape shape;
    std::size_t first = 0;
    if (const Input* in = entries.front().input()) {
      detail::in_layer("Sequential", "entry 0", [&] { in->check(); });
      shape = in->shape;
      first = 1;
    }
    DTRAIN_REQUIRE(entries.size() > first, "Sequential", "needs at least one layer");
    std::size_t total = 0;
    for (std::size_t i = first; i < entries.size(); ++i) {
      const std::size_t index = layers_.size();
      // A description's public fields may have bypassed its constructor's checks: checked here.
      auto layer = detail::in_layer("Sequential", "layer " + std::to_string(index),
                                    [&] { return entries[i].build(); });
      if (shape.empty()) {
        // No Input entry: the first layer must fix a flat input.
        if (const auto* linear = dynamic_cast<const LinearLayer<T, Exec>*>(layer.get()))
          shape = {linear->in_features()};
        else if (const auto* norm = dynamic_cast<const LayerNormLayer<T, Exec>*>(layer.get()))
          shape = {norm->features()};
        DTRAIN_REQUIRE(!shape.empty(), "Sequential",
                       "layer " << index << " (" << layer->kind()
                                << ") comes before any layer that fixes the input shape; start "
                                   "the list with Input{...}");
      }
      if (shapes_.empty()) shapes_.push_back(shape);
      detail::in_layer("Sequential", "layer " + std::to_string(index) + " (" + layer->kind() + ")",
                       [&] {
                         shape = layer->setup(shape);
                         detail::check_layer_params(*layer);
                       });
      const std::string prefix =
          "layers/" + std::to_string(index) + "_" + std::string(layer->kind()) + "/";
      for (auto& p : layer->params()) {
        ParameterInfo info;
        info.name = prefix + p.name;
        info.shape = p.shape;
        info.offset = total + p.offset;
        info.count = element_count(p.shape);
        info.layer = index;
        info_.push_back(std::move(info));
      }
      offsets_.push_back(total);
      total += layer->param_count();
      shapes_.push_back(shape);
      sizes_.push_back(static_cast<std::int64_t>(element_count(shape)));
      layers_.push_back(std::move(layer));
    }
    sizes_.insert(sizes_.begin(), static_cast<std::int64_t>(element_count(shapes_.front())));
    Allocator& a = exec_->allocator();
    arena_count_ = total;
    if (!deferred_) {
      params_ = Tensor({static_cast<std::int64_t>(total)}, dtype_of_v<T>, a);
      grads_ = Tensor({static_cast<std::int64_t>(total)}, dtype_of_v<T>, a);
    }
    loss_exec_ = Tensor({static_cast<std::int64_t>(loss_slots)}, DType::f64, a);
    loss_host_ =
        Tensor({static_cast<std::int64_t>(loss_slots)}, DType::f64, exec_->host_allocator());
    slot_pass_.assign(loss_slots, 0);
    for (std::size_t k = 0; k < loss_slots; ++k) loss_events_.emplace_back(*exec_);
    for (auto& st : stages_) st.uploaded = ExecEvent<Exec>(*exec_);
    binding_ = std::make_shared<detail::ArenaBinding>();
    binding_->params = params_.view();
    binding_->grads = grads_.view();
    binding_->whole = total;
    T* p = static_cast<T*>(params_.raw());
    T* g = static_cast<T*>(grads_.raw());
    for (std::size_t i = 0; i < layers_.size(); ++i)
      layers_[i]->bind(*exec_, p ? p + offsets_[i] : nullptr, g ? g + offsets_[i] : nullptr);
    // Never leave the arena as whatever the allocator returned (it need not be zeroed); deferred
    // arenas are zeroed when made and drawn by the init after sharding.
    if (!deferred_) init(0);
  }

  // Picks the next host stage, waiting until the device has consumed what it last held, and
  // grows it (and the exec buffers) to `batch` rows.
  Stage& begin_stage(std::int64_t batch) {
    Stage& st = stages_[next_stage_];
    next_stage_ = (next_stage_ + 1) % 2;
    exec_wait(*exec_, st.uploaded.get(), exec_timeout_s(), "Sequential (staging inputs)");
    if (batch > st.rows) {
      Allocator& h = exec_->host_allocator();
      const auto b = batch;
      st.x = Tensor({b, in_features()}, dtype_of_v<T>, h);
      st.ids = Tensor({b}, DType::i64, h);
      st.labels = Tensor({b}, DType::i32, h);
      st.target = Tensor({b, out_features()}, dtype_of_v<T>, h);
      st.rows = b;
    }
    reserve(batch);
    return st;
  }
  void end_stage(Stage& st) { exec_->record(st.uploaded.get(), stream()); }

  // Copies n host elements into the stage buffer and queues their upload into `dst`.
  template <class U>
  void upload(Tensor& stage, Tensor& dst, const U* src, std::size_t n) {
    U* h = static_cast<U*>(stage.raw());
    if (n && h != src) std::memcpy(h, src, n * sizeof(U));
    exec_->copy_h2d(stream(), dst.raw(), h, n * sizeof(U));
  }

  void stage_inputs(Stage& st, const T* x, std::int64_t batch, const PassOptions& options) {
    const auto n = static_cast<std::size_t>(batch * in_features());
    if (options.exec_inputs)
      exec_->copy_d2d(stream(), input_.raw(), x, n * sizeof(T));
    else
      upload(st.x, input_, x, n);
    if (options.sample_ids)
      upload(st.ids, ids_, options.sample_ids, static_cast<std::size_t>(batch));
  }

  const T* run_forward(std::int64_t batch, const PassOptions& options) {
    ctx_.training = options.training;
    ctx_.sample_offset = options.sample_offset;
    ctx_.sample_ids = options.sample_ids ? static_cast<const std::int64_t*>(ids_.raw()) : nullptr;
    if (options.step >= 0)
      ctx_.step = static_cast<std::uint64_t>(options.step);
    else
      ctx_.step = static_cast<std::uint64_t>(forward_count_);
    if (options.training) ++forward_count_;
    batch_ = batch;
    forwarded_ = true;
    check_provider("Sequential::forward");
    const T* in = static_cast<const T*>(input_.raw());
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (sharded_ && i == units_[unit_of_[i]].first_layer) enter_unit(unit_of_[i], false);
      T* out = static_cast<T*>(acts_[i].raw());
      layers_[i]->forward(stream(), in, out, batch, ctx_);
      if (sharded_ && i + 1 == units_[unit_of_[i]].end_layer) provider_->forward_done(unit_of_[i]);
      in = out;
    }
    return in;
  }

  PendingLoss<Exec> finish_loss(std::size_t slot, const double* loss_exec) {
    double* host = static_cast<double*>(loss_host_.raw()) + slot;
    exec_->copy_d2h(stream(), host, loss_exec, sizeof(double));
    exec_->record(loss_events_[slot].get(), stream());
    slot_pass_[slot] = ++passes_;
    return PendingLoss<Exec>(exec_, loss_events_[slot].get(), host, &slot_pass_[slot], passes_);
  }

  const T* eval_to_host(const T* x, std::int64_t batch) {
    PassOptions eval;
    eval.training = false;
    forward(x, batch, eval);
    const std::size_t n = static_cast<std::size_t>(batch * out_features());
    if (eval_out_.size() < n)
      eval_out_ = Tensor({static_cast<std::int64_t>(n)}, dtype_of_v<T>, exec_->host_allocator());
    copy_output(static_cast<T*>(eval_out_.raw()));
    return static_cast<const T*>(eval_out_.raw());
  }

  // Exec buffers grow to the largest batch seen; steady-state steps do not allocate.
  void reserve(std::int64_t batch) {
    if (batch <= capacity_ && !acts_.empty()) return;
    const std::int64_t b = std::max<std::int64_t>(batch, 1);
    Allocator& a = exec_->allocator();
    acts_.clear();
    std::int64_t widest = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      acts_.emplace_back(Shape{b, sizes_[i + 1]}, dtype_of_v<T>, a);
      widest = std::max(widest, sizes_[i]);
      layers_[i]->reserve(b);
    }
    for (auto& d : dbuf_) d = Tensor({b, widest}, dtype_of_v<T>, a);
    input_ = Tensor({b, in_features()}, dtype_of_v<T>, a);
    ids_ = Tensor({b}, DType::i64, a);
    labels_ = Tensor({b}, DType::i32, a);
    target_ = Tensor({b, out_features()}, dtype_of_v<T>, a);
    loss_grad_ = Tensor({b, out_features()}, dtype_of_v<T>, a);
    capacity_ = b;
  }

  std::unique_ptr<Exec> owned_exec_;  // set when the model made its own policy
  detail::MovablePtr<Exec> exec_;     // null once moved from
  std::vector<std::unique_ptr<Layer<T, Exec>>> layers_;
  std::vector<Shape> shapes_;         // shapes_[i]: input sample shape of layer i; back(): output
  std::vector<std::int64_t> sizes_;   // element counts of shapes_
  std::vector<std::size_t> offsets_;  // arena offset of each layer's parameters
  std::vector<ParameterInfo> info_;
  Tensor params_, grads_;
  std::shared_ptr<detail::ArenaBinding> binding_;  // params_ and grads_, for the optimizers
  StateMirror<Exec> state_mirror_;  // host side of the parameters for checkpoints (devices)
  std::size_t arena_count_ = 0;     // elements of the whole arenas
  // Fully sharded mode (shard_parameters): params_ and grads_ hold parts_ back to back (part u
  // from part_starts_[u]); unit_of_[i] is layer i's unit; provider_ gathers the units.
  bool sharded_ = false;
  bool deferred_ = false;  // built without arenas (DeferredArenas) for shard_parameters to make
  std::vector<ParameterUnit> units_;
  StateParts parts_;
  std::vector<std::size_t> part_starts_, unit_of_;
  detail::MovablePtr<UnitProvider> provider_;
  std::vector<Tensor> part_mirrors_;  // host copies of this rank's parts for a save (devices)
  // Exec memory: input copy, layer outputs, input gradients (ping-pong), uploaded labels,
  // targets and sample ids, the loss gradient, and one loss value per slot.
  Tensor input_;
  std::vector<Tensor> acts_;  // acts_[i]: output of layer i
  Tensor dbuf_[2], ids_, labels_, target_, loss_grad_, loss_exec_;
  // Host memory: loss slots, input stages, evaluation output.
  Tensor loss_host_, eval_out_;
  Stage stages_[2];
  std::size_t next_stage_ = 0;
  std::vector<ExecEvent<Exec>> loss_events_;
  std::vector<std::uint64_t> slot_pass_;  // which pass each loss slot holds
  std::uint64_t passes_ = 0;
  std::int64_t capacity_ = 0;
  std::int64_t batch_ = 0;
  bool forwarded_ = false;
  PassContext ctx_;
  std::uint64_t seed_ = 0;
  std::int64_t forward_count_ = 0;
};

/// The float32 model used for training.
using Sequential = BasicSequential<float>;

}  // namespace dtrain
