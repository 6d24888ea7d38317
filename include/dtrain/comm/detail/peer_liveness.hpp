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
// - for peers on other nodes: nothing but "no progress from rank Q for N s".
// The root cause comes first in the message, because the first line on the terminal is what the
// user reads.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include <dtrain/core/error.hpp>
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

/// Detects `PeerStatus t.peer_status(int rank)` (a transport that knows its same-node peers'
/// processes: MpiTransport).
template <class T, class = void>
struct has_peer_status : std::false_type {};
template <class T>
struct has_peer_status<T, std::void_t<decltype(std::declval<T&>().peer_status(0))>>
    : std::true_type {};

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

/// The detail of a TimeoutError for a wait on transport rank `peer` bounded by `deadline`:
/// this rank's own descheduling first if there was any, then a stopped or exited rank of this
/// node if one is found (the peer itself, or another rank the peer is presumably waiting for),
/// then what is known about the peer.
template <class Transport>
std::string timeout_detail(Transport& t, int peer, const Deadline& deadline) {
  std::string out;
  if (deadline.descheduled_seconds() > 0) {
    char lost[32];
    std::snprintf(lost, sizeof lost, "%.1f", deadline.descheduled_seconds());
    out = concat("this rank itself did not run for ", lost,
                 " s while it waited (it was stopped, or starved of CPU; the deadline was "
                 "extended by that time), so rank ",
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
