// Test support: EmulatedDevice, an execution policy that behaves like a GPU as far as host code
// can tell, so generic code (Sequential, optimizers, GradientSync) is checked for device
// discipline on a machine without one. Test-only: it never ships in the library.
//
// - Memory: every allocation is one shared-memory object mapped twice. Code gets the "device"
//   address, mapped PROT_NONE, so any host dereference faults (SIGSEGV) and BufferView::as
//   refuses it (the allocator reports Space::cuda). The kernels reach the same pages through a
//   second, private-to-the-emulator mapping.
// - Streams: one worker thread each, running queued operations in order. In lazy mode (the
//   default) a worker runs an operation only once somebody needs it: a host wait or query on an
//   event or stream behind it, or another stream waiting for it. So results reach host memory
//   only after the host synchronises: a missing wait reads stale data deterministically. Eager
//   mode runs everything at once, for concurrency.
// - Copies check their direction: copy_h2d needs a device destination and a host source, and so
//   on; a kernel given a host pointer is refused. Both throw DeviceError at the call.
// - Kernels are HostExec's, run on the stream's worker over the private mapping, so results are
//   bit-identical to HostExec. An exception on a worker becomes a sticky error that every later
//   wait rethrows (as a device's would).
// - IPC (EmulatedDeviceOptions::ipc): an allocation's handle names the process and the memfd
//   behind it; another process (or rank thread) opens it through /proc/<pid>/fd/<fd> and maps it
//   as device memory of its own emulated device (PROT_NONE where code sees it), so GradientSync's
//   device IPC runs between MPI processes with the host never reading the shared pages.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/exec/exec_ipc.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>

namespace dtrain::test {

/// How an EmulatedDevice runs its streams.
struct EmulatedDeviceOptions {
  /// Run queued work only when something waits for it (see the top of this file).
  bool lazy = true;
  /// Bound on a worker's wait for another stream (a lost dependency is an error, not a hang).
  double worker_timeout_s = 60;
  /// Allocations can be shared with other processes (ipc_export / ipc_open); each keeps its
  /// memfd open while it lives.
  bool ipc = false;
};

/// The emulated device as an execution policy (see the top of this file). Thread-safe like a
/// device runtime. Streams and events are owned by the device; it must outlive everything
/// allocated from it.
class EmulatedDevice {
 public:
  struct Stream;
  struct Event;
  using stream_type = Stream*;
  using event_type = Event*;
  /// Host code must treat this memory as a device's.
  static constexpr Space space = Space::cuda;

  using Options = EmulatedDeviceOptions;

