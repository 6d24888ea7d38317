// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the one way every polling wait in the communication layer gives the core away.
//
// A wait that polls (a transport's wait_until, a cancel that waits for a copy in progress) first
// spins for a few microseconds, since a partner running on another core answers within that. What
// it does next depends on whether anything else wants this core:
// - Nothing else runnable: a yield returns at once, so yielding between polls is as fast as
//   spinning (the quiet all-reduce keeps its bandwidth) while still letting a thread that wakes
//   up have the core.
// - Something else runnable (the rank's own compute thread next to its progress thread, another
//   rank when ranks outnumber cores, another job on a shared node): every yield hands the core
//   over and the poller takes it back at the next scheduling decision. Measured on 2 ranks on 2
//   cores training the 784-1024-1024-10 model, about a quarter of the CPU samples were then in
//   sched_yield and the scheduler, with the compute thread preempted by its own rank's progress
//   thread (benchmarks/RESULTS.md). To the scheduler a thread that always yields looks CPU-bound,
//   so under a competing load it also gets no priority when its message arrives.
// So a yield that took long enough to show that another thread ran (kYieldGaveAwaySeconds) ends
// the yield phase: the wait sleeps between polls from then on, which frees the core for whole
// stretches and makes the poller a sleeper that the scheduler runs soon after its timer fires.
// Where the kernel counts the thread's involuntary context switches (Linux: a yield that runs
// another thread counts as one), a long yield ends the phase only if that count grew during the
// wait's yields: on a virtual machine a yield also takes long when the host takes the virtual
// CPU away for a moment, and nothing then wants this core. Measured with 2 ranks on a 2-core
// virtual machine, 18-30 yields per allreduce_bench run took longer than kYieldGaveAwaySeconds and
// only 1-4 of them had switched; each of the others sent the thread's waits to sleeps of 70-80 us
// for kContendedSeconds, and an MPI all-reduce of 64 KiB (two messages of 20-50 us) then took 3x
// its time, in the bench and in the calibration's probes alike (benchmarks/RESULTS.md).
// That finding is carried across waits: the calling thread remembers for kContendedSeconds that
// its core is contended, and its next waits (the following messages of the same collective, the
// next bucket) go from the spin straight to the sleeps instead of restarting a yield storm per
// message. A switched yield with no other within kContendedSeconds before it is remembered only
// for kLoneSwitchSeconds: on an idle 2-rank, 2-core machine such lone switches (a kernel thread,
// the other rank passing through this core) came 6-7 times in a 2 s allreduce_bench run, none
// within 50 ms of another, and each held the rank's waits in 60-100 us sleeps for 50 ms (rd at
// 4 KiB then timed 56-120 us a call instead of 3; benchmarks/RESULTS.md). On a core that is
// really shared every yield switches, so the second one, at most a time slice later, brings the
// full memory back. (Not on a progress thread, which keeps the full memory; see below.) A wait that
// yields for kYieldSeconds (2 ms) without finding contention also moves on to sleeping, so a
// stalled wait (a late or stopped rank) costs about a thousandth of a core instead of a whole one
// for minutes.
//
// What a sleep costs where the message is due soon: Linux lets a 20 us sleep run on by the
// thread's timer slack (50 us by default), so it costs 70-80 us, and a sleep that doubled on every
// poll reached 1 ms within a few hundred microseconds. Two rules keep waits that are short, but
// long enough to leave the spin, from paying that (benchmarks/RESULTS.md, "Waits that neither
// burn a core nor add latency"):
// - A sleep is at most kSleepFraction of the time the wait has already lasted (and at least
//   kMinSleepSeconds): a message arriving 100 us after the spin costs a few short sleeps, not a
//   millisecond; kMaxSleepSeconds is reached only after 4 ms of waiting.
// - Only evidence renews the memory: a wait that saw a yield give the core away refreshes it while
//   it sleeps; a wait that slept only because of the memory does not. (Renewing it on every sleep
//   kept a thread that once saw a stray long yield sleeping on every wait for as long as its waits
//   came less than 50 ms apart, that is for a whole run.)
// A communicator's progress thread keeps the earlier rules (sleeps doubling from 20 us, memory
// renewed by every sleep): it shares its core with its rank's compute thread nearly all the
// time, and training ran slower in measurements with the new rules on that thread (more wake-ups
// preempting the compute thread). Timer slack is left at Linux's default on every thread: 1 us
// on the progress thread made its sleeps shorter but training slower too.
//
// MPI point-to-point in MPICH needs polling for progress (no asynchronous progress thread), so
// MPI channels are paced this way. Waits on counters in node-shared memory (the shm algorithms)
// block in the kernel instead, woken by the writer (futex_wait.hpp).
//
// The spin phase can be lengthened by a wait that knows its partner is running on another core
// and answers within a known time (the shm algorithm: one chunk copy). On a machine where other
// processes are runnable, a yield is not free: the scheduler hands the core to one of them for
// the rest of a time slice (milliseconds), so a wait that yields every few microseconds while
// its partner copies a 256 KiB chunk loses a time slice per chunk (measured: about two
// involuntary context switches per chunk and 4x lower bandwidth for shm at 16 MiB on a loaded
// 2-core machine, benchmarks/RESULTS.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <thread>

