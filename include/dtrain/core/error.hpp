// SPDX-License-Identifier: BSD-3-Clause
// dtrain: error hierarchy and rank-prefixed messages.
#pragma once

#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dtrain {

/// Base of every exception dtrain throws. Local; thread-safe to copy.
/// what() reads "dtrain: rank R: <operation>: <detail>".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// A caller passed a value the operation cannot accept (wrong dtype, bad rank, size mismatch).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A file could not be read or written, or its content is not what was expected.
class IoError : public Error {
 public:
  using Error::Error;
};

/// The transport (MPI, verbs, loopback) reported a failure.
class TransportError : public Error {
 public:
  using Error::Error;
};

/// A peer rank failed or called a different operation; raised on the ranks that noticed.
class RemoteError : public Error {
 public:
  using Error::Error;
};

/// A blocking wait passed its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// A GPU runtime or library call failed.
class DeviceError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// strerror's text for an errno value, for messages.
inline std::string errno_text(int e) { return std::string(std::strerror(e)); }

/// The rank used to prefix messages raised by the calling thread; -1 when unknown.
/// Set by transports and communicators (each loopback thread sets its own).
inline int& thread_rank() {
  thread_local int rank = -1;
  return rank;
}

/// RAII: sets the calling thread's rank for messages, restores the old one on exit.
class RankScope {
 public:
  explicit RankScope(int rank) : saved_(thread_rank()) { thread_rank() = rank; }
  ~RankScope() { thread_rank() = saved_; }
  RankScope(const RankScope&) = delete;
  RankScope& operator=(const RankScope&) = delete;

 private:
  int saved_;
};

inline std::string rank_prefix(int rank) {
  if (rank < 0) return "dtrain: rank ?: ";
  return "dtrain: rank " + std::to_string(rank) + ": ";
}

inline std::string format_message(int rank, const std::string& operation,
                                  const std::string& detail) {
  std::string out = rank_prefix(rank);
  out += operation;
  if (!detail.empty()) {
    out += ": ";
    out += detail;
  }
  return out;
}

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

}  // namespace detail

/// Builds an exception of type E whose message names the calling thread's rank and `operation`.
template <class E = Error>
E make_error(const std::string& operation, const std::string& detail) {
  return E(detail::format_message(detail::thread_rank(), operation, detail));
}

/// Same, with an explicit rank (for code that knows it better than the thread does).
template <class E = Error>
E make_error(int rank, const std::string& operation, const std::string& detail) {
  return E(detail::format_message(rank, operation, detail));
}

/// Throws E with a rank-prefixed message.
template <class E = Error>
[[noreturn]] void raise(const std::string& operation, const std::string& detail) {
  throw make_error<E>(operation, detail);
}

}  // namespace dtrain

/// Throws dtrain::InvalidArgument naming the operation when `cond` is false.
/// Usage: DTRAIN_REQUIRE(n >= 0, "allreduce", "count " << n << " is negative");
#define DTRAIN_REQUIRE(cond, operation, stream_expr)                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::ostringstream dtrain_require_os_;                                             \
      dtrain_require_os_ << stream_expr;                                                 \
      ::dtrain::raise<::dtrain::InvalidArgument>((operation), dtrain_require_os_.str()); \
    }                                                                                    \
  } while (0)

/// Internal invariant: throws dtrain::Error naming file and line (a library bug, not user input).
#define DTRAIN_ASSERT(cond)                                                              \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ::dtrain::raise<::dtrain::Error>(                                                  \
          "internal check",                                                              \
          std::string(#cond " failed at ") + __FILE__ + ":" + std::to_string(__LINE__)); \
    }                                                                                    \
  } while (0)
