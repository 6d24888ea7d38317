// SPDX-License-Identifier: BSD-3-Clause
// dtrain: waits on a counter in node-shared memory that sleep in the kernel until the writer
// raises the counter.
//
// The shm-family algorithms synchronise through monotonically increasing 64-bit counters, each on
// its own 64-byte line of a segment that every rank of the node maps (MPI_Win_allocate_shared or
// the loopback world's memory). Polling such a counter with yields and sleeps either steals the
// core from whatever else wants it (a yield hands the core over for a time slice, then takes it
// back) or answers late (a sleep). On Linux the waiter instead blocks on a futex on the counter's
// low 32-bit word, and the writer wakes it. A futex wait is cheap to undo: the kernel compares the
// word with the value the waiter last saw before it sleeps, so a raise that lands in between makes
// the wait return at once (no lost wake-up).
//
// Protocol (one extra word per counter: word 1 of the counter's line counts the waiters):
//   writer:  counter.store(v, seq_cst); if (waiters.load(seq_cst) != 0) futex_wake(counter, all)
//   waiter:  spin a little; waiters += 1 (seq_cst); while counter < target: futex_wait(counter,
//            low word last seen, slice); waiters -= 1
// Both sides order their store before their load (seq_cst), so either the writer sees the waiter
// announced and wakes it, or the waiter's re-check after announcing sees the new value. The fast
// path of a raise nobody waits for stays one store and one load of a line the readers poll anyway.
// The futex is a shared (not FUTEX_PRIVATE) one: the segment is mapped by several processes. The
// kernel wait is cut into slices of at most kFutexSliceSeconds so that the deadline is checked
// even if the partner never comes. Elsewhere (no futex), the wait falls back to poll_until.
//
// A waiter also keeps its transport's progress going (WaitProgress): MPI promises only that one
// side of a matched send and receive completes on its own. Under MPI's weak progress a peer's
// send of the previous collective, whose data this rank already received, may still need this
// rank's MPI library to answer it (an acknowledgement of a rendezvous). A rank that then waits on
// a counter for that same peer, without calling MPI, waits for a peer that waits for it.
#pragma once

#include <atomic>
#include <cstdint>

#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/core/timer.hpp>

#if defined(__linux__)
#include <cerrno>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DTRAIN_HAVE_FUTEX 1
#else
#define DTRAIN_HAVE_FUTEX 0
#endif

namespace dtrain::detail {

/// Longest single kernel wait: the deadline is checked at least this often.
inline constexpr double kFutexSliceSeconds = 0.05;
/// Longest single kernel wait of a counter wait that also drives its transport's progress: a
/// peer whose transfer needs this rank's progress waits at most about this long for it.
inline constexpr double kProgressSliceSeconds = 1e-3;

/// What a counter wait calls, besides watching its counter, so that the transport advances the
/// transfers it owes peers (the transport's optional `progress()`,
/// <dtrain/comm/shared_segments.hpp>); empty for none. A plain function and its argument: copying
/// it allocates nothing. The function must not throw.
struct WaitProgress {
  void (*poke)(void*) noexcept = nullptr;
  void* arg = nullptr;
  explicit operator bool() const noexcept { return poke != nullptr; }
  void operator()() const noexcept {
    if (poke) poke(arg);
  }
};

/// The waiters word of a counter: the next 64-bit word on the counter's own cache line
/// (SharedSegments keeps one line per counter). Local, lock-free.
inline std::atomic<std::uint64_t>& counter_waiters(std::atomic<std::uint64_t>& counter) noexcept {
  return (&counter)[1];
}

#if DTRAIN_HAVE_FUTEX
// The 32-bit word the kernel compares: the counter's low half (the counter only grows by small
// steps, so its low half changes whenever the counter does).
inline std::uint32_t* futex_word(std::atomic<std::uint64_t>& counter) noexcept {
  auto* p = reinterpret_cast<std::uint32_t*>(&counter);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  ++p;
#endif
  return p;
}
#endif

/// Raises `counter` (a SharedSegments counter) to `value` and wakes every waiter blocked on it.
/// Local, non-blocking; callable from any thread or process that maps the counter.
inline void counter_publish(std::atomic<std::uint64_t>& counter, std::uint64_t value) noexcept {
  counter.store(value, std::memory_order_seq_cst);
#if DTRAIN_HAVE_FUTEX
  if (counter_waiters(counter).load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, futex_word(counter), FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
#endif
}

/// Waits until `counter` >= `target`: spins (polling) for `spin_seconds` (at least
/// Backoff::kSpinSeconds), then sleeps in the kernel until a counter_publish wakes it, checking
/// `deadline` every `slice_seconds`. With a `progress`, calls it every 16 polls while spinning
/// and before each kernel wait, whose slices then last at most kProgressSliceSeconds. Returns
/// false if `deadline` passes first. Local, blocking; any number of threads or processes may
/// wait on one counter at once.
inline bool counter_wait(std::atomic<std::uint64_t>& counter, std::uint64_t target,
                         const Deadline& deadline, double spin_seconds = Backoff::kSpinSeconds,
                         double slice_seconds = kFutexSliceSeconds, WaitProgress progress = {}) {
  auto reached = [&] { return counter.load(std::memory_order_acquire) >= target; };
  if (reached()) return true;
  if (progress && slice_seconds > kProgressSliceSeconds) slice_seconds = kProgressSliceSeconds;
#if DTRAIN_HAVE_FUTEX
  {
    const double spin = spin_budget(spin_seconds);
    const double t0 = now_seconds();
    for (unsigned polls = 1;; ++polls) {
      if (reached()) return true;
      if ((polls & 15) == 0) {
        progress();
        if (now_seconds() - t0 >= spin) break;
      }
      wait_pause();
    }
  }
  auto& waiters = counter_waiters(counter);
  waiters.fetch_add(1, std::memory_order_seq_cst);
  bool ok = true;
  for (;;) {
    const std::uint64_t seen = counter.load(std::memory_order_seq_cst);
    if (seen >= target) break;
    const double left = deadline.remaining();
    if (left <= 0) {
      ok = false;
      break;
    }
    progress();
    const double slice = left < slice_seconds ? left : slice_seconds;
    timespec ts;
    ts.tv_sec = static_cast<time_t>(slice);
    ts.tv_nsec = static_cast<long>((slice - static_cast<double>(ts.tv_sec)) * 1e9);
    // Returns at a wake, a timeout, a signal, or at once (EAGAIN) when the word moved on.
    syscall(SYS_futex, futex_word(counter), FUTEX_WAIT, static_cast<std::uint32_t>(seen), &ts,
            nullptr, 0);
  }
  waiters.fetch_sub(1, std::memory_order_seq_cst);
  return ok || reached();
#else
  (void)slice_seconds;
  return poll_until(
      [&] {
        progress();
        return reached();
      },
      deadline, spin_seconds);
#endif
}

}  // namespace dtrain::detail
