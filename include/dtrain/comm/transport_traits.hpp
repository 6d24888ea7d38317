// dtrain: what a transport must provide, checked at compile time.
//
// A transport moves bytes between the ranks of one fixed group. The collective algorithms
// (<dtrain/comm/communicator.hpp>) are written once against this vocabulary.
//
// Required (two-sided messages):
//   using Request = ...;                       default-constructible handle of one operation;
//                                              it must not move while the operation is active
//   int rank() const;  int size() const;
//   void isend(Request&, int peer, int tag, const void* data, std::size_t bytes);
//   void irecv(Request&, int peer, int tag, void* data, std::size_t bytes);
//   bool test(Request&);                       non-blocking; true once complete
//   bool wait_until(Request&, const Deadline&) blocking; false when the deadline passed first
//   void cancel(Request&) noexcept;            abandons an active operation (error paths)
//   MemoryRegion register_memory(void*, std::size_t, Space);   plan-time registration
//   void deregister_memory(MemoryRegion&) noexcept;
//
// Optional, detected (a transport without them gets the fallback named):
//   Persistent, plan-scoped channels (fallback: isend/irecv with tag channel_tag(id)):
//     using Channel = ...;                     default-constructible, movable while unbound
//     Channel bind_send(int peer, int channel_id, const MemoryRegion& region,
//                       std::size_t offset, std::size_t bytes);
//     Channel bind_recv(int peer, int channel_id, const MemoryRegion& region,
//                       std::size_t offset, std::size_t bytes);
//     void start(Request&, Channel&);          posts the bound operation once; complete it with
//                                              test / wait_until, abandon it with cancel
//     void unbind(Channel&) noexcept;          at plan destruction (the channel is not active)
//     bool supports_channels() const;          optional run-time answer (default: true)
//   A plan binds every message it will ever send or receive at construction (local: no
//   communication), then starts the same channels, in the same order, on every execution. The
//   channel id is the same on both ends of a message and stable across executions (it comes from
//   the algorithm's schedule, never from a sequence number); ids are non-negative ints, unique
//   per (sender, receiver) within one plan, and ids below 32 are the fingerprint exchange's (the
//   same in every plan). `region` is what register_memory returned for the buffer holding the
//   message, `offset` the message's position in it. A send is only started once the receiver's
//   matching channel may have been started too (the algorithms never depend on it being
//   started first). Channels of different plans with the same (peer, id) are never active at
//   the same time.
//   SharedSegments* shared_segments() noexcept;   node-shared memory for the shm algorithm
//   bool allows_progress_thread() const;          whether a progress thread may drive it
//   capabilities: static constexpr bool members supports_device_memory, requires_registration,
//     one_sided, thread_safe (or a transport_capabilities specialisation; a run-time
//     `TransportCapabilities capabilities() const` wins, as AnyTransport has), see below.
//
// Messages between one (sender, receiver, tag) triple match in the order they were posted, and a
// receive names the exact byte count the matching send carries. Ranks never post a send to
// themselves. Sends may complete before the receiver posts (buffered) or only once matched
// (rendezvous): the algorithms never depend on either.
//
// One-sided, pre-registered transports (RDMA) implement the channels: at bind time they know the
// peer, the registered region and the exact bytes of every message the plan will ever move, so
// they can exchange remote addresses and keys once (on a channel's first start) and afterwards
// turn each start of a send channel into one remote write with notification into the peer's
// already known receive buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include <dtrain/comm/shared_heap.hpp>
#include <dtrain/core/env.hpp>
#include <dtrain/core/space.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain {

/// A registered memory range, as returned by a transport's register_memory. `key` is whatever the
/// transport needs to reach the memory remotely (0 for transports that need nothing).
struct MemoryRegion {
  void* data = nullptr;
  std::size_t bytes = 0;
  Space space = Space::host;
  std::uint64_t key = 0;
  void* handle = nullptr;  ///< transport-private (e.g. an ibv_mr*)
};

