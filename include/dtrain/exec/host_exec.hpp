// SPDX-License-Identifier: BSD-3-Clause
// dtrain: HostExec, the execution policy that runs every kernel at once on the calling thread
// over host memory. The requirements it satisfies are documented in <dtrain/exec/exec_traits.hpp>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/space.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/kernels/host/dropout.hpp>
#include <dtrain/kernels/host/gemm.hpp>
#include <dtrain/kernels/host/layernorm.hpp>
#include <dtrain/kernels/host/loss.hpp>
#include <dtrain/kernels/host/memory.hpp>
#include <dtrain/kernels/host/optim.hpp>
#include <dtrain/kernels/host/reduce.hpp>

namespace dtrain {

/// Stream of HostExec: work runs when it is queued, so a stream carries no state.
struct HostStream {};
/// Event of HostExec: complete as soon as it is recorded.
struct HostEvent {};

/// The host execution policy: memory from a host allocator, kernels from <dtrain/kernels/host/>
/// run synchronously on the calling thread (every "queued" call has finished when it returns, so
/// events and streams are trivially complete). Stateless apart from the allocator and the GEMM
/// path; thread-safe (concurrent kernel calls on disjoint buffers are fine). The allocator is
/// borrowed and must outlive the policy.
class HostExec {
 public:
  using stream_type = HostStream;
  using event_type = HostEvent;
  static constexpr Space space = Space::host;

  /// Local. Throws InvalidArgument when `alloc` does not hand out host memory.
  explicit HostExec(Allocator& alloc = default_allocator(),
                    host::GemmPath gemm_path = host::GemmPath::automatic)
      : alloc_(&alloc), gemm_path_(gemm_path) {
    DTRAIN_REQUIRE(alloc.space() == Space::host, "HostExec",
                   "the host policy needs host memory but the allocator gives "
                       << name_of(alloc.space()) << " memory");
  }

  /// The process-wide default policy (default allocator, automatic GEMM path).
  static HostExec& instance() {
    static HostExec exec;
    return exec;
  }

  Allocator& allocator() const noexcept { return *alloc_; }
  Allocator& host_allocator() const noexcept { return *alloc_; }
  host::GemmPath gemm_path() const noexcept { return gemm_path_; }

  stream_type compute_stream() const noexcept { return {}; }
  stream_type create_stream() const noexcept { return {}; }
  void destroy_stream(stream_type) const noexcept {}
  event_type create_event() const noexcept { return {}; }
  void destroy_event(event_type) const noexcept {}
  void record(event_type, stream_type) const noexcept {}
  void stream_wait(stream_type, event_type) const noexcept {}
  bool query(event_type) const noexcept { return true; }
  bool wait_until(event_type, const Deadline&) const noexcept { return true; }
  bool synchronize(stream_type, const Deadline&) const noexcept { return true; }

  /// Runs a layer's host kernel f(args...) now (see <dtrain/exec/launch.hpp>).
  template <class F, class... A>
  void host_kernel(stream_type, const char*, F&& f, A&&... args) const {
    std::forward<F>(f)(std::forward<A>(args)...);
  }
  void copy_h2d(stream_type, void* dst, const void* src, std::size_t bytes) const noexcept {
    copy(dst, src, bytes);
  }
  void copy_d2h(stream_type, void* dst, const void* src, std::size_t bytes) const noexcept {
    copy(dst, src, bytes);
  }
  void copy_d2d(stream_type, void* dst, const void* src, std::size_t bytes) const noexcept {
    copy(dst, src, bytes);
  }
  template <class T>
  void fill(stream_type, T* x, std::size_t n, T value) const noexcept {
    host::fill(x, value, n);
  }