#if defined(__linux__)
#include <sys/resource.h>
#endif

#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Tells the CPU that this is a spin loop (saves power, frees the sibling hyperthread). Local.
inline void wait_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Per-thread memory of the waits that came before: until when this thread's core counts as
/// contended (a yield handed it to another thread), and whether the thread is a communicator's
/// progress thread (whose rank computes meanwhile). Thread-local; read and written by Backoff.
struct WaitHistory {
  double contended_until = -1;
  double last_switch = -1;  // when a long yield of this thread last switched to another thread
  bool progress_thread = false;
};
inline WaitHistory& wait_history() noexcept {
  thread_local WaitHistory h;
  return h;
}

/// Clears the calling thread's memory of contention, so that its next waits start from the spin
/// and judge the core afresh (a measurement that times one algorithm after another, so that the
/// one timed is not paced by what its predecessor found). Local.
inline void forget_contention() noexcept {
  WaitHistory& h = wait_history();
  h.contended_until = -1;
  h.last_switch = -1;
}

/// Test knob: when set, involuntary_switches() returns what this returns (tests stand in for a
/// yield that let another thread run). Set and clear it while no other thread waits.
inline long (*&involuntary_switches_hook() noexcept)() {
  static long (*hook)() = nullptr;
  return hook;
}

/// Involuntary context switches of the calling thread so far (Linux: getrusage's ru_nivcsw for
/// the thread; a yield that let another thread run adds one, a yield that found nothing else to
/// run or lost the virtual CPU to its host adds none). -1 where the count is unknown. Local.
inline long involuntary_switches() noexcept {
  if (long (*hook)() = involuntary_switches_hook()) return hook();
#if defined(__linux__) && defined(RUSAGE_THREAD)
  rusage ru{};
  if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
  return -1;
}

/// Test knob: when set, a wait yields by calling this instead of std::this_thread::yield (tests
/// stand in for a virtual CPU taken away by its host: time passes, no other thread runs). Set
/// and clear it while no other thread waits.
inline void (*&wait_yield_hook() noexcept)() {
  static void (*hook)() = nullptr;
  return hook;
}

/// Longest spin of a wait on a progress thread: its rank's compute thread is usually runnable
/// and would lose the core to a longer one.
inline constexpr double kProgressSpinSeconds = 20e-6;

/// The spin a wait that asks for `requested` seconds gets on the calling thread: at least
/// kSpinSeconds (below), at most kProgressSpinSeconds on a progress thread. Local.
double spin_budget(double requested) noexcept;

/// State of one polling wait. Local object; call pause() after each unsuccessful poll.
class Backoff {
 public:
  static constexpr double kSpinSeconds = 5e-6;
  /// Spins for `spin_seconds` (at least kSpinSeconds) before yielding or sleeping.
  explicit Backoff(double spin_seconds = kSpinSeconds) noexcept
      : spin_(spin_budget(spin_seconds)) {}
  /// Longest yield phase of a wait that finds its core uncontended.
  static constexpr double kYieldSeconds = 2e-3;
  static constexpr double kMinSleepSeconds = 20e-6;
  static constexpr double kMaxSleepSeconds = 1e-3;
  /// A sleep lasts at most this fraction of the time the wait has already waited.
  static constexpr double kSleepFraction = 0.25;
  /// A yield that lasted this long let another thread run: the core is contended.
  static constexpr double kYieldGaveAwaySeconds = 20e-6;
  /// How long a thread remembers that its core was contended.
  static constexpr double kContendedSeconds = 0.05;
  /// How long it remembers one switched long yield when no other came within kContendedSeconds
  /// before it (see the top: a lone switch on an otherwise idle machine).
  static constexpr double kLoneSwitchSeconds = 5e-3;

