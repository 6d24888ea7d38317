// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the single vendor file. It is the only header that names CUDA or HIP; everything else
// (the *.cuh kernels, device tests, device-memory transports) uses dtrain::gpu:: and the kernel
// syntax both dialects share (__global__, __device__, __shared__, threadIdx, <<<...>>>).
//
// Dialect: hipcc (__HIPCC__) selects HIP, nvcc (__CUDACC__) selects CUDA. A plain C++ compiler
// gets the host runtime API only, chosen by DTRAIN_HAVE_CUDA or DTRAIN_HAVE_HIP (dtrain::cuda,
// dtrain::hip); kernels then are not available.
//
// Optional vendor BLAS: define DTRAIN_HAVE_CUBLAS (CUDA) or DTRAIN_HAVE_HIPBLAS (HIP) and link
// the library; that adds the blas_* declarations below and gpu::VendorGemm in
// <dtrain/kernels/gemm.cuh>. The macros only add declarations; no inline body changes with them.
//
// ABI: everything in dtrain::gpu sits in the inline namespace DTRAIN_GPU_ABI_NAME (v<major>_<minor>
// of the headers plus the dialect, e.g. dtrain::gpu::v0_1_cuda) with hidden visibility, so two
// shared libraries built against different dtrain versions or dialects never resolve each other's
// kernels or launchers. Kernel headers open it with DTRAIN_GPU_ABI_BEGIN / DTRAIN_GPU_ABI_END.
#pragma once

#if defined(__HIPCC__)
#define DTRAIN_GPU_HIP 1
#define DTRAIN_GPU_KERNELS 1
#elif defined(__CUDACC__)
#define DTRAIN_GPU_CUDA 1
#define DTRAIN_GPU_KERNELS 1
#elif defined(DTRAIN_HAVE_CUDA) && DTRAIN_HAVE_CUDA
#define DTRAIN_GPU_CUDA 1
#elif defined(DTRAIN_HAVE_HIP) && DTRAIN_HAVE_HIP
#define DTRAIN_GPU_HIP 1
#else
#error "<dtrain/kernels/gpu.hpp> needs nvcc, hipcc, or the dtrain::cuda / dtrain::hip target"
#endif

#if defined(DTRAIN_GPU_HIP)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime.h>
#if defined(DTRAIN_HAVE_HIPBLAS) && DTRAIN_HAVE_HIPBLAS
#if __has_include(<hipblas/hipblas.h>)
#include <hipblas/hipblas.h>
#else
#include <hipblas.h>
#endif
#endif
#else
#include <cuda_runtime.h>
#if defined(DTRAIN_HAVE_CUBLAS) && DTRAIN_HAVE_CUBLAS
#include <cublas_v2.h>
#endif
#endif

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>
#include <dtrain/core/space.hpp>
#include <dtrain/core/version.hpp>

