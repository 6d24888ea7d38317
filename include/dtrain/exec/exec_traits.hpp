// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the execution-policy requirements, their detection trait and small helpers that every
// policy shares (RAII events and streams, a host wait with a deadline).
//
// An execution policy is the one seam between generic code (Sequential, the optimizers,
// GradientSync) and the place the arithmetic runs. Generic code never branches on the memory
// space: it allocates through the policy, moves bytes with the policy's copies and queues every
// kernel on one of the policy's streams. HostExec (<dtrain/exec/host_exec.hpp>) runs everything
// at once on the calling thread; a GPU policy in kernels/ queues the same calls on device
// streams; tests/support/emulated_device.hpp queues host kernels on worker threads over memory
// the host may not touch.
//
// REQUIREMENTS on a policy E (an object; generic code borrows it as E&, and it must outlive
// every model, optimizer and sync built on it). "exec memory" below is memory from
// E::allocator(); "stream order" means the call only queues work, which runs after everything
// queued before it on the same stream.
//
//   Types and constants
//     typename E::stream_type      copyable handle of an ordered work queue
//     typename E::event_type       copyable handle of a completion marker
//     static constexpr Space E::space   the space of allocator()'s memory
//
//   Memory
//     Allocator& allocator()       exec memory: parameters, gradients, activations, optimizer
//                                  state, scratch. Its space() is E::space. Not zeroed.
//     Allocator& host_allocator()  host memory (Space::host) that copies reach fastest (pinned
//                                  on a GPU): staging buffers, loss slots.
//
//   Streams and events (thread-safe: a progress thread may use them next to the compute thread)
//     stream_type compute_stream()                 the stream the model's kernels run on
//     stream_type create_stream()                  a further stream (copies, communication)
//     void destroy_stream(stream_type) noexcept    waits for its work first
//     event_type create_event()
//     void destroy_event(event_type) noexcept
//     void record(event_type, stream_type)         completes once the stream reaches this point
//     void stream_wait(stream_type, event_type)    later work on the stream waits for the event's
//                                                  last record (never blocks the host)
//     bool query(event_type)                       non-blocking; true once the last record has
//                                                  completed (true for a never-recorded event)
//     bool wait_until(event_type, const Deadline&) host-blocking; false when the deadline passed
//     bool synchronize(stream_type, const Deadline&)  host-blocking until the stream's queued work
//                                                  is done; false when the deadline passed
//
//   Copies (stream order; the host side must stay alive and unchanged until the copy completes;
//   a copy whose pointers are in the wrong spaces is an error, DeviceError where detected)
//     void copy_h2d(stream_type, void* exec_dst, const void* host_src, std::size_t bytes)
//     void copy_d2h(stream_type, void* host_dst, const void* exec_src, std::size_t bytes)
//     void copy_d2d(stream_type, void* exec_dst, const void* exec_src, std::size_t bytes)
//     template <class T> void fill(stream_type, T* x, std::size_t n, T value)
//
//   Kernels (stream order; T is float or double; all pointers exec memory unless said; each
//   call has the semantics of the host kernel of the same name in <dtrain/kernels/host/...>)
//     gemm(s, bool ta, bool tb, int64 m, int64 n, int64 k, T alpha, const T* a, int64 lda,
//          const T* b, int64 ldb, T beta, T* c, int64 ldc)                  row-major
//     bias_add(s, T* y, const T* bias, int64 rows, int64 cols)
//     bias_grad(s, const T* dy, T* db, int64 rows, int64 cols)              accumulates
//     activation_forward(s, host::Activation, const T* x, T* y, std::size_t n)
//     activation_backward(s, host::Activation, const T* x, const T* y, const T* dy, T* dx,
//                         std::size_t n)
//     dropout_forward(s, const T* x, T* y, int64 rows, int64 cols, float p, uint64 seed,
//                     uint64 step, int64 sample_offset, const int64* sample_ids /*or null*/)
//     dropout_backward(s, const T* dy, T* dx, ... same tail ...)            same masks as host
//     layernorm_forward(s, x, gamma, beta, y, mean, rstd, int64 rows, int64 cols, double eps)
//     layernorm_backward(s, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, int64 rows, int64 cols)
//     softmax_cross_entropy(s, const T* logits, const int32* labels, int64 rows, int64 classes,
//                           T* dlogits /*or null*/, double scale, double* loss /*1 element*/)
//     mse(s, const T* pred, const T* target, int64 rows, int64 cols, T* dpred /*or null*/,
//         double scale, double* loss /*1 element*/)
//     sgd_update(s, T* p, const T* g, T* buf /*null without momentum*/, std::size_t n,
//                const host::SgdParams&)
//     adamw_update(s, T* p, const T* g, T* m, T* v, std::size_t n, const host::AdamWParams&)
//     sum_squares(s, const T* x, std::size_t n, double* out /*1 element*/)  sum of x[i]^2 in
//                                                  double (gradient norms; the device's order
//                                                  may differ from the host's by rounding)
//     scale(s, T* x, std::size_t n, T factor)                               x[i] *= factor
//     reduce_into(s, ReduceOp, BufferView acc, BufferView in)               acc (op)= in
//     scale_avg(s, BufferView acc, int ranks)                               finishes an avg
//   Labels are validated on the host before they are uploaded; device kernels never throw.
//
//   Optional: 16-bit gradients handed over to a transport (GradientSync, FullyShardedSync)
//     convert(s, BufferView out, BufferView in)     out = in between f16/bf16 and f32 (widened
//                                                  exactly, or rounded once to nearest even);
//                                                  a policy with it also takes reduce_into with
//                                                  an f32 acc and a 16-bit `in` (widened into it)
//
//   Optional (see <dtrain/exec/launch.hpp>: how layers bring their own kernels)
//     host_kernel(s, const char* name, F f, A... args)    runs f(args...) in stream order on the
//                                                  host (policies whose kernels run on the host)
//     for_each_index<F>(s, const char* name, int64 n, A... args)   runs F{args...}(i), i < n
//   A GPU policy has neither: its stream_type is the native stream layers launch kernels on.
//   Device IPC (sharing device memory with the other processes of a node): the members listed
//   in <dtrain/exec/exec_ipc.hpp>, detected by has_exec_ipc_v.
//
// is_exec_policy_v<E> is true when E has all of the above; detail::check_exec_policy<E>() fires
// one static_assert per missing member, naming it. Generic entry points call it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/env.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/space.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/kernels/host/optim.hpp>

