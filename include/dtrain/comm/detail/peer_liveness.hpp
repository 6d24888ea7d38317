// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what a timed-out wait can say about the rank it waited for, and about itself.
//
// A timeout alone cannot tell a stopped or dead peer from a slow one, from a chain of waits that
// ends at another rank (rank 0 waits for rank 1, which waits for the stopped rank 2), or from the
// waiting rank having been stopped itself. The message therefore combines what this process can
// actually know:
// - its own descheduling: the polled Deadline (core/timer.hpp) records gaps between its checks
//   longer than a second (this thread did not run) and extends itself by them;
// - for peers on the same node, whose process ids a transport may exchange at start-up: the
//   state Linux reports in /proc/<pid>/stat (T/t: stopped or traced; Z, X or gone, or a different
//   start time: exited). The pid is paired with the process start time, so a reused pid is not
//   mistaken for the rank;
// - its own descheduling before the wait began: a rank stopped while it computed (outside any
//   wait) and resumed after its peers gave up on it enters the collective late and times out in
//   turn, waiting for peers that are no longer there. A process-wide watch thread (RunGapWatch,
//   started with the first communicator; it wakes four times a second and does nothing else)
//   records when the process last did not run for more than a second, so that timeout can say
//   that this rank was the late one instead of blaming a healthy peer;
// - for peers on other nodes: nothing but "no progress from rank Q for N s".
// The root cause comes first in the message, because the first line on the terminal is what the
// user reads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <dtrain/core/error.hpp>
#include <dtrain/core/detect.hpp>
#include <dtrain/core/timer.hpp>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace dtrain::detail {

/// A process, identified across pid reuse: its pid and start time (clock ticks after boot, field
/// 22 of /proc/<pid>/stat). pid 0: unknown (another node, or no /proc).
struct ProcessId {
  long long pid = 0;
  long long start = 0;
};

/// What /proc says about a peer process.
enum class PeerState : unsigned char { unknown, running, stopped, gone };

struct PeerStatus {
  PeerState state = PeerState::unknown;
  long long pid = 0;
  char code = 0;  // the state letter of /proc/<pid>/stat (0 when unreadable)
};

/// Local. Reads the state letter and start time of `pid` from /proc; false when it cannot.
inline bool read_proc_stat(long long pid, char& state, long long& start) noexcept {
#if defined(__linux__)
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ' || !p[2]) return false;
  state = p[2];
  p += 3;
  // Fields 4..21 follow the state; the start time is field 22.
  for (int field = 4; field < 22; ++field) {
    p = std::strchr(p + 1, ' ');
    if (!p) return false;
  }
  return std::sscanf(p, " %lld", &start) == 1;
#else
  (void)pid;
  (void)state;
  (void)start;
  return false;
#endif
}

/// Local. This process's id (pid 0 where /proc is unavailable).
inline ProcessId self_process_id() noexcept {
#if defined(__linux__)
  ProcessId id;
  char state = 0;
  id.pid = static_cast<long long>(::getpid());
  if (!read_proc_stat(id.pid, state, id.start)) return ProcessId{};
  return id;
#else
  return ProcessId{};
#endif
}

/// Local. The state of process `id` now: stopped (T, t), gone (Z, X, no such process, or a pid
/// now used by a process started at another time), running (any other state, including
/// sleeping), unknown for pid 0.
inline PeerStatus process_status(const ProcessId& id) noexcept {
  PeerStatus s;
  s.pid = id.pid;
  if (id.pid <= 0) return s;
  char code = 0;
  long long start = 0;
  if (!read_proc_stat(id.pid, code, start) || start != id.start) {
    s.state = PeerState::gone;
    return s;
  }
  s.code = code;
  if (code == 'T' || code == 't')
    s.state = PeerState::stopped;
  else if (code == 'Z' || code == 'X' || code == 'x')
    s.state = PeerState::gone;
  else
    s.state = PeerState::running;
  return s;
}

/// Process-wide record of the latest stretch of time in which this process did not run (stopped
/// by SIGSTOP or a debugger, swapped out, its virtual machine paused, or starved of CPU): a
/// detached thread sleeps kTickSeconds at a time and records a wake-up that came more than
/// kGapSeconds after the previous one. Started once per process by start() (the first
/// communicator calls it); costs four wake-ups a second. Thread-safe.
class RunGapWatch {
 public:
  static constexpr double kTickSeconds = 0.25;
  static constexpr double kGapSeconds = 1.0;
  struct Gap {
    double seconds = 0;  ///< how long the process did not run (0: no gap recorded)
    double ended = 0;    ///< when it ran again (now_seconds())
  };
  /// Local, thread-safe, never throws. Starts the watch thread unless it runs already (or cannot
  /// be created: the watch then stays empty).
  static void start() noexcept {
    State& s = state();
    // Keyed by process id, so that a child made by fork() (which inherits the memory but not the
    // thread) starts its own.
    const long long me = self_pid();
    long long owner = s.owner.load(std::memory_order_acquire);
    if (owner == me || !s.owner.compare_exchange_strong(owner, me, std::memory_order_acq_rel))
      return;
    try {
      // The first tick counts from now, not from when the new thread first runs: a process
      // stopped before its watch thread got a core still has that stop recorded.
      std::thread([&s, t0 = now_seconds()] { s.run(t0); }).detach();
    } catch (...) {  // no thread: timeouts simply cannot report a gap before their wait
    }
  }
  /// Local, thread-safe. The latest gap recorded (seconds 0 when none).
  static Gap last() noexcept {
    State& s = state();
    Gap g;
    // The end is published after the length (release), so a reader that sees an end sees its
    // length or a later one's.
    g.ended = s.ended.load(std::memory_order_acquire);
    g.seconds = s.seconds.load(std::memory_order_relaxed);
    return g;
  }
  /// Local, thread-safe. Records a gap as the watch thread does (for tests).
  static void record(double seconds, double ended) noexcept { state().record(seconds, ended); }