#define DTRAIN_GPU_ABI_PASTE_(major, minor, dialect) v##major##_##minor##_##dialect
#define DTRAIN_GPU_ABI_EXPAND_(major, minor, dialect) DTRAIN_GPU_ABI_PASTE_(major, minor, dialect)
#if defined(DTRAIN_GPU_HIP)
#define DTRAIN_GPU_ABI_NAME DTRAIN_GPU_ABI_EXPAND_(DTRAIN_VERSION_MAJOR, DTRAIN_VERSION_MINOR, hip)
#else
#define DTRAIN_GPU_ABI_NAME DTRAIN_GPU_ABI_EXPAND_(DTRAIN_VERSION_MAJOR, DTRAIN_VERSION_MINOR, cuda)
#endif
/// Opens (and DTRAIN_GPU_ABI_END closes) dtrain::gpu's versioned, hidden inline namespace; use it
/// directly inside `namespace dtrain { namespace gpu {`.
#define DTRAIN_GPU_ABI_BEGIN \
  inline namespace __attribute__((visibility("hidden"))) DTRAIN_GPU_ABI_NAME {
#define DTRAIN_GPU_ABI_END }

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

#if defined(DTRAIN_GPU_HIP)
using stream_t = hipStream_t;
using event_t = hipEvent_t;
using error_t = hipError_t;
/// The space tag of this dialect's memory.
using SpaceTag = Hip;
constexpr error_t success = hipSuccess;
constexpr const char* vendor = "HIP";
inline const char* error_string(error_t e) noexcept { return hipGetErrorString(e); }
#else
using stream_t = cudaStream_t;
using event_t = cudaEvent_t;
using error_t = cudaError_t;
using SpaceTag = Cuda;
constexpr error_t success = cudaSuccess;
constexpr const char* vendor = "CUDA";
inline const char* error_string(error_t e) noexcept { return cudaGetErrorString(e); }
#endif
constexpr Space space = SpaceTag::space;

namespace detail {
[[noreturn]] inline void throw_gpu(error_t e, const char* call, const char* file, int line) {
  raise<DeviceError>(call, std::string(vendor) + " error: " + error_string(e) + " (" + file + ":" +
                               std::to_string(line) + ")");
}
}  // namespace detail

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

/// Throws dtrain::DeviceError naming the call and the vendor's own message when a runtime call
/// does not return success.
#define DTRAIN_CHECK_GPU(call)                                                      \
  do {                                                                              \
    const ::dtrain::gpu::error_t dtrain_gpu_err_ = (call);                          \
    if (dtrain_gpu_err_ != ::dtrain::gpu::success)                                  \
      ::dtrain::gpu::detail::throw_gpu(dtrain_gpu_err_, #call, __FILE__, __LINE__); \
  } while (0)

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

/// Number of visible devices; 0 when there is no device or no driver (never throws, so callers
/// can skip cleanly on machines without a GPU).
inline int device_count() noexcept {
  int n = 0;
#if defined(DTRAIN_GPU_HIP)
  if (hipGetDeviceCount(&n) != hipSuccess) {
    (void)hipGetLastError();
    return 0;
  }
#else
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
#endif
  return n;
}

/// Name of device `d` ("NVIDIA H100 80GB HBM3", "AMD Instinct MI250X", ...).
inline std::string device_name(int d = 0) {
#if defined(DTRAIN_GPU_HIP)
  hipDeviceProp_t p;
  DTRAIN_CHECK_GPU(hipGetDeviceProperties(&p, d));
#else
  cudaDeviceProp p;
  DTRAIN_CHECK_GPU(cudaGetDeviceProperties(&p, d));
#endif
  return p.name;
}

/// Warp (wavefront) width of device `d` as the runtime reports it: 32 on NVIDIA, 64 on AMD
/// data-centre GPUs. Host side; device code uses warp_size().
inline int device_warp_size(int d = 0) {
#if defined(DTRAIN_GPU_HIP)
  hipDeviceProp_t p;
  DTRAIN_CHECK_GPU(hipGetDeviceProperties(&p, d));
#else
  cudaDeviceProp p;
  DTRAIN_CHECK_GPU(cudaGetDeviceProperties(&p, d));
#endif
  return p.warpSize;
}

inline void set_device(int d) {
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipSetDevice(d));
#else
  DTRAIN_CHECK_GPU(cudaSetDevice(d));
#endif
}

/// Device allocation; throws DeviceError. Blocking with respect to the host.
inline void* malloc(std::size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipMalloc(&p, bytes));
#else
  DTRAIN_CHECK_GPU(cudaMalloc(&p, bytes));
#endif
  return p;
}

/// Frees device memory from gpu::malloc; never throws (errors are dropped: called from
/// destructors).
inline void free(void* p) noexcept {
  if (!p) return;
#if defined(DTRAIN_GPU_HIP)
  (void)hipFree(p);
#else
  (void)cudaFree(p);
#endif
}

/// The name of a device allocation that another process can open (CUDA/HIP IPC).
#if defined(DTRAIN_GPU_HIP)
using ipc_mem_handle_t = hipIpcMemHandle_t;
#else
using ipc_mem_handle_t = cudaIpcMemHandle_t;
#endif
/// The IPC handle of the allocation `base` (from gpu::malloc) points to; throws DeviceError.
inline ipc_mem_handle_t ipc_get_mem_handle(void* base) {
  ipc_mem_handle_t h;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipIpcGetMemHandle(&h, base));