  explicit EmulatedDevice(Options options) : options_(options), memory_(*this) {
    compute_ = create_stream();
  }
  EmulatedDevice() : EmulatedDevice(Options()) {}
  ~EmulatedDevice() {
    std::list<Stream*> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& s : streams_) all.push_back(s.get());
    }
    for (Stream* s : all) destroy_stream(s);
  }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;

  // ---- memory ----------------------------------------------------------------------------

  Allocator& allocator() noexcept { return memory_; }
  Allocator& host_allocator() noexcept { return default_allocator(); }

  /// Whether `p` points into (or one past) a live emulated device allocation.
  bool is_device(const void* p) const {
    std::lock_guard<std::mutex> lk(mem_mu_);
    return find(p) != nullptr;
  }

  // ---- IPC (the optional members of <dtrain/exec/exec_ipc.hpp>) ----------------------------

  /// An allocation's name for another process: its owner and the memfd behind it.
  struct IpcHandle {
    std::int64_t pid = 0, fd = -1;
    std::uint64_t bytes = 0;
  };
  using ipc_handle_type = IpcHandle;

  bool ipc_available() const noexcept { return options_.ipc; }
  /// `base`: a pointer the allocator returned (ipc on).
  IpcHandle ipc_export(void* base) {
    std::lock_guard<std::mutex> lk(mem_mu_);
    auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == blocks_.end() || it->second.fd < 0)
      raise<DeviceError>("emulated ipc_export",
                         options_.ipc ? "not the start of an allocation of this device"
                                      : "the device was made without EmulatedDeviceOptions::ipc");
    return IpcHandle{static_cast<std::int64_t>(::getpid()), it->second.fd, it->second.bytes};
  }
  /// Maps another process's allocation as device memory of this device.
  void* ipc_open(const IpcHandle& h) {
    const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
      raise<DeviceError>("emulated ipc_open", "open " + path + ": " + std::strerror(errno));
    const std::size_t len = page_round(h.bytes);
    void* dev = ::mmap(nullptr, len, PROT_NONE, MAP_SHARED, fd, 0);
    void* back = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (dev == MAP_FAILED || back == MAP_FAILED) {
      if (dev != MAP_FAILED) ::munmap(dev, len);
      if (back != MAP_FAILED) ::munmap(back, len);
      raise<DeviceError>("emulated ipc_open", "mmap of " + path);
    }
    std::lock_guard<std::mutex> lk(mem_mu_);
    blocks_[reinterpret_cast<std::uintptr_t>(dev)] = Block{back, h.bytes, len, -1};
    ++ipc_opened_;
    ++ipc_mapped_;
    return dev;
  }
  /// Unmaps what ipc_open returned, once the streams are done with it.
  void ipc_close(void* p) noexcept {
    if (!p) return;
    drain_all();
    std::lock_guard<std::mutex> lk(mem_mu_);
    auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == blocks_.end()) return;
    ::munmap(p, it->second.mapped);
    ::munmap(it->second.backing, it->second.mapped);
    blocks_.erase(it);
    --ipc_mapped_;
  }
  /// Other processes' allocations opened so far, and mapped now.
  std::uint64_t ipc_opened() const {
    std::lock_guard<std::mutex> lk(mem_mu_);
    return ipc_opened_;
  }
  std::uint64_t ipc_mapped() const {
    std::lock_guard<std::mutex> lk(mem_mu_);
    return ipc_mapped_;
  }

  // ---- streams and events ----------------------------------------------------------------

  stream_type compute_stream() const noexcept { return compute_; }
  stream_type create_stream() {
    auto s = std::make_unique<Stream>();
    Stream* raw = s.get();
    {
      std::lock_guard<std::mutex> lk(mu_);
      streams_.push_back(std::move(s));
    }
    raw->worker = std::thread([this, raw] { work(*raw); });
    return raw;
  }
  void destroy_stream(stream_type s) noexcept {
    {
      std::unique_lock<std::mutex> lk(mu_);
      s->demanded = s->enqueued;
      s->stop = true;
      cv_.notify_all();
    }
    if (s->worker.joinable()) s->worker.join();
    std::lock_guard<std::mutex> lk(mu_);
    streams_.remove_if([s](const std::unique_ptr<Stream>& p) { return p.get() == s; });
  }
  event_type create_event() {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::make_unique<Event>());
    return events_.back().get();
  }
  void destroy_event(event_type e) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    events_.remove_if([e](const std::unique_ptr<Event>& p) { return p.get() == e; });
  }
  void record(event_type e, stream_type s) {
    std::lock_guard<std::mutex> lk(mu_);
    e->stream = s;
    e->seq = s->enqueued;
  }
  void stream_wait(stream_type s, event_type e) {
    Stream* target;
    std::uint64_t seq;
    {
      std::lock_guard<std::mutex> lk(mu_);
      target = e->stream;
      seq = e->seq;
    }
    if (!target) return;
    enqueue(s, "stream_wait", [this, target, seq] {
      std::unique_lock<std::mutex> lk(mu_);
      demand(*target, seq);
      const auto bound = std::chrono::duration<double>(options_.worker_timeout_s);
      if (!cv_.wait_for(lk, bound, [&] { return target->completed >= seq; }))
        raise<DeviceError>("emulated stream_wait", "the awaited stream never got there");
    });
  }
  bool query(event_type e) {
    std::lock_guard<std::mutex> lk(mu_);
    rethrow_sticky();
    if (!e->stream) return true;
    demand(*e->stream, e->seq);
    return e->stream->completed >= e->seq;
  }
  bool wait_until(event_type e, const Deadline& d) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!e->stream) return true;
    return wait_for_locked(lk, *e->stream, e->seq, d);
  }
  bool synchronize(stream_type s, const Deadline& d) {
    std::unique_lock<std::mutex> lk(mu_);
    ++synchronizations_;
    return wait_for_locked(lk, *s, s->enqueued, d);
  }

  // ---- copies ----------------------------------------------------------------------------

  void copy_h2d(stream_type s, void* dst, const void* src, std::size_t bytes) {
    check_copy("copy_h2d", dst, true, src, false, bytes);
    void* d = translate(dst, "copy_h2d");
    enqueue(s, "copy_h2d", [d, src, bytes] { std::memcpy(d, src, bytes); });
  }
  void copy_d2h(stream_type s, void* dst, const void* src, std::size_t bytes) {
    check_copy("copy_d2h", dst, false, src, true, bytes);
    const void* p = translate(src, "copy_d2h");
    enqueue(s, "copy_d2h", [dst, p, bytes] { std::memcpy(dst, p, bytes); });
  }
  void copy_d2d(stream_type s, void* dst, const void* src, std::size_t bytes) {
    check_copy("copy_d2d", dst, true, src, true, bytes);
    void* d = translate(dst, "copy_d2d");
    const void* p = translate(src, "copy_d2d");
    enqueue(s, "copy_d2d", [d, p, bytes] { std::memmove(d, p, bytes); });
  }
  template <class T>
  void fill(stream_type s, T* x, std::size_t n, T value) {
    launch(
        s, "fill", [](const HostExec& h, auto... a) { h.fill(HostStream{}, a...); }, x, n, value);
  }

  // ---- kernels: HostExec's, on the stream's worker ---------------------------------------