namespace dtrain {

namespace detail {
namespace exec_probe {
template <class E>
using S = typename E::stream_type;
template <class E>
using Ev = typename E::event_type;
template <class E>
E& e();
template <class T>
T* p();
using i64 = std::int64_t;

#define DTRAIN_EXEC_PROBE(name, ...) \
  template <class E, class = void>   \
  struct name : std::false_type {};  \
  template <class E>                 \
  struct name<E, std::void_t<decltype(__VA_ARGS__)>> : std::true_type {};

DTRAIN_EXEC_PROBE(exec_has_types, std::declval<S<E>&>(), std::declval<Ev<E>&>(),
                  std::integral_constant<Space, E::space>{})
DTRAIN_EXEC_PROBE(exec_has_allocators, static_cast<Allocator&>(e<E>().allocator()),
                  static_cast<Allocator&>(e<E>().host_allocator()))
DTRAIN_EXEC_PROBE(exec_has_streams, S<E>(e<E>().compute_stream()), S<E>(e<E>().create_stream()),
                  e<E>().destroy_stream(std::declval<S<E>>()))
DTRAIN_EXEC_PROBE(exec_has_events, Ev<E>(e<E>().create_event()),
                  e<E>().destroy_event(std::declval<Ev<E>>()),
                  e<E>().record(std::declval<Ev<E>>(), std::declval<S<E>>()),
                  e<E>().stream_wait(std::declval<S<E>>(), std::declval<Ev<E>>()),
                  bool{e<E>().query(std::declval<Ev<E>>())},
                  bool{e<E>().wait_until(std::declval<Ev<E>>(), std::declval<const Deadline&>())},
                  bool{e<E>().synchronize(std::declval<S<E>>(), std::declval<const Deadline&>())})
DTRAIN_EXEC_PROBE(exec_has_copies,
                  e<E>().copy_h2d(std::declval<S<E>>(), p<void>(), p<const void>(), std::size_t{}),
                  e<E>().copy_d2h(std::declval<S<E>>(), p<void>(), p<const void>(), std::size_t{}),
                  e<E>().copy_d2d(std::declval<S<E>>(), p<void>(), p<const void>(), std::size_t{}),
                  e<E>().fill(std::declval<S<E>>(), p<float>(), std::size_t{}, 0.0f),
                  e<E>().fill(std::declval<S<E>>(), p<double>(), std::size_t{}, 0.0))
DTRAIN_EXEC_PROBE(exec_has_gemm,
                  e<E>().gemm(std::declval<S<E>>(), false, false, i64{}, i64{}, i64{}, 1.0f,
                              p<const float>(), i64{}, p<const float>(), i64{}, 0.0f, p<float>(),
                              i64{}),
                  e<E>().gemm(std::declval<S<E>>(), false, false, i64{}, i64{}, i64{}, 1.0,
                              p<const double>(), i64{}, p<const double>(), i64{}, 0.0, p<double>(),
                              i64{}))
DTRAIN_EXEC_PROBE(exec_has_bias_activation,
                  e<E>().bias_add(std::declval<S<E>>(), p<float>(), p<const float>(), i64{}, i64{}),
                  e<E>().bias_grad(std::declval<S<E>>(), p<const float>(), p<float>(), i64{},
                                   i64{}),
                  e<E>().activation_forward(std::declval<S<E>>(), host::Activation::relu,
                                            p<const float>(), p<float>(), std::size_t{}),
                  e<E>().activation_backward(std::declval<S<E>>(), host::Activation::relu,
                                             p<const float>(), p<const float>(), p<const float>(),
                                             p<float>(), std::size_t{}))
DTRAIN_EXEC_PROBE(exec_has_dropout,
                  e<E>().dropout_forward(std::declval<S<E>>(), p<const float>(), p<float>(), i64{},
                                         i64{}, 0.5f, std::uint64_t{}, std::uint64_t{}, i64{},
                                         p<const i64>()),
                  e<E>().dropout_backward(std::declval<S<E>>(), p<const float>(), p<float>(), i64{},
                                          i64{}, 0.5f, std::uint64_t{}, std::uint64_t{}, i64{},
                                          p<const i64>()))
DTRAIN_EXEC_PROBE(exec_has_layernorm,
                  e<E>().layernorm_forward(std::declval<S<E>>(), p<const float>(), p<const float>(),
                                           p<const float>(), p<float>(), p<float>(), p<float>(),
                                           i64{}, i64{}, 1e-5),
                  e<E>().layernorm_backward(std::declval<S<E>>(), p<const float>(),
                                            p<const float>(), p<const float>(), p<const float>(),
                                            p<const float>(), p<float>(), p<float>(), p<float>(),
                                            i64{}, i64{}))
DTRAIN_EXEC_PROBE(exec_has_losses,
                  e<E>().softmax_cross_entropy(std::declval<S<E>>(), p<const float>(),
                                               p<const std::int32_t>(), i64{}, i64{}, p<float>(),
                                               1.0, p<double>()),
                  e<E>().mse(std::declval<S<E>>(), p<const float>(), p<const float>(), i64{}, i64{},
                             p<float>(), 1.0, p<double>()))
DTRAIN_EXEC_PROBE(exec_has_optimizers,
                  e<E>().sgd_update(std::declval<S<E>>(), p<float>(), p<const float>(), p<float>(),
                                    std::size_t{}, std::declval<const host::SgdParams&>()),
                  e<E>().adamw_update(std::declval<S<E>>(), p<float>(), p<const float>(),
                                      p<float>(), p<float>(), std::size_t{},
                                      std::declval<const host::AdamWParams&>()))
DTRAIN_EXEC_PROBE(exec_has_norms,
                  e<E>().sum_squares(std::declval<S<E>>(), p<const float>(), std::size_t{},
                                     p<double>()),
                  e<E>().sum_squares(std::declval<S<E>>(), p<const double>(), std::size_t{},
                                     p<double>()),
                  e<E>().scale(std::declval<S<E>>(), p<float>(), std::size_t{}, 1.0f),
                  e<E>().scale(std::declval<S<E>>(), p<double>(), std::size_t{}, 1.0))
DTRAIN_EXEC_PROBE(exec_has_reduce,
                  e<E>().reduce_into(std::declval<S<E>>(), ReduceOp::sum, BufferView{},
                                     BufferView{}),
                  e<E>().scale_avg(std::declval<S<E>>(), BufferView{}, 2))

#undef DTRAIN_EXEC_PROBE
}  // namespace exec_probe
}  // namespace detail

/// True when E provides every member the requirements at the top of this header list.
template <class E>
inline constexpr bool is_exec_policy_v = detail::exec_probe::exec_has_types<E>::value&&
    detail::exec_probe::exec_has_allocators<E>::value&& detail::exec_probe::exec_has_streams<
        E>::value&& detail::exec_probe::exec_has_events<E>::value&&
        detail::exec_probe::exec_has_copies<E>::value&& detail::exec_probe::exec_has_gemm<
            E>::value&& detail::exec_probe::exec_has_bias_activation<E>::value&&
            detail::exec_probe::exec_has_dropout<E>::value&& detail::exec_probe::exec_has_layernorm<
                E>::value&& detail::exec_probe::exec_has_losses<E>::value&&
                detail::exec_probe::exec_has_optimizers<E>::value&&
                    detail::exec_probe::exec_has_norms<E>::value&&
                        detail::exec_probe::exec_has_reduce<E>::value;

namespace detail {
template <class E, class = void>
struct exec_converts : std::false_type {};
template <class E>
struct exec_converts<E, std::void_t<decltype(std::declval<E&>().convert(
                            std::declval<typename E::stream_type>(), BufferView{}, BufferView{}))>>
    : std::true_type {};
}  // namespace detail
/// True when E has the optional convert(stream, out, in) between 16-bit floats and f32 (and the
/// widening reduce_into that goes with it): it reduces 16-bit floats with an f32 accumulator.
template <class E>
inline constexpr bool exec_converts_v = detail::exec_converts<E>::value;

namespace detail {
/// Fires one static_assert per missing group of members so the compiler names what is wrong.
template <class E>
constexpr bool check_exec_policy() {
  using namespace exec_probe;  // NOLINT(google-build-using-namespace): the probes only
  static_assert(exec_has_types<E>::value,
                "dtrain execution policy: missing `stream_type`, `event_type` or "
                "`static constexpr Space space`");
  static_assert(exec_has_allocators<E>::value,
                "dtrain execution policy: missing `Allocator& allocator()` / "
                "`Allocator& host_allocator()`");
  static_assert(exec_has_streams<E>::value,
                "dtrain execution policy: missing `stream_type compute_stream()`, "
                "`stream_type create_stream()` or `void destroy_stream(stream_type) noexcept`");
  static_assert(exec_has_events<E>::value,
                "dtrain execution policy: missing one of `create_event`, `destroy_event`, "
                "`record(event, stream)`, `stream_wait(stream, event)`, `bool query(event)`, "
                "`bool wait_until(event, const Deadline&)`, "
                "`bool synchronize(stream, const Deadline&)`");
  static_assert(exec_has_copies<E>::value,
                "dtrain execution policy: missing `copy_h2d`, `copy_d2h`, `copy_d2d` "
                "(stream, void* dst, const void* src, std::size_t bytes) or "
                "`fill(stream, T*, std::size_t, T)` for float and double");
  static_assert(exec_has_gemm<E>::value,
                "dtrain execution policy: missing `gemm(stream, bool, bool, int64 m, n, k, T "
                "alpha, const T* a, int64 lda, const T* b, int64 ldb, T beta, T* c, int64 ldc)`");
  static_assert(exec_has_bias_activation<E>::value,
                "dtrain execution policy: missing `bias_add`, `bias_grad`, "
                "`activation_forward` or `activation_backward`");
  static_assert(exec_has_dropout<E>::value,
                "dtrain execution policy: missing `dropout_forward` or `dropout_backward`");
  static_assert(exec_has_layernorm<E>::value,
                "dtrain execution policy: missing `layernorm_forward` or `layernorm_backward`");
  static_assert(exec_has_losses<E>::value,
                "dtrain execution policy: missing `softmax_cross_entropy(stream, logits, labels, "
                "rows, classes, dlogits, scale, double* loss)` or `mse(...)`");
  static_assert(exec_has_optimizers<E>::value,
                "dtrain execution policy: missing `sgd_update(stream, p, g, buf, n, "
                "host::SgdParams)` or `adamw_update(stream, p, g, m, v, n, host::AdamWParams)`");
  static_assert(exec_has_norms<E>::value,
                "dtrain execution policy: missing `sum_squares(stream, const T*, std::size_t, "
                "double*)` or `scale(stream, T*, std::size_t, T)` for float and double");
  static_assert(exec_has_reduce<E>::value,
                "dtrain execution policy: missing `reduce_into(stream, ReduceOp, BufferView, "
                "BufferView)` or `scale_avg(stream, BufferView, int)`");
  return true;
}
}  // namespace detail

namespace detail {
// What an ExecHandle owns, and how policy E makes and releases it.
template <class E>
struct EventOf {
  using type = typename E::event_type;
  static type make(E& exec) { return exec.create_event(); }
  static void release(E& exec, type event) noexcept { exec.destroy_event(event); }
};
template <class E>
struct StreamOf {
  using type = typename E::stream_type;
  static type make(E& exec) { return exec.create_stream(); }
  static void release(E& exec, type stream) noexcept { exec.destroy_stream(stream); }
};

/// An event or stream of policy E (Kind: EventOf<E> or StreamOf<E>) made for its owner and
/// released with it. Move-only; as thread-safe as E's events and streams.
template <class E, class Kind>
class ExecHandle {
 public:
  ExecHandle() = default;
  explicit ExecHandle(E& exec) : exec_(&exec), handle_(Kind::make(exec)) {}
  ExecHandle(ExecHandle&& o) noexcept
      : exec_(std::exchange(o.exec_, nullptr)), handle_(std::move(o.handle_)) {}
  ExecHandle& operator=(ExecHandle&& o) noexcept {
    if (this != &o) {
      reset();
      exec_ = std::exchange(o.exec_, nullptr);
      handle_ = std::move(o.handle_);
    }
    return *this;
  }
  ExecHandle(const ExecHandle&) = delete;
  ExecHandle& operator=(const ExecHandle&) = delete;
  ~ExecHandle() { reset(); }
  typename Kind::type get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (exec_) Kind::release(*exec_, handle_);
    exec_ = nullptr;
  }
  E* exec_ = nullptr;
  typename Kind::type handle_{};
};
}  // namespace detail