  /// Gives the core away as much as the time already waited and the core's contention call for.
  void pause() noexcept {
    if (++polls_ < 16) {  // the first polls are too cheap to be worth a clock read
      wait_pause();
      return;
    }
    const double t = now_seconds();
    if (start_ < 0) start_ = t;
    const double waited = t - start_;
    if (waited < spin_) {
      wait_pause();
      return;
    }
    WaitHistory& h = wait_history();
    if (!sleeping_) {
      if (t < h.contended_until) {
        remembered_ = true;
      } else if (waited < spin_ + kYieldSeconds) {
        if (switches_ == kUnread) switches_ = involuntary_switches();
        if (void (*hook)() = wait_yield_hook())
          hook();
        else
          std::this_thread::yield();
        const double after = now_seconds();
        if (after - t < kYieldGaveAwaySeconds) return;
        // A long yield with the switch count unchanged: the core was not given to anyone.
        if (switches_ >= 0 && involuntary_switches() <= switches_) return;
        // Remembered for kContendedSeconds when it follows another switched yield within that
        // time or on a progress thread (its rules as before, see the top), else only for
        // kLoneSwitchSeconds.
        memory_ =
            h.progress_thread || (h.last_switch >= 0 && after - h.last_switch < kContendedSeconds)
                ? kContendedSeconds
                : kLoneSwitchSeconds;
        h.last_switch = after;
        h.contended_until = after + memory_;
        contended_ = true;
      }
      sleeping_ = true;
    }
    if (h.progress_thread) {
      sleep_ = sleep_ <= 0 ? kMinSleepSeconds
                           : (sleep_ * 2 > kMaxSleepSeconds ? kMaxSleepSeconds : sleep_ * 2);
    } else {
      sleep_ = sleep_seconds(waited);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_));
    // A wait that found the core contended keeps the memory of it fresh while it lasts; one that
    // sleeps only because of the memory has no new evidence and leaves it to run out (except on a
    // progress thread, see above).
    if (contended_ || (remembered_ && h.progress_thread))
      h.contended_until = now_seconds() + (contended_ ? memory_ : kContendedSeconds);
  }
  /// The sleep between polls of a wait that has waited `waited` seconds, except on a progress
  /// thread: kSleepFraction of it, within [kMinSleepSeconds, kMaxSleepSeconds]. Local, pure.
  static constexpr double sleep_seconds(double waited) noexcept {
    const double s = waited * kSleepFraction;
    return s < kMinSleepSeconds ? kMinSleepSeconds : (s > kMaxSleepSeconds ? kMaxSleepSeconds : s);
  }
  /// True once the wait has passed the spin and yield phases (a caller that can block on a
  /// condition variable instead should do so from here on).
  bool past_yield() const noexcept { return sleeping_; }

 private:
  double spin_;
  unsigned polls_ = 0;
  double start_ = -1;
  double sleep_ = 0;
  double memory_ = kContendedSeconds;  // how long this wait's evidence of contention is kept
  bool sleeping_ = false;
  static constexpr long kUnread = -2;  // switches_ before the wait's first yield
  long switches_ = kUnread;  // involuntary_switches() at the wait's first yield (-1: unknown)
  bool contended_ = false;   // a yield of this wait gave the core away
  bool remembered_ = false;  // sleeping only because of the thread's memory of contention
};

/// Spin before a wait on node-shared segments with `slot_bytes` slots yields (the shm and hier
/// algorithms). While the `machine_ranks` ranks on this machine do not outnumber its `cores`
/// (0: unknown), the partner runs and answers within about one slot's copy at 1 GB/s or better:
/// that long, 20 us to 1 ms. Otherwise the partner may be waiting for this very core:
/// kSpinSeconds. Counted by machine, not by node: DTRAIN_RANKS_PER_NODE's fake nodes of 2 ranks,
/// 4 ranks on 2 cores, spun up to a slot's copy and measured hier and hier_leader 1.2-1.8x slower
/// (benchmarks/RESULTS.md). Pure.
inline double segment_spin_seconds(int machine_ranks, unsigned cores,
                                   std::size_t slot_bytes) noexcept {
  if (cores != 0 && machine_ranks > 0 && static_cast<unsigned>(machine_ranks) > cores)
    return Backoff::kSpinSeconds;
  const double s = static_cast<double>(slot_bytes) * 1e-9;
  return s < 20e-6 ? 20e-6 : s > 1e-3 ? 1e-3 : s;
}

inline double spin_budget(double requested) noexcept {
  double s = requested > Backoff::kSpinSeconds ? requested : Backoff::kSpinSeconds;
  if (wait_history().progress_thread && s > kProgressSpinSeconds) s = kProgressSpinSeconds;
  return s;
}

/// Polls `done()` with a Backoff (spinning `spin_seconds` before yielding) until it returns true
/// (true) or `deadline` passes (false).
template <class Done>
bool poll_until(Done&& done, const Deadline& deadline,
                double spin_seconds = Backoff::kSpinSeconds) {
  Backoff b(spin_seconds);
  for (;;) {
    if (done()) return true;
    if (deadline.expired()) return done();
    b.pause();
  }
}

}  // namespace dtrain::detail