#define DTRAIN_EMULATED_KERNEL(name)                                                          \
  template <class... A>                                                                       \
  void name(stream_type s, A... args) {                                                       \
    launch(                                                                                   \
        s, #name, [](const HostExec& h, auto... a) { h.name(HostStream{}, a...); }, args...); \
  }
  DTRAIN_EMULATED_KERNEL(gemm)
  DTRAIN_EMULATED_KERNEL(bias_add)
  DTRAIN_EMULATED_KERNEL(bias_grad)
  DTRAIN_EMULATED_KERNEL(activation_forward)
  DTRAIN_EMULATED_KERNEL(activation_backward)
  DTRAIN_EMULATED_KERNEL(dropout_forward)
  DTRAIN_EMULATED_KERNEL(dropout_backward)
  DTRAIN_EMULATED_KERNEL(layernorm_forward)
  DTRAIN_EMULATED_KERNEL(layernorm_backward)
  DTRAIN_EMULATED_KERNEL(softmax_cross_entropy)
  DTRAIN_EMULATED_KERNEL(mse)
  DTRAIN_EMULATED_KERNEL(sgd_update)
  DTRAIN_EMULATED_KERNEL(adamw_update)
  DTRAIN_EMULATED_KERNEL(sum_squares)
  DTRAIN_EMULATED_KERNEL(scale)
  DTRAIN_EMULATED_KERNEL(reduce_into)
  DTRAIN_EMULATED_KERNEL(scale_avg)
  DTRAIN_EMULATED_KERNEL(convert)
#undef DTRAIN_EMULATED_KERNEL

  /// A layer's host kernel f(args...) on the stream's worker, pointer arguments translated to
  /// the emulator's mapping (see <dtrain/exec/launch.hpp>).
  template <class F, class... A>
  void host_kernel(stream_type s, const char* name, F f, A... args) {
    launch(
        s, name, [f](const HostExec&, auto... a) { f(a...); }, args...);
  }

  /// A layer's element-wise functor F{args...}(i), i in [0, n), on the stream's worker: the code
  /// a GPU runs, on translated pointers. Used where host_kernel is not (EmulatedGpu).
  template <class F, class... A>
  void for_each_index(stream_type s, const char* name, std::int64_t n, A... args) {
    launch(
        s, name,
        [n](const HostExec&, auto... a) {
          const F f{a...};
          for (std::int64_t i = 0; i < n; ++i) f(i);
        },
        args...);
  }

  // ---- test hooks ------------------------------------------------------------------------

  /// Operations run so far on all streams.
  std::uint64_t operations_run() const {
    std::lock_guard<std::mutex> lk(mu_);
    return ran_;
  }
  /// Kernels queued so far on all streams (kernels, fills, host_kernel and for_each_index calls;
  /// copies and event waits are not kernels): what a GPU would count as launches.
  std::uint64_t kernels_launched() const {
    std::lock_guard<std::mutex> lk(mu_);
    return launched_;
  }
  /// Host waits for a whole stream (synchronize) so far: what event-ordered code avoids.
  std::uint64_t stream_synchronizations() const {
    std::lock_guard<std::mutex> lk(mu_);
    return synchronizations_;
  }
  /// Operations queued but not run yet on stream s.
  std::uint64_t pending(stream_type s) const {
    std::lock_guard<std::mutex> lk(mu_);
    return s->enqueued - s->completed;
  }

  struct Stream {
    std::deque<std::pair<std::uint64_t, std::function<void()>>> queue;
    std::uint64_t enqueued = 0, completed = 0, demanded = 0;
    bool stop = false;
    std::thread worker;
  };
  struct Event {
    Stream* stream = nullptr;
    std::uint64_t seq = 0;
  };

 private:
  // Device memory: one memfd per block, mapped PROT_NONE where code sees it and read-write for
  // the emulator. Freeing waits for every stream (as cudaFree does).
  class Memory final : public Allocator {
   public:
    explicit Memory(EmulatedDevice& dev) : dev_(dev) {}
    void* allocate(std::size_t bytes, std::size_t) override {
      if (bytes == 0) return nullptr;
      const std::size_t len = page_round(bytes);
      const int fd = ::memfd_create("dtrain-emulated-device", MFD_CLOEXEC);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(len)) != 0) {
        if (fd >= 0) ::close(fd);
        raise<DeviceError>("emulated allocate", "memfd for " + std::to_string(bytes) + " B");
      }
      void* dev = ::mmap(nullptr, len, PROT_NONE, MAP_SHARED, fd, 0);
      void* back = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      // Kept open for ipc_export where the device shares its memory.
      const bool keep = dev_.options_.ipc && dev != MAP_FAILED && back != MAP_FAILED;
      if (!keep) ::close(fd);
      if (dev == MAP_FAILED || back == MAP_FAILED)
        raise<DeviceError>("emulated allocate", "mmap of " + std::to_string(len) + " B");
      // Device memory is not zeroed: fill it with NaN bit patterns so nothing relies on zeros.
      std::memset(back, 0xff, len);
      std::lock_guard<std::mutex> lk(dev_.mem_mu_);
      dev_.blocks_[reinterpret_cast<std::uintptr_t>(dev)] = Block{back, bytes, len, keep ? fd : -1};
      return dev;
    }
    void deallocate(void* p, std::size_t) noexcept override {
      if (!p) return;
      dev_.drain_all();
      std::lock_guard<std::mutex> lk(dev_.mem_mu_);
      auto it = dev_.blocks_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == dev_.blocks_.end()) return;
      ::munmap(p, it->second.mapped);
      ::munmap(it->second.backing, it->second.mapped);
      if (it->second.fd >= 0) ::close(it->second.fd);
      dev_.blocks_.erase(it);
    }
    Space space() const noexcept override { return EmulatedDevice::space; }

   private:
    EmulatedDevice& dev_;
  };
  struct Block {
    void* backing;
    std::size_t bytes, mapped;
    int fd;  // the memfd, kept for ipc_export (-1: closed, or another process's block)
  };
  friend class Memory;

  static std::size_t page_round(std::size_t bytes) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }

  const Block* find(const void* p) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return nullptr;
    --it;
    return a <= it->first + it->second.bytes ? &it->second : nullptr;
  }
  // The emulator's address of device pointer p; a null stays null, a host pointer is refused.
  template <class P>
  P* translate(P* p, const char* op) const {
    if (!p) return p;
    std::lock_guard<std::mutex> lk(mem_mu_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    if (it != blocks_.begin()) {
      --it;
      if (a <= it->first + it->second.bytes)
        return reinterpret_cast<P*>(reinterpret_cast<std::uintptr_t>(it->second.backing) +
                                    (a - it->first));
    }
    raise<DeviceError>(std::string("emulated ") + op,
                       "a device kernel was given host memory (not from the device allocator)");
  }
  template <class A>
  A arg(A a, const char* op) const {
    if constexpr (std::is_pointer_v<A>)
      return translate(a, op);
    else if constexpr (std::is_same_v<A, BufferView>) {
      DTRAIN_REQUIRE(a.space == space, op,
                     "device kernel given a " << name_of(a.space) << " buffer view");
      a.data = translate(a.data, op);
      a.space = Space::host;  // the emulator's own mapping
      return a;
    } else {
      return a;
    }
  }
  void check_copy(const char* op, const void* dst, bool dst_dev, const void* src, bool src_dev,
                  std::size_t bytes) const {
    if (bytes == 0) return;
    const bool d = is_device(dst), s = is_device(src);
    if (d != dst_dev || s != src_dev)
      raise<DeviceError>(std::string("emulated ") + op,
                         std::string("wrong copy direction: destination is ") +
                             (d ? "device" : "host") + " memory, source is " +
                             (s ? "device" : "host") + " memory");
  }

  template <class F, class... A>
  void launch(stream_type s, const char* op, F f, A... args) {
    auto call = [this, f](auto... a) { return [this, f, a...] { f(host_, a...); }; };
    enqueue(s, op, call(arg(args, op)...));
    std::lock_guard<std::mutex> lk(mu_);
    ++launched_;
  }

  void enqueue(stream_type s, const char* op, std::function<void()> fn) {
    std::lock_guard<std::mutex> lk(mu_);
    rethrow_sticky();
    const std::uint64_t seq = ++s->enqueued;
    s->queue.emplace_back(seq, [fn = std::move(fn), op, this] {
      try {
        fn();
      } catch (const std::exception& e) {
        set_sticky(std::string(op) + ": " + e.what());
      } catch (...) {
        set_sticky(std::string(op) + ": unknown exception");
      }
    });
    if (!options_.lazy) s->demanded = s->enqueued;
    cv_.notify_all();
  }

  void work(Stream& s) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] {
        return (s.stop && s.queue.empty()) ||
               (!s.queue.empty() && s.demanded >= s.queue.front().first);
      });
      if (s.queue.empty()) return;
      auto op = std::move(s.queue.front());
      s.queue.pop_front();
      lk.unlock();
      op.second();
      lk.lock();
      s.completed = op.first;
      ++ran_;
      cv_.notify_all();
    }
  }

  void demand(Stream& s, std::uint64_t seq) {
    if (s.demanded < seq) {
      s.demanded = seq;
      cv_.notify_all();
    }
  }
  bool wait_for_locked(std::unique_lock<std::mutex>& lk, Stream& s, std::uint64_t seq,
                       const Deadline& d) {
    demand(s, seq);
    while (s.completed < seq) {
      const double left = d.remaining();
      if (left <= 0) return false;
      cv_.wait_for(lk, std::chrono::duration<double>(std::min(left, 1.0)));
    }
    rethrow_sticky();
    return true;
  }
  void drain_all() noexcept {
    std::unique_lock<std::mutex> lk(mu_);
    for (auto& s : streams_) demand(*s, s->enqueued);
    const Deadline d(options_.worker_timeout_s);
    cv_.wait_for(lk, std::chrono::duration<double>(d.remaining()), [&] {
      for (auto& s : streams_)
        if (s->completed < s->enqueued) return false;
      return true;
    });
  }
  void set_sticky(std::string what) {
    std::lock_guard<std::mutex> lk(mu_);
    if (sticky_.empty()) sticky_ = std::move(what);
  }
  void rethrow_sticky() const {
    if (!sticky_.empty()) raise<DeviceError>("emulated device", "earlier failure: " + sticky_);
  }

  Options options_;
  HostExec host_;
  mutable std::mutex mu_;  // streams, events, the sticky error
  std::condition_variable cv_;
  std::list<std::unique_ptr<Stream>> streams_;
  std::list<std::unique_ptr<Event>> events_;
  std::uint64_t ran_ = 0, launched_ = 0, synchronizations_ = 0;
  std::string sticky_;
  mutable std::mutex mem_mu_;  // blocks_
  std::map<std::uintptr_t, Block> blocks_;
  std::uint64_t ipc_opened_ = 0, ipc_mapped_ = 0;
  Memory memory_;
  Stream* compute_ = nullptr;
};