/// An event of policy E, destroyed with its owner. Move-only; as thread-safe as E's events.
template <class E>
using ExecEvent = detail::ExecHandle<E, detail::EventOf<E>>;

/// A stream of policy E created for its owner and destroyed (after its work) with it.
template <class E>
using ExecStream = detail::ExecHandle<E, detail::StreamOf<E>>;

/// Host-blocking wait for `event` bounded by `seconds` (negative: no bound); throws TimeoutError
/// naming `operation` when it expires. Thread-safe as E's events are.
template <class E>
void exec_wait(E& exec, typename E::event_type event, double seconds, const char* operation) {
  const Deadline deadline(seconds);
  if (!exec.wait_until(event, deadline))
    raise<TimeoutError>(operation, "waiting for device work timed out after " +
                                       std::to_string(deadline.budget()) + " s");
}

/// Host-blocking wait for every queued work item of `stream`, bounded like exec_wait.
template <class E>
void exec_synchronize(E& exec, typename E::stream_type stream, double seconds,
                      const char* operation) {
  const Deadline deadline(seconds);
  if (!exec.synchronize(stream, deadline))
    raise<TimeoutError>(operation, "waiting for a stream timed out after " +
                                       std::to_string(deadline.budget()) + " s");
}

/// Default bound of the host waits of generic code (seconds): 300, or DTRAIN_EXEC_TIMEOUT_S,
/// read strictly once per process (a value that is not a number of seconds in [0.001, 1e9] is
/// an InvalidArgument naming the variable, raised by every call). Local, thread-safe.
inline double exec_timeout_s() {
  static const double value = env::get_double("DTRAIN_EXEC_TIMEOUT_S", 300.0, 1e-3, 1e9);
  return value;
}

}  // namespace dtrain