#else
  DTRAIN_CHECK_GPU(cudaIpcGetMemHandle(&h, base));
#endif
  return h;
}
/// Another process's allocation mapped into this one (peer access enabled as needed); throws
/// DeviceError with the vendor's message (no peer access between the devices, no IPC in a
/// container or MIG instance, ...). Blocking.
inline void* ipc_open_mem_handle(const ipc_mem_handle_t& h) {
  void* p = nullptr;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipIpcOpenMemHandle(&p, h, hipIpcMemLazyEnablePeerAccess));
#else
  DTRAIN_CHECK_GPU(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
#endif
  return p;
}
/// Unmaps what ipc_open_mem_handle returned; never throws.
inline void ipc_close_mem_handle(void* p) noexcept {
  if (!p) return;
#if defined(DTRAIN_GPU_HIP)
  (void)hipIpcCloseMemHandle(p);
#else
  (void)cudaIpcCloseMemHandle(p);
#endif
}

/// Whether `p` is device memory (or managed memory) of any device: false for host memory,
/// pinned or not, and for null. Local; never throws (a query the runtime refuses, as some
/// runtimes do for pageable host memory, answers false and leaves no error behind).
inline bool is_device_pointer(const void* p) noexcept {
  if (!p) return false;
#if defined(DTRAIN_GPU_HIP)
  hipMemoryType type{};
  if (hipPointerGetAttribute(&type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, const_cast<void*>(p)) !=
      hipSuccess) {
    (void)hipGetLastError();
    return false;
  }
  return type == hipMemoryTypeDevice;
#else
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
#endif
}

/// Direction of a copy.
enum class CopyKind : unsigned char { host_to_device, device_to_host, device_to_device, automatic };

namespace detail {
#if defined(DTRAIN_GPU_HIP)
inline hipMemcpyKind kind(CopyKind k) noexcept {
  switch (k) {
    case CopyKind::host_to_device: return hipMemcpyHostToDevice;
    case CopyKind::device_to_host: return hipMemcpyDeviceToHost;
    case CopyKind::device_to_device: return hipMemcpyDeviceToDevice;
    case CopyKind::automatic: return hipMemcpyDefault;
  }
  return hipMemcpyDefault;
}
#else
inline cudaMemcpyKind kind(CopyKind k) noexcept {
  switch (k) {
    case CopyKind::host_to_device: return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host: return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device: return cudaMemcpyDeviceToDevice;
    case CopyKind::automatic: return cudaMemcpyDefault;
  }
  return cudaMemcpyDefault;
}
#endif
}  // namespace detail

/// Blocking copy of `bytes` bytes.
inline void memcpy(void* dst, const void* src, std::size_t bytes,
                   CopyKind k = CopyKind::automatic) {
  if (bytes == 0) return;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipMemcpy(dst, src, bytes, detail::kind(k)));
#else
  DTRAIN_CHECK_GPU(cudaMemcpy(dst, src, bytes, detail::kind(k)));
#endif
}

/// Copy ordered on `stream`; returns before it completes. Host memory must stay alive (and be
/// pinned for true asynchrony) until the stream is synchronised.
inline void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind k, stream_t s) {
  if (bytes == 0) return;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipMemcpyAsync(dst, src, bytes, detail::kind(k), s));
#else
  DTRAIN_CHECK_GPU(cudaMemcpyAsync(dst, src, bytes, detail::kind(k), s));
#endif
}

/// Sets `bytes` bytes to `value` on `stream` (asynchronous).
inline void memset_async(void* dst, int value, std::size_t bytes, stream_t s = nullptr) {
  if (bytes == 0) return;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipMemsetAsync(dst, value, bytes, s));
#else
  DTRAIN_CHECK_GPU(cudaMemsetAsync(dst, value, bytes, s));
#endif
}