static_assert(dtrain::detail::check_exec_policy<EmulatedDevice>(),
              "the emulated device is an execution policy");
static_assert(dtrain::has_exec_ipc_v<EmulatedDevice>, "the emulated device can play device IPC");

/// Host copy of the bytes of `v`, exec memory of `dev`, through the device's copies (waits for
/// the compute stream first, so it sees every queued kernel).
inline std::vector<unsigned char> bytes_of(EmulatedDevice& dev, BufferView v) {
  std::vector<unsigned char> out(v.bytes());
  dev.copy_d2h(dev.compute_stream(), out.data(), v.data, v.bytes());
  exec_synchronize(dev, dev.compute_stream(), 30, "test download");
  return out;
}
/// The bytes of a host view (InvalidArgument for device memory).
inline std::vector<unsigned char> bytes_of(BufferView v) {
  DTRAIN_REQUIRE(v.space == Space::host, "test bytes_of", "a host view is needed");
  const auto* p = static_cast<const unsigned char*>(v.data);
  return std::vector<unsigned char>(p, p + v.bytes());
}

/// The emulated device without host kernels: layers take the path they take on a GPU (their
/// element-wise functors through for_each_index) instead of their host functions, so the device
/// code of a layer is checked on the CPU.
class EmulatedGpu : public EmulatedDevice {
 public:
  using EmulatedDevice::EmulatedDevice;
  template <class F, class... A>
  void host_kernel(stream_type, const char*, F, A...) = delete;
};

}  // namespace dtrain::test