  template <class T>
  void gemm(stream_type, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
            const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc) const {
    host::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, gemm_path_);
  }
  template <class T>
  void bias_add(stream_type, T* y, const T* bias, std::int64_t rows, std::int64_t cols) const {
    host::bias_add(y, bias, rows, cols);
  }
  template <class T>
  void bias_grad(stream_type, const T* dy, T* db, std::int64_t rows, std::int64_t cols) const {
    host::bias_grad(dy, db, rows, cols);
  }
  template <class T>
  void activation_forward(stream_type, host::Activation f, const T* x, T* y, std::size_t n) const {
    host::activation_forward(f, x, y, n);
  }
  template <class T>
  void activation_backward(stream_type, host::Activation f, const T* x, const T* y, const T* dy,
                           T* dx, std::size_t n) const {
    host::activation_backward(f, x, y, dy, dx, n);
  }
  template <class T>
  void dropout_forward(stream_type, const T* x, T* y, std::int64_t rows, std::int64_t cols, float p,
                       std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                       const std::int64_t* sample_ids) const {
    host::dropout_forward(x, y, rows, cols, p, seed, step, sample_offset, sample_ids);
  }
  template <class T>
  void dropout_backward(stream_type, const T* dy, T* dx, std::int64_t rows, std::int64_t cols,
                        float p, std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                        const std::int64_t* sample_ids) const {
    host::dropout_backward(dy, dx, rows, cols, p, seed, step, sample_offset, sample_ids);
  }
  template <class T>
  void layernorm_forward(stream_type, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                         T* rstd, std::int64_t rows, std::int64_t cols, double eps) const {
    host::layernorm_forward(x, gamma, beta, y, mean, rstd, rows, cols, eps);
  }
  template <class T>
  void layernorm_backward(stream_type, const T* x, const T* gamma, const T* mean, const T* rstd,
                          const T* dy, T* dx, T* dgamma, T* dbeta, std::int64_t rows,
                          std::int64_t cols) const {
    host::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols);
  }
  template <class T>
  void softmax_cross_entropy(stream_type, const T* logits, const std::int32_t* labels,
                             std::int64_t rows, std::int64_t classes, T* dlogits, double scale,
                             double* loss) const {
    *loss = host::softmax_cross_entropy(logits, labels, rows, classes, dlogits, scale);
  }
  template <class T>
  void mse(stream_type, const T* pred, const T* target, std::int64_t rows, std::int64_t cols,
           T* dpred, double scale, double* loss) const {
    *loss = host::mse(pred, target, rows, cols, dpred, scale);
  }
  template <class T>
  void sgd_update(stream_type, T* p, const T* g, T* buf, std::size_t n,
                  const host::SgdParams& h) const {
    host::sgd_update(p, g, buf, n, h);
  }
  template <class T>
  void adamw_update(stream_type, T* p, const T* g, T* m, T* v, std::size_t n,
                    const host::AdamWParams& h) const {
    host::adamw_update(p, g, m, v, n, h);
  }
  template <class T>
  void sum_squares(stream_type, const T* x, std::size_t n, double* out) const {
    *out = host::sum_squares(x, n);
  }
  template <class T>
  void scale(stream_type, T* x, std::size_t n, T factor) const {
    host::scale(x, n, factor);
  }
  void reduce_into(stream_type, ReduceOp op, BufferView acc, BufferView in) const {
    host::reduce_into(op, acc, in);
  }
  void convert(stream_type, BufferView out, BufferView in) const { host::convert_into(out, in); }
  void scale_avg(stream_type, BufferView acc, int ranks) const {
    DTRAIN_REQUIRE(acc.space == Space::host, "HostExec::scale_avg",
                   "host kernel given " << name_of(acc.space) << " memory");
    host::scale_avg(acc.dtype, acc.data, acc.count, ranks);
  }

 private:
  static void copy(void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }

  Allocator* alloc_;
  host::GemmPath gemm_path_;
};

static_assert(detail::check_exec_policy<HostExec>(), "HostExec satisfies the policy");
static_assert(is_exec_policy_v<HostExec>, "HostExec satisfies the policy");

}  // namespace dtrain