/// Optional transport capability: segments of memory that every rank of the group maps directly
/// (all ranks on one node), with per-slot counters for synchronisation. A transport offers it
/// through `SharedSegments* shared_segments() noexcept` (null when the ranks do not share a
/// node); the `shm` all-reduce then exchanges data by loads and stores instead of messages.
/// Rank q's segment holds `slots` slots of `slot_bytes` bytes; its counters are monotonically
/// increasing chunk numbers (3 per slot: input copied in, part reduced, slot read out), each on
/// its own cache line; the line's second word counts the ranks blocked in the kernel on that
/// counter (comm/detail/futex_wait.hpp), so raise and wait through counter_publish and
/// counter_wait. The view is local to one rank; the memory is shared.
struct SharedSegments {
  int rank = 0;
  int size = 1;
  int slots = 0;
  std::size_t slot_bytes = 0;
  std::vector<unsigned char*> data;                ///< data[q]: rank q's slots
  std::vector<std::atomic<std::uint64_t>*> flags;  ///< flags[q]: rank q's counters
  std::uint64_t next_chunk = 0;                    ///< chunks this rank has processed so far
  /// Each rank's heap (SharedSegmentConfig::heap_bytes; 0 = none): memory that rank allocates
  /// from (Communicator::shared_allocator) and every rank of the node reads directly. heap[q]:
  /// rank q's heap as mapped here (empty without heaps).
  std::size_t heap_bytes = 0;
  std::vector<unsigned char*> heap;
  std::unique_ptr<SharedHeapAllocator> heap_allocator;  ///< over heap[rank]; null without heaps
  /// Chunks of shm, hier and hier_leader of which the other ranks read some of this rank's
  /// buffers in its heap in place (this rank's count, for tests and benchmarks).
  std::uint64_t direct_chunks = 0;
  /// Calls of shm / ordered_shm that ran whole from every rank's heap (no slot copies; algo/
  /// shm.hpp), this rank's count, for tests and benchmarks. Each is also one direct chunk.
  std::uint64_t whole_calls = 0;
  /// Calls of shm / ordered_shm small enough to run in one hand-off (algo/shm.hpp, small_call),
  /// this rank's count, for tests and benchmarks.
  std::uint64_t one_shot_calls = 0;
  /// Calls of reduce_scatter / allgather that ran from every rank's heap in one hand-off (algo/
  /// shm_parts.hpp), this rank's count, for tests and benchmarks.
  std::uint64_t part_calls = 0;

  /// Fingerprint checks this rank has published through check_line (collective_plan.hpp).
  std::uint64_t next_check = 0;