 private:
  struct State {
    std::atomic<long long> owner{0};  // the process whose watch thread runs
    std::atomic<double> seconds{0}, ended{0};
    void record(double gap, double at) noexcept {
      seconds.store(gap, std::memory_order_relaxed);
      ended.store(at, std::memory_order_release);
    }
    [[noreturn]] void run(double prev) noexcept {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::duration<double>(kTickSeconds));
        const double t = now_seconds();
        if (t - prev > kTickSeconds + kGapSeconds) record(t - prev - kTickSeconds, t);
        prev = t;
      }
    }
  };
  static long long self_pid() noexcept {
#if defined(__linux__)
    return static_cast<long long>(::getpid());
#else
    return 1;
#endif
  }
  // Never destroyed: the detached thread uses it until the process ends.
  static State& state() noexcept {
    static State* s = new State();
    return *s;
  }
};

/// Detects `PeerStatus t.peer_status(int rank)` (a transport that knows its same-node peers'
/// processes: MpiTransport).
template <class T>
using peer_status_call = decltype(std::declval<T&>().peer_status(0));
template <class T>
using has_peer_status = is_detected<peer_status_call, T>;

/// "rank 2 (pid 4242 on this node) is stopped (state T: SIGSTOP, a debugger or job control)".
inline std::string describe_peer(int rank, const PeerStatus& s) {
  switch (s.state) {
    case PeerState::stopped:
      return concat("rank ", rank, " (pid ", s.pid, " on this node) is stopped (state ", s.code,
                    ": SIGSTOP, job control or a debugger)");
    case PeerState::gone:
      return concat("rank ", rank, " (pid ", s.pid, " on this node) has exited",
                    s.code ? concat(" (state ", s.code, ")") : std::string());
    case PeerState::running:
      return concat("rank ", rank, " (pid ", s.pid, " on this node) is alive (state ", s.code,
                    ") but made no progress");
    case PeerState::unknown: break;
  }
  return concat("no progress from rank ", rank,
                " (it runs on another node, or its process is not known here)");
}

/// Local. Whether this process's latest gap `g` can explain peers giving up on it before the wait
/// bounded by `deadline` began: a peer gives up after one budget, so the gap lasted at least half
/// a budget (budgets may differ a little between ranks) and ended at most one budget before the
/// wait began (the rest of a step between the resumption and the collective).
inline bool late_arrival(const RunGapWatch::Gap& g, const Deadline& deadline) noexcept {
  if (g.seconds <= 0 || deadline.budget() <= 0) return false;
  return g.seconds >= 0.5 * deadline.budget() && g.ended >= deadline.started() - deadline.budget();
}

/// The detail of a TimeoutError for a wait on transport rank `peer` bounded by `deadline`:
/// this rank's own descheduling first if there was any (during the wait, or just before it: see
/// late_arrival), then a stopped or exited rank of this
/// node if one is found (the peer itself, or another rank the peer is presumably waiting for),
/// then what is known about the peer.
template <class Transport>
std::string timeout_detail(Transport& t, int peer, const Deadline& deadline) {
  std::string out;
  const RunGapWatch::Gap before = RunGapWatch::last();
  if (deadline.descheduled_seconds() > 0) {
    char lost[32];
    std::snprintf(lost, sizeof lost, "%.1f", deadline.descheduled_seconds());
    out = concat("this rank itself did not run for ", lost,
                 " s while it waited (it was stopped, or starved of CPU; the deadline was "
                 "extended by that time), so rank ",
                 peer, " is not known to be at fault; ");
  } else if (late_arrival(before, deadline)) {
    char lost[32], ago[32];
    std::snprintf(lost, sizeof lost, "%.1f", before.seconds);
    std::snprintf(ago, sizeof ago, "%.1f",
                  deadline.started() > before.ended ? deadline.started() - before.ended : 0.0);
    out = concat("this rank itself did not run for ", lost, " s, until ", ago,
                 " s before this wait began (it was stopped, or starved of CPU), so it probably "
                 "arrived after its peers had given up waiting for it and rank ",
                 peer, " is not known to be at fault; ");
  }
  const std::string wait =
      concat("wait for rank ", peer, " timed out after ", deadline.budget(), " s");
  if constexpr (has_peer_status<Transport>::value) {
    const PeerStatus ps = t.peer_status(peer);
    if (ps.state == PeerState::stopped || ps.state == PeerState::gone)
      return out + wait + ": " + describe_peer(peer, ps);
    // A chain of waits: the peer is alive, so look for a rank of this node that is not.
    for (int q = 0; q < t.size(); ++q) {
      if (q == peer || q == t.rank()) continue;
      const PeerStatus qs = t.peer_status(q);
      if (qs.state == PeerState::stopped || qs.state == PeerState::gone)
        return out + describe_peer(q, qs) + "; " + wait + " (rank " + std::to_string(peer) +
               " is alive, probably waiting for rank " + std::to_string(q) + ")";
    }
    return out + wait + ": " + describe_peer(peer, ps);
  }
  return out + wait;
}

}  // namespace dtrain::detail
