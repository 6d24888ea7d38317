// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the GPU execution policy (CUDA or HIP, whichever compiler builds the unit). It satisfies
// the requirements documented in <dtrain/exec/exec_traits.hpp> with device memory, streams and
// events from <dtrain/kernels/gpu.hpp> and the single-source kernels of <dtrain/kernels/*.cuh>,
// so BasicSequential<T, GpuExec> and BasicAdamW<GpuExec> keep parameters, gradients, activations
// and optimizer state on the device and queue every kernel on the policy's compute stream.
//
// GEMM is a type argument: GpuExec runs dtrain's tiled kernel; GpuBlasExec (declared only where the
// unit has cuBLAS / hipBLAS, DTRAIN_HAVE_CUBLAS / DTRAIN_HAVE_HIPBLAS) calls the vendor library.
// Compile with nvcc or hipcc (dtrain_add_gpu_executable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/exec/exec_ipc.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/kernels/activation.cuh>
#include <dtrain/kernels/dropout.cuh>
#include <dtrain/kernels/gemm.cuh>
#include <dtrain/kernels/gpu.hpp>
#include <dtrain/kernels/host/activation.hpp>
#include <dtrain/kernels/host/optim.hpp>
#include <dtrain/kernels/layernorm.cuh>
#include <dtrain/kernels/loss.cuh>
#include <dtrain/kernels/memory.cuh>
#include <dtrain/kernels/optim.cuh>
#include <dtrain/kernels/reduce.cuh>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

/// Execution policy on one GPU. Memory: device memory from allocator(), pinned host memory from
/// host_allocator(). Work: every call below only queues work on the stream it is given (the
/// copies with pageable host memory may block, as the runtime's do). One policy per device; its
/// threads (the compute thread, a progress thread) may share it: the runtime calls are
/// thread-safe, and the policy makes its device current before launching. The loss kernels share
/// one scratch buffer: call them from one stream (the compute stream). Not copyable or movable.
template <class Gemm = TiledGemm>
class BasicGpuExec {
 public:
  using stream_type = stream_t;
  using event_type = event_t;
  using gemm_engine = Gemm;
  static constexpr Space space = gpu::space;

  /// Makes `device` current on this thread and creates the compute stream. Local, blocking.
  /// Throws DeviceError (no such device, no driver).
  explicit BasicGpuExec(int device = 0) : device_(device) {
    set_device(device_);
    compute_ = stream_create();
  }
  BasicGpuExec(const BasicGpuExec&) = delete;
  BasicGpuExec& operator=(const BasicGpuExec&) = delete;
  /// Waits for the compute stream, then releases it and the scratch buffer. Never throws.
  ~BasicGpuExec() {
    destroy_stream(compute_);
    gpu::free(scratch_);
  }

  /// The device this policy runs on.
  int device() const noexcept { return device_; }
  /// Whether `p` is device (or managed) memory, of any device: what a caller's array is checked
  /// with before it is read as device memory (ConfiguredRun). Local, never throws.
  bool is_device(const void* p) const noexcept { return is_device_pointer(p); }

  Allocator& allocator() noexcept { return device_alloc_; }
  Allocator& host_allocator() noexcept { return pinned_alloc_; }

  // ---- Streams and events ----
  stream_type compute_stream() const noexcept { return compute_; }
  stream_type create_stream() {
    set_device(device_);
    return stream_create();
  }
  /// Waits for the stream's queued work, then destroys it. Never throws.
  void destroy_stream(stream_type s) noexcept {
    if (!s) return;
    try {
      stream_synchronize(s);
    } catch (...) {  // a device error was reported to the waits that saw it
    }
    stream_destroy(s);
  }
  event_type create_event() { return event_create_sync(); }
  void destroy_event(event_type e) noexcept {
    if (e) event_destroy(e);
  }
  void record(event_type e, stream_type s) { event_record(e, s); }
  void stream_wait(stream_type s, event_type e) { stream_wait_event(s, e); }
  bool query(event_type e) { return event_query(e); }
  /// Host-blocking poll (spin, then yield, then sleep) until the event completes; false when
  /// the deadline passes first. Throws DeviceError if the device reports an error.
  bool wait_until(event_type e, const Deadline& deadline) {
    dtrain::detail::Backoff backoff;
    while (!event_query(e)) {
      if (deadline.expired()) return false;
      backoff.pause();
    }
    return true;
  }
  /// Same for everything queued on `s`.
  bool synchronize(stream_type s, const Deadline& deadline) {
    dtrain::detail::Backoff backoff;
    while (!stream_query(s)) {
      if (deadline.expired()) return false;
      backoff.pause();
    }
    return true;
  }