  static constexpr std::size_t kFlagStride = 8;  // uint64 per counter: one 64-byte line each
  static_assert(kFlagStride >= 2, "a counter's line also holds its waiters word");
  /// After the slots' counters, three lines for the plans' fingerprint check: a counter of the
  /// checks published and the fingerprints of the last two.
  static constexpr std::size_t kCheckLines = 3;
  static std::size_t flag_lines(int slots) noexcept {
    return 3 * static_cast<std::size_t>(slots) + kCheckLines;
  }
  static std::size_t flag_bytes(int slots) noexcept {
    return flag_lines(slots) * kFlagStride * sizeof(std::uint64_t);
  }
  std::atomic<std::uint64_t>& flag(int q, int kind, int slot) const noexcept {
    return flags[static_cast<std::size_t>(q)]
                [(static_cast<std::size_t>(kind) * slots + slot) * kFlagStride];
  }
  /// Rank q's count of fingerprint checks published (a counter: counter_publish, counter_wait).
  std::atomic<std::uint64_t>& check_flag(int q) const noexcept {
    return flags[static_cast<std::size_t>(q)][3 * static_cast<std::size_t>(slots) * kFlagStride];
  }
  /// The line where rank q leaves the fingerprint of its check number `c` (two alternate).
  unsigned char* check_line(int q, std::uint64_t c) const noexcept {
    auto* line = &flags[static_cast<std::size_t>(q)]
                       [(3 * static_cast<std::size_t>(slots) + 1 + c % 2) * kFlagStride];
    return reinterpret_cast<unsigned char*>(line);
  }
  unsigned char* slot(int q, int s) const noexcept {
    return data[static_cast<std::size_t>(q)] + static_cast<std::size_t>(s) * slot_bytes;
  }
  /// Sets the heaps (bases[q]: rank q's, as mapped here; `bytes` each) and this rank's allocator
  /// over its own. For transports, once, after rank and size.
  void set_heaps(std::vector<unsigned char*> bases, std::size_t bytes) {
    heap = std::move(bases);
    heap_bytes = bytes;
    heap_allocator = heap.empty() || bytes == 0 ? nullptr
                                                : std::make_unique<SharedHeapAllocator>(
                                                      heap[static_cast<std::size_t>(rank)], bytes);
  }
  /// Whether [p, p + bytes) lies in this rank's heap (false without heaps).
  bool in_own_heap(const void* p, std::size_t bytes) const noexcept {
    if (heap.empty() || heap_bytes == 0) return false;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto h = reinterpret_cast<std::uintptr_t>(heap[static_cast<std::size_t>(rank)]);
    return a >= h && bytes <= heap_bytes && a - h <= heap_bytes - bytes;
  }
  /// Offset of `p` in this rank's heap (p must lie in it).
  std::size_t own_heap_offset(const void* p) const noexcept {
    return static_cast<std::size_t>(reinterpret_cast<const unsigned char*>(p) -
                                    heap[static_cast<std::size_t>(rank)]);
  }
  /// Byte `offset` of rank q's heap, as mapped here.
  const unsigned char* heap_at(int q, std::size_t offset) const noexcept {
    return heap[static_cast<std::size_t>(q)] + offset;
  }
  /// The same, for the one algorithm that stores into another rank's buffer (shm's whole-call
  /// path, which has rank q's leave to write there).
  unsigned char* heap_to_write(int q, std::size_t offset) const noexcept {
    return heap[static_cast<std::size_t>(q)] + offset;
  }
  /// Lays out one rank's segment: `flag_mem` (flag_bytes(slots), 64-byte aligned) gets zeroed
  /// counters constructed in place.
  static void init_flags(void* flag_mem, int slots) noexcept {
    auto* f = static_cast<std::atomic<std::uint64_t>*>(flag_mem);
    for (std::size_t i = 0; i < flag_lines(slots) * kFlagStride; ++i)
      new (&f[i]) std::atomic<std::uint64_t>(0);
  }
};
/// How DTRAIN_RANKS_PER_NODE cuts the system's nodes into fake nodes, so that one machine can
/// stand in for several: every node into consecutive blocks of `every` ranks ("2"), or the
/// group in rank order into consecutive nodes of the listed sizes ("3,1": ranks 0-2 and rank 3;
/// the sizes must add up to the group's size, which every rank checks when its transport maps
/// the nodes; a listed node that would span two system nodes is split there). Neither set = as
/// the system groups them. Plain value type.
struct RanksPerNode {
  int every = 0;           ///< block size; 0 = not set
  std::vector<int> sizes;  ///< list form: node sizes in rank order
  RanksPerNode() = default;
  RanksPerNode(int n) : every(n) {}  // NOLINT(google-explicit-constructor): `= 2` reads well
  bool is_set() const noexcept { return every > 0 || !sizes.empty(); }
  /// Parses the value `v` of variable `name` strictly: an integer in [1, 65536], or a
  /// comma-separated list of such integers with at least two entries.
  static RanksPerNode parse(const char* name, const std::string& v) {
    RanksPerNode r;
    if (v.find(',') == std::string::npos) {
      r.every = static_cast<int>(env::parse_int(name, v, 1, 65536));
      return r;
    }
    std::size_t at = 0;
    while (true) {
      const std::size_t comma = v.find(',', at);
      const std::string item =
          v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (item.empty())
        env::detail::bad_value(name, v,
                               "an integer in [1, 65536] or a comma-separated list of node sizes "
                               "in rank order (e.g. 3,1)");
      r.sizes.push_back(static_cast<int>(env::parse_int(name, item, 1, 65536)));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    return r;
  }
};

/// Shared-segment sizing: whether the capability is on (DTRAIN_SHM, boolean), the pipelining
/// chunk (DTRAIN_SHM_SLOT_BYTES, 256 B .. 1 GiB, rounded down to 64 B; default 256 KiB) and how
/// many chunks may be in flight (DTRAIN_SHM_SLOTS, 2..64, default 16). Transports take one in
/// their constructor; their single-argument constructors read it with from_env.
///
/// Why 16 slots (4 MiB a rank) and not 4 (1 MiB, one core's L2 on the machine measured): a slot
/// is written again once every rank has read it, and with 1 MiB of slots its lines are probably
/// still in the reader's cache then. Where the two cores share no L3 (other dies of a multi-die
/// CPU, other sockets), each rewrite then waits for lines held on the other die, and the shm
/// all-reduce of 2 ranks ran 2.5-3x slower than where they share one (1-16 MiB), 1.1-1.8x behind
/// ring. With 16 slots it ran 1.4-2.1x faster than with 4 across dies at 256 KiB-16 MiB, and
/// 2-17% slower than with 4 where the cores share an L3 (benchmarks/RESULTS.md).
struct SharedSegmentConfig {
  bool enabled = true;
  std::size_t slot_bytes = 256 * 1024;
  int slots = 16;
  /// Fake nodes for the hierarchical algorithms (DTRAIN_RANKS_PER_NODE: a block size, 1..65536,
  /// or a list of node sizes such as 3,1; unset = as the system groups them), see RanksPerNode
  /// and NodeMap::subdivided (<dtrain/comm/topology.hpp>).
  RanksPerNode ranks_per_node;
  /// How long an orderly release of the segments waits for every rank before it keeps them
  /// instead (freeing them is collective: a stopped rank would make it wait forever). Seconds.
  double close_timeout_s = 300;
  /// How long the transport's construction, a chain of MPI collectives over its communicator,
  /// may take before the job is ended (<= 0: forever): a rank that failed or stopped before it
  /// would leave the others inside collectives that cannot be cancelled. Seconds; from_env takes
  /// the communicator's deadline, DTRAIN_COMM_TIMEOUT_S, when it is set.
  double setup_timeout_s = 300;
  /// Bytes of each rank's heap, memory the other ranks of the node read in place
  /// (DTRAIN_SHM_HEAP_MIB, 0..1048576 MiB; default 0 = none): a model whose arenas come from
  /// Communicator::shared_allocator() then has its gradients averaged by the shm all-reduce
  /// (hier and hier_leader inside each node) without the copies through the slots (about half
  /// the memory traffic). The pages are
  /// touched only as blocks are handed out; where /dev/shm is small (containers), size it within.
  std::size_t heap_bytes = 0;
  /// The defaults overridden by the variables above, parsed strictly (<dtrain/core/env.hpp>).
  static SharedSegmentConfig from_env() {
    SharedSegmentConfig c;
    c.enabled = env::get_bool("DTRAIN_SHM", c.enabled);
    if (const auto v = env::get("DTRAIN_RANKS_PER_NODE"))
      c.ranks_per_node = RanksPerNode::parse("DTRAIN_RANKS_PER_NODE", *v);
    c.slot_bytes =
        static_cast<std::size_t>(env::get_int(
            "DTRAIN_SHM_SLOT_BYTES", static_cast<long long>(c.slot_bytes), 256, 1ll << 30)) /
        64 * 64;
    c.slots = static_cast<int>(env::get_int("DTRAIN_SHM_SLOTS", c.slots, 2, 64));
    c.setup_timeout_s = env::get_double("DTRAIN_COMM_TIMEOUT_S", c.setup_timeout_s, 1e-3, 1e9);
    c.heap_bytes = static_cast<std::size_t>(env::get_int("DTRAIN_SHM_HEAP_MIB", 0, 0, 1 << 20))
                   << 20;
    return c;
  }
  static constexpr std::size_t kPage = 4096;
  /// Offset of the heap in one rank's segment: after the slots and the counters, on a page.
  std::size_t heap_offset() const noexcept {
    const std::size_t end =
        static_cast<std::size_t>(slots) * slot_bytes + SharedSegments::flag_bytes(slots);
    return (end + kPage - 1) / kPage * kPage;
  }
  /// Bytes of one rank's segment: the slots, then the counters, then (with a heap, from a page
  /// boundary and rounded up to whole pages) the heap.
  std::size_t segment_bytes() const noexcept {
    if (heap_bytes == 0)
      return static_cast<std::size_t>(slots) * slot_bytes + SharedSegments::flag_bytes(slots);
    return heap_offset() + (heap_bytes + kPage - 1) / kPage * kPage;
  }
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "shared-memory counters must be lock-free to work across processes");

namespace detail {
// A transport's own `static constexpr bool NAME` member, or `fallback` without one.
#define DTRAIN_TRANSPORT_FLAG(NAME)                                                                \
  template <class T, bool Fallback, class = void>                                                  \
  struct flag_##NAME : std::bool_constant<Fallback> {};                                            \
  template <class T, bool Fallback>                                                                \
  struct flag_##NAME<T, Fallback, std::enable_if_t<std::is_same_v<decltype(T::NAME), const bool>>> \
      : std::bool_constant<T::NAME> {};
DTRAIN_TRANSPORT_FLAG(supports_device_memory)
DTRAIN_TRANSPORT_FLAG(requires_registration)
DTRAIN_TRANSPORT_FLAG(one_sided)
DTRAIN_TRANSPORT_FLAG(thread_safe)
#undef DTRAIN_TRANSPORT_FLAG
}  // namespace detail

/// Capabilities of a transport, known at compile time. The primary template reads the
/// transport's own `static constexpr bool` members of these names (absent: the default shown);
/// a specialisation may state them instead. The communicator consults them through
/// capabilities_of (below), which also sees a run-time answer where the transport gives one.
template <class T, class = void>
struct transport_capabilities {
  /// isend/irecv/bind accept device pointers (GPU-aware MPI, GPUDirect RDMA). Without it the
  /// communicator refuses device buffers.
  static constexpr bool supports_device_memory =
      detail::flag_supports_device_memory<T, false>::value;
  /// Every buffer passed to isend/irecv/bind must lie inside a region from register_memory: the
  /// plan then registers every buffer it sends from or receives into (the caller's and its
  /// scratch) and uses the returned regions. Without it (and without one_sided) the plan calls
  /// no register_memory.
  static constexpr bool requires_registration = detail::flag_requires_registration<T, false>::value;
  /// The transport is one-sided underneath and benefits from plans that replay one pattern:
  /// plans register their buffers with it as with requires_registration.
  static constexpr bool one_sided = detail::flag_one_sided<T, false>::value;
  /// A second thread may drive this transport while the owner thread waits on a queue (needed
  /// for the communicator's progress thread). Transports decide at run time via
  /// `bool allows_progress_thread() const` when they have it.
  static constexpr bool thread_safe = detail::flag_thread_safe<T, true>::value;
};

/// The same capabilities as run-time values (AnyTransport reports its wrapped transport's).
struct TransportCapabilities {
  bool supports_device_memory = false;
  bool requires_registration = false;
  bool one_sided = false;
  bool thread_safe = true;
};

/// The tag a two-sided transport gives channel `id` when it has no larger tag space: ids below
/// 32767 map to themselves, larger ones wrap above the fingerprint ids (32767 itself is the
/// cost-model calibration's tag). Messages with equal tags between one pair still match in the
/// order both ends post them.
inline int channel_tag(int id) noexcept {
  constexpr int kFirst = 32, kLimit = 32767;
  return id < kLimit ? id : kFirst + (id - kFirst) % (kLimit - kFirst);
}

namespace detail {

template <class T, class = void>
struct has_request_type : std::false_type {};
template <class T>
struct has_request_type<T, std::void_t<typename T::Request>> : std::true_type {};

template <class T, class = void>
struct has_rank_size : std::false_type {};
template <class T>
struct has_rank_size<T, std::void_t<decltype(int{std::declval<const T&>().rank()}),
                                    decltype(int{std::declval<const T&>().size()})>>
    : std::true_type {};

template <class T, class = void>
struct has_isend : std::false_type {};
template <class T>
struct has_isend<T, std::void_t<decltype(std::declval<T&>().isend(
                        std::declval<typename T::Request&>(), 0, 0,
                        static_cast<const void*>(nullptr), std::size_t{}))>> : std::true_type {};

template <class T, class = void>
struct has_irecv : std::false_type {};
template <class T>
struct has_irecv<
    T, std::void_t<decltype(std::declval<T&>().irecv(std::declval<typename T::Request&>(), 0, 0,
                                                     static_cast<void*>(nullptr), std::size_t{}))>>
    : std::true_type {};

template <class T, class = void>
struct has_test : std::false_type {};
template <class T>
struct has_test<T,
                std::enable_if_t<std::is_same_v<bool, decltype(std::declval<T&>().test(
                                                          std::declval<typename T::Request&>()))>>>
    : std::true_type {};

template <class T, class = void>
struct has_wait_until : std::false_type {};
template <class T>
struct has_wait_until<
    T, std::enable_if_t<std::is_same_v<bool, decltype(std::declval<T&>().wait_until(
                                                 std::declval<typename T::Request&>(),
                                                 std::declval<const Deadline&>()))>>>
    : std::true_type {};

template <class T, class = void>
struct has_cancel : std::false_type {};
template <class T>
struct has_cancel<
    T, std::void_t<decltype(std::declval<T&>().cancel(std::declval<typename T::Request&>()))>>
    : std::true_type {};

template <class T, class = void>
struct has_registration : std::false_type {};
template <class T>
struct has_registration<
    T,
    std::enable_if_t<
        std::is_same_v<MemoryRegion, decltype(std::declval<T&>().register_memory(
                                         static_cast<void*>(nullptr), std::size_t{}, Space::host))>,
        std::void_t<decltype(std::declval<T&>().deregister_memory(std::declval<MemoryRegion&>()))>>>
    : std::true_type {};

template <class T, class = void>
struct has_progress_query : std::false_type {};
template <class T>
struct has_progress_query<
    T, std::void_t<decltype(bool{std::declval<const T&>().allows_progress_thread()})>>
    : std::true_type {};

template <class T, class = void>
struct has_shared_segments : std::false_type {};
template <class T>
struct has_shared_segments<T, std::enable_if_t<std::is_same_v<
                                  SharedSegments*, decltype(std::declval<T&>().shared_segments())>>>
    : std::true_type {};

template <class T, class = void>
struct has_channels : std::false_type {};
template <class T>
struct has_channels<
    T, std::void_t<typename T::Channel,
                   std::enable_if_t<std::is_same_v<typename T::Channel,
                                                   decltype(std::declval<T&>().bind_send(
                                                       0, 0, std::declval<const MemoryRegion&>(),
                                                       std::size_t{}, std::size_t{}))>>,
                   std::enable_if_t<std::is_same_v<typename T::Channel,
                                                   decltype(std::declval<T&>().bind_recv(
                                                       0, 0, std::declval<const MemoryRegion&>(),
                                                       std::size_t{}, std::size_t{}))>>,
                   decltype(std::declval<T&>().start(std::declval<typename T::Request&>(),
                                                     std::declval<typename T::Channel&>())),
                   decltype(std::declval<T&>().unbind(std::declval<typename T::Channel&>()))>>
    : std::true_type {};

template <class T, class = void>
struct has_channel_query : std::false_type {};
template <class T>
struct has_channel_query<T,
                         std::void_t<decltype(bool{std::declval<const T&>().supports_channels()})>>
    : std::true_type {};

template <class T, class = void>
struct has_runtime_capabilities : std::false_type {};
template <class T>
struct has_runtime_capabilities<
    T, std::enable_if_t<std::is_same_v<TransportCapabilities,
                                       decltype(std::declval<const T&>().capabilities())>>>
    : std::true_type {};

/// The channel handle of T, or an empty placeholder for transports without channels.
struct NoChannel {};
template <class T, bool = has_channels<T>::value>
struct channel_type_of {
  using type = NoChannel;
};
template <class T>
struct channel_type_of<T, true> {
  using type = typename T::Channel;
};

}  // namespace detail

/// The transport's node-shared segments, or null when it has none (or the ranks span nodes).
template <class T>
SharedSegments* shared_segments_of(T& t) noexcept {
  if constexpr (detail::has_shared_segments<T>::value)
    return t.shared_segments();
  else
    return nullptr;
}

/// Whether plans over `t` bind persistent channels (T has them and, where it answers at run
/// time, says yes).
template <class T>
bool channels_available(const T& t) {
  if constexpr (!detail::has_channels<T>::value)
    return false;
  else if constexpr (detail::has_channel_query<T>::value)
    return t.supports_channels();
  else
    return true;
}

/// T's capabilities: its run-time answer where it has one, else transport_capabilities<T>.
template <class T>
TransportCapabilities capabilities_of(const T& t) {
  if constexpr (detail::has_runtime_capabilities<T>::value) {
    return t.capabilities();
  } else {
    using C = transport_capabilities<T>;
    return TransportCapabilities{C::supports_device_memory, C::requires_registration, C::one_sided,
                                 C::thread_safe};
  }
}

/// True when T provides every member the collectives need (see the top of this header).
template <class T>
inline constexpr bool is_transport_v = detail::has_request_type<T>::value&&
    detail::has_rank_size<T>::value&& detail::has_isend<T>::value&& detail::has_irecv<T>::value&&
        detail::has_test<T>::value&& detail::has_wait_until<T>::value&&
            detail::has_cancel<T>::value&& detail::has_registration<T>::value;

namespace detail {
/// Fires one static_assert per missing member so the compiler names what is wrong.
template <class T>
constexpr bool check_transport() {
  static_assert(has_request_type<T>::value, "dtrain transport: missing nested type `Request`");
  static_assert(has_rank_size<T>::value,
                "dtrain transport: missing `int rank() const` / `int size() const`");
  static_assert(has_isend<T>::value,
                "dtrain transport: missing `void isend(Request&, int peer, int tag, const void*, "
                "std::size_t)`");
  static_assert(has_irecv<T>::value,
                "dtrain transport: missing `void irecv(Request&, int peer, int tag, void*, "
                "std::size_t)`");
  static_assert(has_test<T>::value, "dtrain transport: missing `bool test(Request&)`");
  static_assert(has_wait_until<T>::value,
                "dtrain transport: missing `bool wait_until(Request&, const Deadline&)`");
  static_assert(has_cancel<T>::value, "dtrain transport: missing `void cancel(Request&) noexcept`");
  static_assert(has_registration<T>::value,
                "dtrain transport: missing `MemoryRegion register_memory(void*, std::size_t, "
                "Space)` / `void deregister_memory(MemoryRegion&)`");
  return true;
}

/// Whether a progress thread may drive transport `t` (a run-time answer where T offers one).
template <class T>
bool transport_allows_progress_thread(const T& t) {
  if constexpr (has_progress_query<T>::value)
    return t.allows_progress_thread();
  else
    return transport_capabilities<T>::thread_safe;
}
}  // namespace detail

}  // namespace dtrain