/// Waits for all work on the current device.
inline void synchronize() {
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipDeviceSynchronize());
#else
  DTRAIN_CHECK_GPU(cudaDeviceSynchronize());
#endif
}

inline void stream_synchronize(stream_t s) {
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipStreamSynchronize(s));
#else
  DTRAIN_CHECK_GPU(cudaStreamSynchronize(s));
#endif
}

inline stream_t stream_create() {
  stream_t s;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
#else
  DTRAIN_CHECK_GPU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
#endif
  return s;
}

inline void stream_destroy(stream_t s) noexcept {
#if defined(DTRAIN_GPU_HIP)
  (void)hipStreamDestroy(s);
#else
  (void)cudaStreamDestroy(s);
#endif
}

/// Throws DeviceError if the last kernel launch on this thread failed (bad configuration).
inline void check_launch(const char* what) {
#if defined(DTRAIN_GPU_HIP)
  const error_t e = hipGetLastError();
#else
  const error_t e = cudaGetLastError();
#endif
  if (e != success)
    raise<DeviceError>(what, std::string(vendor) + " launch failed: " + error_string(e));
}

/// Pinned (page-locked) host memory: copies to and from it run asynchronously at full speed.
/// Throws DeviceError. Blocking with respect to the host.
inline void* malloc_host(std::size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipHostMalloc(&p, bytes, hipHostMallocDefault));
#else
  DTRAIN_CHECK_GPU(cudaMallocHost(&p, bytes));
#endif
  return p;
}
/// Frees memory from malloc_host; never throws.
inline void free_host(void* p) noexcept {
  if (!p) return;
#if defined(DTRAIN_GPU_HIP)
  (void)hipHostFree(p);
#else
  (void)cudaFreeHost(p);
#endif
}

/// True when every piece of work queued on `s` has completed; non-blocking. Throws DeviceError
/// when the stream reports an error.
inline bool stream_query(stream_t s) {
#if defined(DTRAIN_GPU_HIP)
  const error_t e = hipStreamQuery(s);
  if (e == hipErrorNotReady) return false;
#else
  const error_t e = cudaStreamQuery(s);
  if (e == cudaErrorNotReady) return false;
#endif
  if (e != success) detail::throw_gpu(e, "stream query", __FILE__, __LINE__);
  return true;
}

/// An event without timing, for ordering and completion checks (cheaper than a timing event).
inline event_t event_create_sync() {
  event_t e;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipEventCreateWithFlags(&e, hipEventDisableTiming));
#else
  DTRAIN_CHECK_GPU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
#endif
  return e;
}

/// True once the event's last record has completed (or it was never recorded); non-blocking.
/// Throws DeviceError when the event reports an error.
inline bool event_query(event_t e) {
#if defined(DTRAIN_GPU_HIP)
  const error_t r = hipEventQuery(e);
  if (r == hipErrorNotReady) return false;
#else
  const error_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) return false;
#endif
  if (r != success) detail::throw_gpu(r, "event query", __FILE__, __LINE__);
  return true;
}

/// Later work queued on `s` waits for the last record of `e`; the host does not block.
inline void stream_wait_event(stream_t s, event_t e) {
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipStreamWaitEvent(s, e, 0));
#else
  DTRAIN_CHECK_GPU(cudaStreamWaitEvent(s, e, 0));
#endif
}

/// Timing events (for benchmarks).
inline event_t event_create() {
  event_t e;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipEventCreate(&e));
#else
  DTRAIN_CHECK_GPU(cudaEventCreate(&e));
#endif
  return e;
}
inline void event_destroy(event_t e) noexcept {
#if defined(DTRAIN_GPU_HIP)
  (void)hipEventDestroy(e);
#else
  (void)cudaEventDestroy(e);
#endif
}
inline void event_record(event_t e, stream_t s = nullptr) {
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipEventRecord(e, s));
#else
  DTRAIN_CHECK_GPU(cudaEventRecord(e, s));