  // ---- Device IPC (<dtrain/exec/exec_ipc.hpp>): CUDA / HIP IPC handles ----
  using ipc_handle_type = ipc_mem_handle_t;
  /// The runtime's legacy IPC, for memory from allocator() (failures show when a peer opens).
  bool ipc_available() const noexcept { return true; }
  ipc_handle_type ipc_export(void* base) {
    set_device(device_);
    return ipc_get_mem_handle(base);
  }
  void* ipc_open(const ipc_handle_type& h) {
    set_device(device_);
    return ipc_open_mem_handle(h);
  }
  void ipc_close(void* p) noexcept { ipc_close_mem_handle(p); }

  // ---- Copies (explicit directions: the runtime rejects a pointer in the wrong space) ----
  void copy_h2d(stream_type s, void* dst, const void* src, std::size_t bytes) {
    memcpy_async(dst, src, bytes, CopyKind::host_to_device, s);
  }
  void copy_d2h(stream_type s, void* dst, const void* src, std::size_t bytes) {
    memcpy_async(dst, src, bytes, CopyKind::device_to_host, s);
  }
  void copy_d2d(stream_type s, void* dst, const void* src, std::size_t bytes) {
    memcpy_async(dst, src, bytes, CopyKind::device_to_device, s);
  }
  template <class T>
  void fill(stream_type s, T* x, std::size_t n, T value) {
    gpu::fill(x, value, n, s);
  }

  // ---- Kernels: the semantics of the host kernels of the same names ----
  template <class T>
  void gemm(stream_type s, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
            T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
            std::int64_t ldc) {
    Gemm{}(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, s);
  }
  template <class T>
  void bias_add(stream_type s, T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
    gpu::bias_add(y, bias, rows, cols, s);
  }
  template <class T>
  void bias_grad(stream_type s, const T* dy, T* db, std::int64_t rows, std::int64_t cols) {
    gpu::bias_grad(dy, db, rows, cols, s);
  }
  template <class T>
  void activation_forward(stream_type s, host::Activation f, const T* x, T* y, std::size_t n) {
    gpu::activation_forward(f, x, y, n, s);
  }
  template <class T>
  void activation_backward(stream_type s, host::Activation f, const T* x, const T* y, const T* dy,
                           T* dx, std::size_t n) {
    gpu::activation_backward(f, x, y, dy, dx, n, s);
  }
  template <class T>
  void dropout_forward(stream_type s, const T* x, T* y, std::int64_t rows, std::int64_t cols,
                       float p, std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                       const std::int64_t* sample_ids) {
    gpu::dropout_forward(x, y, rows, cols, p, seed, step, sample_offset, sample_ids, s);
  }
  template <class T>
  void dropout_backward(stream_type s, const T* dy, T* dx, std::int64_t rows, std::int64_t cols,
                        float p, std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                        const std::int64_t* sample_ids) {
    gpu::dropout_backward(dy, dx, rows, cols, p, seed, step, sample_offset, sample_ids, s);
  }
  template <class T>
  void layernorm_forward(stream_type s, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                         T* rstd, std::int64_t rows, std::int64_t cols, double eps) {
    gpu::layernorm_forward(x, gamma, beta, y, mean, rstd, rows, cols, eps, s);
  }
  template <class T>
  void layernorm_backward(stream_type s, const T* x, const T* gamma, const T* mean, const T* rstd,
                          const T* dy, T* dx, T* dgamma, T* dbeta, std::int64_t rows,
                          std::int64_t cols) {
    gpu::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols, s);
  }
  /// `loss` is one double of exec (device) memory: the mean over rows, left on the device.
  template <class T>
  void softmax_cross_entropy(stream_type s, const T* logits, const std::int32_t* labels,
                             std::int64_t rows, std::int64_t classes, T* dlogits, double scale,
                             double* loss) {
    T* row_loss = scratch<T>(static_cast<std::size_t>(rows > 0 ? rows : 0));
    gpu::softmax_cross_entropy(logits, labels, rows, classes, dlogits, row_loss, scale, s);
    gpu::sum_to(row_loss, static_cast<std::size_t>(rows > 0 ? rows : 0),
                rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0, loss, s);
  }
  /// `loss` as for softmax_cross_entropy: the mean of the squared errors.
  template <class T>
  void mse(stream_type s, const T* pred, const T* target, std::int64_t rows, std::int64_t cols,
           T* dpred, double scale, double* loss) {
    const std::size_t n = static_cast<std::size_t>(rows > 0 && cols > 0 ? rows * cols : 0);
    T* sq = scratch<T>(n);
    gpu::mse(pred, target, rows, cols, dpred, sq, scale, s);
    gpu::sum_to(sq, n, n ? 1.0 / static_cast<double>(n) : 0.0, loss, s);
  }
  template <class T>
  void sgd_update(stream_type s, T* p, const T* g, T* buf, std::size_t n,
                  const host::SgdParams& h) {
    gpu::sgd_update(p, g, buf, n, h, s);
  }
  template <class T>
  void adamw_update(stream_type s, T* p, const T* g, T* m, T* v, std::size_t n,
                    const host::AdamWParams& h) {
    gpu::adamw_update(p, g, m, v, n, h, s);
  }
  /// `out` is one double of device memory; the partial sums use the loss kernels' scratch (so:
  /// the compute stream, like them).
  template <class T>
  void sum_squares(stream_type s, const T* x, std::size_t n, double* out) {
    gpu::sum_squares(x, n, out, scratch<double>(sum_squares_blocks(n)), s);
  }
  template <class T>
  void scale(stream_type s, T* x, std::size_t n, T factor) {
    gpu::scale(x, n, factor, s);
  }
  /// acc (op)= in on device memory of this dialect (called from a progress thread too).
  void reduce_into(stream_type s, ReduceOp op, BufferView acc, BufferView in) {
    set_device(device_);
    gpu::reduce_into(op, acc, in, s);
  }
  /// out = in between a 16-bit float type and f32 (widened, or rounded once); device memory of
  /// this dialect (called from a progress thread too).
  void convert(stream_type s, BufferView out, BufferView in) {
    set_device(device_);
    gpu::convert_into(out, in, s);
  }
  /// Finishes an avg: acc /= ranks. Throws InvalidArgument for memory that is not this
  /// dialect's device memory.
  void scale_avg(stream_type s, BufferView acc, int ranks) {
    DTRAIN_REQUIRE(acc.space == gpu::space, "GpuExec::scale_avg",
                   "device kernel given " << name_of(acc.space) << " memory");
    set_device(device_);
    switch (acc.dtype) {
      case DType::f32: return gpu::scale_avg(static_cast<float*>(acc.data), acc.count, ranks, s);
      case DType::f64: return gpu::scale_avg(static_cast<double*>(acc.data), acc.count, ranks, s);
      case DType::f16: return gpu::scale_avg(static_cast<half*>(acc.data), acc.count, ranks, s);
      case DType::bf16:
        return gpu::scale_avg(static_cast<bfloat16*>(acc.data), acc.count, ranks, s);
      case DType::i32:
        return gpu::scale_avg(static_cast<std::int32_t*>(acc.data), acc.count, ranks, s);
      case DType::i64:
        return gpu::scale_avg(static_cast<std::int64_t*>(acc.data), acc.count, ranks, s);
    }
  }

 private:
  // Device scratch of at least n elements of T, grown on demand. Growing waits for the device,
  // since queued kernels may still read the old buffer (it happens once per new maximum size).
  template <class T>
  T* scratch(std::size_t n) {
    const std::size_t bytes = (n ? n : 1) * sizeof(T);
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    if (bytes > scratch_bytes_) {
      gpu::synchronize();
      gpu::free(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      scratch_ = gpu::malloc(bytes);
      scratch_bytes_ = bytes;
    }
    return static_cast<T*>(scratch_);
  }

  int device_;
  stream_type compute_{};
  DeviceAllocator device_alloc_;
  PinnedAllocator pinned_alloc_;
  std::mutex scratch_mutex_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

/// The GPU policy with dtrain's tiled GEMM.
using GpuExec = BasicGpuExec<TiledGemm>;
#if defined(DTRAIN_GPU_VENDOR_BLAS)
/// The GPU policy with cuBLAS / hipBLAS GEMM (only where the unit has the vendor library).
using GpuBlasExec = BasicGpuExec<VendorGemm>;
#endif

DTRAIN_GPU_ABI_END
}  // namespace gpu

using gpu::GpuExec;
#if defined(DTRAIN_GPU_VENDOR_BLAS)
using gpu::GpuBlasExec;
#endif

static_assert(detail::check_exec_policy<gpu::GpuExec>(), "GpuExec satisfies the policy");
static_assert(has_exec_ipc_v<gpu::GpuExec>, "GpuExec shares its memory through CUDA / HIP IPC");

}  // namespace dtrain
