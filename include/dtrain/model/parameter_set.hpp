// SPDX-License-Identifier: BSD-3-Clause
// dtrain: ParameterSet, named parameter and gradient tensors of a model whose forward and backward
// passes the application computes itself (its own CUDA, Kokkos or Fortran kernels). It stands
// where a Sequential stands for everything that works on the arenas: GradientSync, the
// optimizers, gradient clipping, replicas_identical and checkpoints.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_state.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/model/sequential.hpp>  // ParameterInfo, GradSink

namespace dtrain {

/// How BasicParameterSet::init(seed) fills a tensor. `user`: never written by init (the
/// application fills it, and making it identical on every rank is then its job: the same values
/// computed everywhere, or a broadcast). `zeros`, `ones`: constants. The random ones draw from a
/// counter-based stream keyed by (seed, the tensor's index in the set), so every rank that passes
/// the same seed gets the same values without communication; they need at least two dimensions,
/// read as [fan_out, fan_in, receptive field...]: fan_in = product of the extents after the
/// first, fan_out = first extent times the receptive field. Kaiming (He) scales by fan_in with
/// the ReLU gain, Xavier (Glorot) by fan_in + fan_out, as Linear's weights in a Sequential.
enum class ParameterInit : unsigned char {
  user,
  zeros,
  ones,
  kaiming_uniform,
  kaiming_normal,
  xavier_uniform,
  xavier_normal
};

/// One learnable tensor of a ParameterSet: its name (a '/'-separated checkpoint path such as
/// "encoder/weight"), its true shape (row-major, outermost first) and how init(seed) fills it.
struct ParameterSpec {
  std::string name;
  Shape shape;
  ParameterInit init = ParameterInit::user;
};

/// A tensor of a ParameterSet as the application's kernels see it: its place in the arenas
/// (elements) and pointers to its first parameter and first gradient element. The pointers are
/// memory of the set's execution policy (device pointers with a GPU policy) and stay valid for
/// the set's lifetime (for an adopted buffer: as long as the application keeps it).
template <class T>
struct ParameterRef {
  const std::string* name = nullptr;  // the set's own copy of the name
  const Shape* shape = nullptr;       // the set's own copy of the shape
  std::size_t index = 0;              // position in the set (arena order)
  std::size_t offset = 0;             // first element in the arenas
  std::size_t count = 0;              // elements
  T* param = nullptr;
  T* grad = nullptr;
};

/// The learnable tensors of a model that computes its own gradients, in scalar type T (float or
/// double), on execution policy Exec (HostExec by default). All parameters are one contiguous
/// arena and all gradients another of the same layout, the tensors back to back in the order
/// given, exactly as a Sequential's; both are either
///  - owned: allocated by the set in the policy's memory (zeroed, then init(0)), or
///  - adopted: two buffers of the policy's memory that the application already owns (BufferView,
///    dtype of T, as many elements as the tensors hold together), left as they are until init.
/// The application's forward and backward write the tensors through ParameterRef pointers (or
/// its own, for adopted buffers), ACCUMULATE or write the gradients as it likes, and report each
/// tensor's gradient as final with grad_ready(), last computed first, so that a GradientSync
/// averages it while the rest of the backward pass runs. Kernels must be queued on
/// exec().compute_stream() (or be complete) before their tensor is reported.
///
/// The set meets what the rest of dtrain asks of a model: parameters(), gradients() and exec()
/// for the optimizers (`AdamW opt(set, schedule)`), GradientSync (`set.gradients()`), clipping and
/// replicas_identical; parameter_info(); visit_state() for the Checkpointer, with a Sequential's
/// layout (every tensor under its name with its true shape, then the scalars "seed" and
/// "step_count"), so the file reads the same with h5py, and a set whose tensors carry a
/// Sequential's names ("layers/0_linear/weight", ...) and shapes restores from its checkpoints
/// and into them. Local object: not thread-safe.
template <class T, class Exec = HostExec>
class BasicParameterSet {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "BasicParameterSet holds float or double tensors");
  static_assert(detail::check_exec_policy<Exec>(), "BasicParameterSet needs an execution policy");

 public:
  using value_type = T;
  using exec_type = Exec;

  /// Owned arenas in the memory of `exec` (borrowed: it must outlive the set), zeroed, then
  /// init(0). Local, blocking. Throws InvalidArgument on an empty, repeated or malformed name
  /// (empty path component, leading or trailing '/', a name that is a group of another such as
  /// "enc" beside "enc/weight", or "seed" / "step_count"), a negative extent, or a random init
  /// on a tensor of fewer than two dimensions.
  BasicParameterSet(std::vector<ParameterSpec> tensors, Exec& exec) : exec_(&exec) {
    layout(std::move(tensors));
    allocate();
  }
  /// Same on a policy of its own made from `alloc` (HostExec: host memory from `alloc`, which
  /// must outlive the set; a non-host allocator throws InvalidArgument).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  explicit BasicParameterSet(std::vector<ParameterSpec> tensors,
                             Allocator& alloc = default_allocator())
      : owned_exec_(std::make_unique<Exec>(alloc)), exec_(owned_exec_.get()) {
    layout(std::move(tensors));
    allocate();
  }
  /// Adopted arenas: `params` and `grads` are the application's buffers (memory of the policy's
  /// space, dtype of T, each exactly as many elements as the tensors hold together; borrowed,
  /// they must outlive the set). Nothing is written to them here. Local. Throws InvalidArgument
  /// on a buffer of another dtype, space or size, a null buffer, or a spec rejected as above.
  BasicParameterSet(BufferView params, BufferView grads, std::vector<ParameterSpec> tensors,
                    Exec& exec)
      : exec_(&exec) {
    layout(std::move(tensors));
    adopt(params, grads);
  }
  /// Same on a policy of its own (default allocator for HostExec).
  template <class E = Exec, class = std::enable_if_t<std::is_constructible_v<E, Allocator&>>>
  BasicParameterSet(BufferView params, BufferView grads, std::vector<ParameterSpec> tensors)
      : owned_exec_(std::make_unique<Exec>(default_allocator())), exec_(owned_exec_.get()) {
    layout(std::move(tensors));
    adopt(params, grads);
  }

  BasicParameterSet(BasicParameterSet&&) noexcept = default;
  BasicParameterSet& operator=(BasicParameterSet&&) = delete;
  BasicParameterSet(const BasicParameterSet&) = delete;
  BasicParameterSet& operator=(const BasicParameterSet&) = delete;
  /// Waits (bounded) for the policy's queued work, which may use owned arenas.
  ~BasicParameterSet() {
    if (!exec_ || !owns_memory()) return;
    try {
      exec_->synchronize(exec_->compute_stream(), Deadline(exec_timeout_s()));
    } catch (...) {  // a device error was already reported to the waits that saw it
    }
  }

  /// The policy the set's memory belongs to.
  Exec& exec() const noexcept { return *exec_; }
  /// Whether the arenas were allocated by the set (false: adopted).
  bool owns_memory() const noexcept { return owned_arena_; }

  /// Number of tensors.
  std::size_t size() const noexcept { return info_.size(); }
  /// Number of learnable scalars (elements of each arena).
  std::size_t parameter_count() const noexcept { return count_; }
  /// The whole parameter arena (dtype of T, the policy's memory). Valid for the set's lifetime;
  /// the optimizers, broadcasts and checkpoint restores write it in stream order.
  BufferView parameters() const noexcept { return params_; }
  /// The whole gradient arena, same layout; hand it to GradientSync and to clipping.
  BufferView gradients() const noexcept { return grads_; }
  /// Typed host views of the arenas: only for policies whose memory is host memory (throws
  /// InvalidArgument otherwise).
  span<T> parameter_span() const { return params_.as<T>("ParameterSet::parameter_span"); }
  span<T> gradient_span() const { return grads_.as<T>("ParameterSet::gradient_span"); }
  /// Name, shape and arena range of every tensor, in arena order (`layer` holds the tensor's
  /// index in the set).
  const std::vector<ParameterInfo>& parameter_info() const noexcept { return info_; }

  /// Tensor `i` (arena order). Local; throws InvalidArgument when i >= size().
  ParameterRef<T> tensor(std::size_t i) const {
    DTRAIN_REQUIRE(i < info_.size(), "ParameterSet::tensor",
                   "tensor " << i << " of a set of " << info_.size());
    const ParameterInfo& p = info_[i];
    ParameterRef<T> r;
    r.name = &p.name;
    r.shape = &p.shape;
    r.index = i;
    r.offset = p.offset;
    r.count = p.count;
    r.param = static_cast<T*>(params_.data) + p.offset;
    r.grad = static_cast<T*>(grads_.data) + p.offset;
    return r;
  }
  /// The tensor named `name`. Local; throws InvalidArgument when there is none.
  ParameterRef<T> tensor(const std::string& name) const { return tensor(index_of(name)); }
  /// Index of the tensor named `name`. Local; throws InvalidArgument when there is none.
  std::size_t index_of(const std::string& name) const {
    for (std::size_t i = 0; i < info_.size(); ++i)
      if (info_[i].name == name) return i;
    raise<InvalidArgument>("ParameterSet::tensor", "no tensor named '" + name + "'");
  }

  /// Fills every tensor whose ParameterSpec::init is not `user` as that init says for `seed`
  /// (identical on every rank passing the same seed, without communication), leaves the `user`
  /// tensors as they are, records the seed (checkpointed) and queues zero_grad(). Local,
  /// blocking (values are generated in a host buffer of the drawn tensors' size, uploaded
  /// through the policy and freed before it returns).
  void init(std::uint64_t seed) {
    seed_ = seed;
    const auto s = exec_->compute_stream();
    std::size_t drawn = 0;
    for (std::size_t i = 0; i < info_.size(); ++i)
      if (inits_[i] != ParameterInit::user) drawn = info_[i].offset + info_[i].count;
    // Only up to the last drawn tensor; the set keeps no host copy between calls.
    Tensor host;
    if (drawn)
      host = Tensor({static_cast<std::int64_t>(drawn)}, dtype_of_v<T>, exec_->host_allocator());
    T* h = static_cast<T*>(host.raw());
    for (std::size_t i = 0; i < info_.size(); ++i) {
      const ParameterInfo& p = info_[i];
      if (inits_[i] == ParameterInit::user || p.count == 0) continue;
      fill(inits_[i], p.shape, seed, i, h + p.offset, p.count);
      exec_->copy_h2d(s, static_cast<T*>(params_.data) + p.offset, h + p.offset,
                      p.count * sizeof(T));
    }
    exec_synchronize(*exec_, s, exec_timeout_s(), "ParameterSet::init");
    zero_grad();
  }
  /// Seed of the last init (0 before any), restored by checkpoints.
  std::uint64_t seed() const noexcept { return seed_; }

  /// Queues the zeroing of the gradient arena on the compute stream. Local, non-blocking.
  void zero_grad() {
    if (count_) exec_->fill(exec_->compute_stream(), static_cast<T*>(grads_.data), count_, T(0));
  }

  /// Reports tensor `i`'s gradient as final to `sink` (a GradientSync, borrowed for the call, or
  /// a callable `void(std::size_t offset, std::size_t count)`): sink.ready(offset, count) with
  /// the tensor's arena range. Report each tensor once per step, after its gradient kernels are
  /// queued on exec().compute_stream(). Local, non-blocking (a GradientSync may start bucket
  /// all-reduces in it). Throws InvalidArgument when i >= size(), and what the sink throws (a
  /// range reported twice).
  void grad_ready(std::size_t i, GradSink sink) const {
    DTRAIN_REQUIRE(i < info_.size(), "ParameterSet::grad_ready",
                   "tensor " << i << " of a set of " << info_.size());
    if (info_[i].count) sink(info_[i].offset, info_[i].count);
  }
  /// Same for the tensor named `name`.
  void grad_ready(const std::string& name, GradSink sink) const {
    grad_ready(index_of(name), std::move(sink));
  }

  /// Training forwards of a Sequential whose checkpoint this set restored (kept so that a
  /// round trip through the set preserves it); the set itself never advances it.
  std::int64_t step_count() const noexcept { return step_count_; }

  /// Checkpoint protocol, a Sequential's layout: every tensor under its name with its true shape
  /// (device tensors staged through host memory, see StateMirror), then the scalars "seed" and
  /// "step_count". Blocking.
  template <class V>
  void visit_state(V& v) {
    for (const auto& p : info_)
      mirror_.visit(*exec_, v, p.name, params_, p.offset, p.count, p.shape);
    std::int64_t seed = static_cast<std::int64_t>(seed_);
    v.scalar("seed", seed);
    v.scalar("step_count", step_count_);
    if (v.loading()) seed_ = static_cast<std::uint64_t>(seed);
  }

 private:
  void layout(std::vector<ParameterSpec> tensors) {
    constexpr const char* op = "ParameterSet";
    std::size_t total = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      ParameterSpec& t = tensors[i];
      check_name(t.name, op);
      for (const auto& q : info_) {
        DTRAIN_REQUIRE(q.name != t.name, op, "tensor name '" << t.name << "' given twice");
        DTRAIN_REQUIRE(!is_group_of(q.name, t.name) && !is_group_of(t.name, q.name), op,
                       "tensor names '" << q.name << "' and '" << t.name
                                        << "' clash: one would be a group of the other in a "
                                           "checkpoint");
      }
      for (auto e : t.shape)
        DTRAIN_REQUIRE(e >= 0, op,
                       "tensor '" << t.name << "' has negative extent in " << to_string(t.shape));
      const bool random = t.init != ParameterInit::user && t.init != ParameterInit::zeros &&
                          t.init != ParameterInit::ones;
      DTRAIN_REQUIRE(!random || t.shape.size() >= 2, op,
                     "tensor '" << t.name << "' of shape " << to_string(t.shape)
                                << " has a random init, which needs [fan_out, fan_in, ...]");
      ParameterInfo info;
      info.name = std::move(t.name);
      info.shape = std::move(t.shape);
      info.offset = total;
      info.count = element_count(info.shape, op);
      info.layer = i;
      total += info.count;
      info_.push_back(std::move(info));
      inits_.push_back(t.init);
    }
    count_ = total;
  }

  static void check_name(const std::string& name, const char* op) {
    DTRAIN_REQUIRE(!name.empty(), op, "empty tensor name");
    DTRAIN_REQUIRE(
        name.front() != '/' && name.back() != '/' && name.find("//") == std::string::npos, op,
        "tensor name '" << name
                        << "' has an empty path component (leading, trailing or "
                           "doubled '/')");
    DTRAIN_REQUIRE(name != "seed" && name != "step_count", op,
                   "tensor name '" << name << "' is taken by the set's own scalar of that name");
  }
  // Whether `group` names a group that holds `name` ("enc" holds "enc/weight").
  static bool is_group_of(const std::string& group, const std::string& name) {
    return name.size() > group.size() && name.compare(0, group.size(), group) == 0 &&
           name[group.size()] == '/';
  }

  void allocate() {
    Allocator& a = exec_->allocator();
    const auto n = static_cast<std::int64_t>(count_);
    owned_params_ = Tensor({n}, dtype_of_v<T>, a);
    owned_grads_ = Tensor({n}, dtype_of_v<T>, a);
    owned_arena_ = true;
    params_ = owned_params_.view();
    grads_ = owned_grads_.view();
    // Never leave the arenas as whatever the allocator returned: `user` tensors start at zero.
    if (count_) {
      const auto s = exec_->compute_stream();
      exec_->fill(s, static_cast<T*>(params_.data), count_, T(0));
      exec_->fill(s, static_cast<T*>(grads_.data), count_, T(0));
    }
    init(0);
  }

  void adopt(BufferView params, BufferView grads) {
    constexpr const char* op = "ParameterSet";
    for (const BufferView* b : {&params, &grads}) {
      const char* what = b == &params ? "parameter" : "gradient";
      DTRAIN_REQUIRE(
          b->dtype == dtype_of_v<T>, op,
          what << " buffer holds " << name_of(b->dtype) << ", the set " << name_of(dtype_of_v<T>));
      DTRAIN_REQUIRE(b->space == Exec::space, op,
                     what << " buffer lives in " << name_of(b->space)
                          << " memory but the policy runs on " << name_of(Exec::space)
                          << " memory");
      DTRAIN_REQUIRE(b->count == count_, op,
                     what << " buffer has " << b->count << " elements, the tensors " << count_);
      DTRAIN_REQUIRE(b->data != nullptr || count_ == 0, op, "null " << what << " buffer");
    }
    DTRAIN_REQUIRE(params.data != grads.data || count_ == 0, op,
                   "parameters and gradients are the same buffer");
    params_ = params;
    grads_ = grads;
  }

  // Host values of one tensor for `how`, keyed by (seed, index) as a Linear layer's weights.
  static void fill(ParameterInit how, const Shape& shape, std::uint64_t seed, std::size_t index,
                   T* h, std::size_t n) {
    if (how == ParameterInit::zeros || how == ParameterInit::ones) {
      for (std::size_t k = 0; k < n; ++k) h[k] = how == ParameterInit::ones ? T(1) : T(0);
      return;
    }
    double receptive = 1;
    for (std::size_t d = 2; d < shape.size(); ++d) receptive *= static_cast<double>(shape[d]);
    const double fan_in = static_cast<double>(shape[1]) * receptive;
    const double fan_out = static_cast<double>(shape[0]) * receptive;
    RngStream rng(seed, index);
    if (how == ParameterInit::kaiming_uniform || how == ParameterInit::xavier_uniform) {
      const double bound = how == ParameterInit::kaiming_uniform
                               ? std::sqrt(6.0 / fan_in)
                               : std::sqrt(6.0 / (fan_in + fan_out));
      for (std::size_t k = 0; k < n; ++k)
        h[k] = static_cast<T>((2.0 * rng.uniform_double() - 1.0) * bound);
    } else {
      const double stddev = how == ParameterInit::kaiming_normal
                                ? std::sqrt(2.0 / fan_in)
                                : std::sqrt(2.0 / (fan_in + fan_out));
      for (std::size_t k = 0; k < n; ++k) h[k] = static_cast<T>(rng.normal() * stddev);
    }
  }

  std::unique_ptr<Exec> owned_exec_;  // set when the set made its own policy
  detail::MovablePtr<Exec> exec_;     // null once moved from
  std::vector<ParameterInfo> info_;
  std::vector<ParameterInit> inits_;
  std::size_t count_ = 0;
  Tensor owned_params_, owned_grads_;  // owned arenas (empty when adopted)
  bool owned_arena_ = false;
  BufferView params_, grads_;  // the arenas in use: the owned ones or the adopted buffers
  StateMirror<Exec> mirror_;   // host side of device tensors for visitors without copiers
  std::uint64_t seed_ = 0;
  std::int64_t step_count_ = 0;
};

/// The float32 set on the host.
using ParameterSet = BasicParameterSet<float>;

}  // namespace dtrain
