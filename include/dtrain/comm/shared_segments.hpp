// SPDX-License-Identifier: BSD-3-Clause
// dtrain: node-shared memory segments, an optional transport capability.
//
// Detected members (a transport without them has no segments / needs no progress calls):
//   SharedSegments* shared_segments() noexcept;   null when the ranks do not share a node
//   void progress() noexcept;                     advances the transfers this rank owes peers
// The shm all-reduce (comm/detail/algo/shm.hpp) and the node-local steps of the hierarchical
// ones exchange data through them by loads and stores instead of messages. Their sizing is
// SharedSegmentConfig (shared_segment_config.hpp). Every wait on a segment counter calls
// progress() now and then (comm/detail/futex_wait.hpp): a transport whose sends complete only
// when the receiving rank calls into it again (MPI's weak progress) would otherwise leave a peer
// waiting for the end of its previous collective while this rank waits for the peer on a counter.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/comm/shared_heap.hpp>
#include <dtrain/core/detect.hpp>

namespace dtrain {

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

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "shared-memory counters must be lock-free to work across processes");

namespace detail {
template <class T>
using shared_segments_call = decltype(std::declval<T&>().shared_segments());
template <class T>
using has_shared_segments = is_detected_exact<SharedSegments*, shared_segments_call, T>;
template <class T>
using progress_call = decltype(std::declval<T&>().progress());
template <class T>
using has_transport_progress = is_detected<progress_call, T>;
}  // namespace detail

/// Lets `t` advance the transfers it owes its peers (its `progress()`); nothing for a transport
/// without one. Local, non-blocking, never throws.
template <class T>
void transport_progress(T& t) noexcept {
  if constexpr (detail::has_transport_progress<T>::value) {
    static_assert(noexcept(t.progress()), "a transport's progress() must be noexcept");
    t.progress();
  }
}

/// The transport's node-shared segments, or null when it has none (or the ranks span nodes).
template <class T>
SharedSegments* shared_segments_of(T& t) noexcept {
  if constexpr (detail::has_shared_segments<T>::value)
    return t.shared_segments();
  else
    return nullptr;
}

}  // namespace dtrain