#endif
}
/// Milliseconds between two recorded events; waits for `stop`.
inline float event_elapsed_ms(event_t start, event_t stop) {
  float ms = 0;
#if defined(DTRAIN_GPU_HIP)
  DTRAIN_CHECK_GPU(hipEventSynchronize(stop));
  DTRAIN_CHECK_GPU(hipEventElapsedTime(&ms, start, stop));
#else
  DTRAIN_CHECK_GPU(cudaEventSynchronize(stop));
  DTRAIN_CHECK_GPU(cudaEventElapsedTime(&ms, start, stop));
#endif
  return ms;
}

/// Device memory as a dtrain::Allocator, so arenas, tensors and transports can hold device
/// buffers. Thread-safe (the runtime is). The memory is NOT zeroed.
class DeviceAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t) override { return gpu::malloc(bytes); }
  void deallocate(void* p, std::size_t) noexcept override { gpu::free(p); }
  Space space() const noexcept override { return gpu::space; }
};

/// Pinned host memory as a dtrain::Allocator (space host: the host may read and write it).
/// Thread-safe. The memory is NOT zeroed.
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t) override { return gpu::malloc_host(bytes); }
  void deallocate(void* p, std::size_t) noexcept override { gpu::free_host(p); }
  Space space() const noexcept override { return Space::host; }
};

/// Owning device array of n elements of T (move-only). For tests, benchmarks and scratch.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n)
      : size_(n), data_(static_cast<T*>(gpu::malloc(n * sizeof(T)))) {}
  ~DeviceBuffer() { gpu::free(data_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : size_(std::exchange(o.size_, 0)), data_(std::exchange(o.data_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(size_, o.size_);
    std::swap(data_, o.data_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Blocking copies from and to host memory of size() elements.
  void upload(const T* host) {
    gpu::memcpy(data_, host, size_ * sizeof(T), CopyKind::host_to_device);
  }
  void download(T* host) const {
    gpu::memcpy(host, data_, size_ * sizeof(T), CopyKind::device_to_host);
  }

 private:
  std::size_t size_ = 0;
  T* data_ = nullptr;
};

// ---- Vendor BLAS (row-major wrappers over the column-major libraries) ----

#if defined(DTRAIN_GPU_CUDA) && defined(DTRAIN_HAVE_CUBLAS) && DTRAIN_HAVE_CUBLAS
using blas_handle_t = cublasHandle_t;
#define DTRAIN_GPU_VENDOR_BLAS 1
inline void check_blas(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    raise<DeviceError>(call, "cuBLAS status " + std::to_string(static_cast<int>(st)));
}
inline blas_handle_t blas_create(stream_t s = nullptr) {
  blas_handle_t h;
  check_blas(cublasCreate(&h), "cublasCreate");
  check_blas(cublasSetStream(h, s), "cublasSetStream");
  return h;
}
inline void blas_destroy(blas_handle_t h) noexcept { (void)cublasDestroy(h); }
inline void blas_set_stream(blas_handle_t h, stream_t s) {
  check_blas(cublasSetStream(h, s), "cublasSetStream");
}
/// Row-major C = alpha op(A) op(B) + beta C as the column-major product C^T = op(B)^T op(A)^T.
template <class T>
void blas_gemm(blas_handle_t h, bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  const auto opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  if constexpr (sizeof(T) == 4)
    check_blas(cublasSgemm(h, opb, opa, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
               "cublasSgemm");
  else
    check_blas(cublasDgemm(h, opb, opa, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
               "cublasDgemm");
}
#elif defined(DTRAIN_GPU_HIP) && defined(DTRAIN_HAVE_HIPBLAS) && DTRAIN_HAVE_HIPBLAS
using blas_handle_t = hipblasHandle_t;
#define DTRAIN_GPU_VENDOR_BLAS 1
inline void check_blas(hipblasStatus_t st, const char* call) {
  if (st != HIPBLAS_STATUS_SUCCESS)
    raise<DeviceError>(call, "hipBLAS status " + std::to_string(static_cast<int>(st)));
}
inline blas_handle_t blas_create(stream_t s = nullptr) {
  blas_handle_t h;
  check_blas(hipblasCreate(&h), "hipblasCreate");
  check_blas(hipblasSetStream(h, s), "hipblasSetStream");
  return h;
}
inline void blas_destroy(blas_handle_t h) noexcept { (void)hipblasDestroy(h); }
inline void blas_set_stream(blas_handle_t h, stream_t s) {
  check_blas(hipblasSetStream(h, s), "hipblasSetStream");
}
template <class T>
void blas_gemm(blas_handle_t h, bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  const auto opb = tb ? HIPBLAS_OP_T : HIPBLAS_OP_N, opa = ta ? HIPBLAS_OP_T : HIPBLAS_OP_N;
  if constexpr (sizeof(T) == 4)
    check_blas(hipblasSgemm(h, opb, opa, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
               "hipblasSgemm");
  else
    check_blas(hipblasDgemm(h, opb, opa, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
               "hipblasDgemm");
}
#endif

// ---- Device-side vocabulary ----
#if defined(DTRAIN_GPU_KERNELS)

/// Lanes per warp (wavefront) on the target being compiled: read from the target, never assumed.
__device__ inline int warp_size() { return warpSize; }

/// Butterfly exchange within a warp: the value held by lane (lane ^ lane_mask).
template <class T>
__device__ inline T shfl_xor(T v, int lane_mask) {
#if defined(DTRAIN_GPU_HIP)
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}

/// Sum over the lanes of a warp; every lane receives the total.
template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = warp_size() / 2; o > 0; o /= 2) v += shfl_xor(v, o);
  return v;
}
/// Maximum over the lanes of a warp; every lane receives it.
template <class T>
__device__ inline T warp_max(T v) {
  for (int o = warp_size() / 2; o > 0; o /= 2) {
    const T w = shfl_xor(v, o);
    v = w > v ? w : v;
  }
  return v;
}

/// Upper bound on the warps of a block of up to 1024 threads on any supported target; sizes the
/// shared scratch of block_sum and block_max (the actual count comes from warp_size()).
constexpr int max_warps_per_block = 64;

/// Sum over the whole block; every thread receives it. `scratch` is a __shared__ array of
/// max_warps_per_block elements; all threads of the block must call this.
template <class T>
__device__ inline T block_sum(T v, T* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size();
  const int warp = static_cast<int>(threadIdx.x) / warp_size();
  const int warps = (static_cast<int>(blockDim.x) + warp_size() - 1) / warp_size();
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < warps ? scratch[lane] : T(0);
  return warp_sum(t);
}
/// Maximum over the whole block; same contract as block_sum.
template <class T>
__device__ inline T block_max(T v, T* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size();
  const int warp = static_cast<int>(threadIdx.x) / warp_size();
  const int warps = (static_cast<int>(blockDim.x) + warp_size() - 1) / warp_size();
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < warps ? scratch[lane] : scratch[0];
  return warp_max(t);
}

/// Grid-stride loop bounds for element-wise kernels.
__device__ inline std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_threads() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

/// out[i] = op(in[i]) for i < n, four elements per thread and step with their loads issued
/// before any store; launch with blocks_for((n + 3) / 4, threads). One element of a few bytes per
/// thread left the memory idle part of the time (on an H200: 0.48-0.64 of the copy bandwidth,
/// 0.75-0.90 this way). `in` and `out` may be the same array (each element is read and written
/// by one thread).
template <class In, class Out, class Op>
__global__ void map4(const In* in, Out* out, std::size_t n, Op op) {
  const std::size_t stride = grid_threads();
  for (std::size_t i = global_thread(); i < n; i += 4 * stride) {
    In v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k * stride < n) v[k] = in[i + k * stride];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k * stride < n) out[i + k * stride] = op(v[k]);
  }
}

/// Blocks for an element-wise launch over n items with `threads` per block (capped; the kernels
/// use grid-stride loops, so any count covers n).
inline unsigned blocks_for(std::size_t n, unsigned threads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 65535 ? 65535 : b));
}

#endif  // DTRAIN_GPU_KERNELS

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain
