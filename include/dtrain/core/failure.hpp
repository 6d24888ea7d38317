// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what happens when a rank fails. The failure policy (abort the job, or hand the error to
// the application), the process-wide "this job is failing" flag, and the guard that destructors
// use to avoid collectives on the unwind path.
//
// Why: a collective needs every rank. A rank that throws and then, while unwinding, closes an
// MPI-IO file or frees a window waits for peers that are still computing (or dead), so its error
// reaches the terminal only after the peers' timeouts, if ever. dtrain therefore never runs a
// collective on the unwind path, and by default the examples abort the whole job as soon as one
// rank has printed its error.
//
// The policy
// ----------
// - FailurePolicy::propagate (library default): an error is an exception like any other. Objects
//   whose destructor would run a collective (an Hdf5Dataset on the MPI-IO driver, ...) detect that
//   they are destroyed by an exception and skip the collective, leaking the resource (the file
//   handle stays open until the process ends). The application catches the error and decides;
//   after such a leak it should end the job (MPI_Abort) rather than carry on collectively, since
//   the peers may still be inside the abandoned collective.
// - FailurePolicy::abort_job: the rank prints its own error (one line, "dtrain: rank R: ..."),
//   marks the job failing and aborts the job through the installed abort hook (MPI_Abort on the
//   communicator, see <dtrain/transports/mpi_abort.hpp>). With dtrain::run_main an exception that
//   escapes the training function ends the job without unwinding the stack at all, so no
//   destructor runs. The root cause is then the first dtrain line on the terminal: the peers are
//   killed by the process manager before their own deadlines expire.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// What a rank does with an error that ends its training (see the header comment).
enum class FailurePolicy : unsigned char {
  propagate,  ///< throw to the application; destructors skip collectives while unwinding
  abort_job,  ///< print the error, then abort the whole job through the abort hook
};

constexpr const char* name_of(FailurePolicy p) noexcept {
  return p == FailurePolicy::abort_job ? "abort_job" : "propagate";
}

/// Ends the job with `code`; must not return. Installed by transports (MPI_Abort on their
/// communicator); without one, the process exits.
using AbortHook = void (*)(int code) noexcept;

namespace detail {

struct FailureState {
  std::atomic<FailurePolicy> policy{FailurePolicy::propagate};
  std::atomic<AbortHook> hook{nullptr};
  std::atomic<bool> failing{false};
  std::atomic<bool> reported{false};
  std::atomic<std::size_t> unfinished{0};
};

inline FailureState& failure_state() {
  static FailureState s;
  return s;
}

/// Writes one line to stderr with a single write, so that lines of concurrent ranks (and
/// threads) do not interleave, and flushes.
inline void write_error_line(const std::string& line) noexcept {
  std::string s = line;
  if (s.empty() || s.back() != '\n') s.push_back('\n');
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

inline std::string describe(const std::exception_ptr& e) {
  if (!e) return detail::rank_prefix(detail::thread_rank()) + "fatal: no exception";
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.what();  // already "dtrain: rank R: operation: detail"
  } catch (const std::exception& x) {
    return detail::rank_prefix(detail::thread_rank()) + "fatal: " + x.what();
  } catch (...) {
    return detail::rank_prefix(detail::thread_rank()) + "fatal: unknown exception";
  }
}

}  // namespace detail

/// Local, thread-safe. The current failure policy (process-wide).
inline FailurePolicy failure_policy() noexcept { return detail::failure_state().policy.load(); }

/// Local, thread-safe. Sets the failure policy of this process. Every rank should choose the same.
inline void set_failure_policy(FailurePolicy p) noexcept { detail::failure_state().policy = p; }

/// Local, thread-safe. Installs the function that ends the job (nullptr: exit the process).
/// Returns the previous one.
inline AbortHook set_abort_hook(AbortHook hook) noexcept {
  return detail::failure_state().hook.exchange(hook);
}

/// Local, thread-safe. True once this process has started to fail (job_failed was called): from
/// then on no destructor runs a collective.
inline bool job_failing() noexcept { return detail::failure_state().failing.load(); }

/// Local, thread-safe. Records that `n` communication operations were given up while still in
/// progress (a transfer MPI could not cancel, a write left to a detached thread inside MPI): the
/// peer they wait for may never answer, so ending MPI (MPI_Finalize, which waits for every
/// rank) must not be attempted in this process (see MpiSession).
inline void note_unfinished_operations(std::size_t n) noexcept {
  detail::failure_state().unfinished.fetch_add(n);
}

/// Local, thread-safe. How many operations note_unfinished_operations recorded in this process.
inline std::size_t unfinished_operations() noexcept {
  return detail::failure_state().unfinished.load();
}

/// Local, thread-safe, never returns. Prints `message` on its own line (the first caller only;
/// later, secondary errors of the same process are not printed), marks the job failing and calls
/// the abort hook with `code`; without a hook, or if it returns, ends the process with
/// std::_Exit(code) (no destructors, no atexit handlers: they could wait for peers).
[[noreturn]] inline void abort_job(const std::string& message, int code = 1) noexcept {
  auto& st = detail::failure_state();
  st.failing = true;
  if (!st.reported.exchange(true)) detail::write_error_line(message);
  if (AbortHook hook = st.hook.load()) hook(code);
  std::_Exit(code);
}

/// Local. Handles an error that ended this rank's training according to the policy: with
/// abort_job prints it and aborts the job (never returns); with propagate marks the process
/// failing, prints it and returns 1 (an exit code for main).
inline int job_failed(const std::exception_ptr& e) noexcept {
  std::string line;
  try {
    line = detail::describe(e);
  } catch (...) {
    line = "dtrain: fatal error (message unavailable)";
  }
  if (failure_policy() == FailurePolicy::abort_job) abort_job(line, 1);
  detail::failure_state().failing = true;
  if (!detail::failure_state().reported.exchange(true)) detail::write_error_line(line);
  return 1;
}

/// Runs the training function `body` (returning int, the exit code) under the failure policy.
/// abort_job: an exception escaping `body` is not caught here, so (with no enclosing handler in
/// the caller either) the C++ runtime calls std::terminate without unwinding the stack; the
/// terminate handler installed with the abort hook (install_terminate_handler) prints the error
/// and aborts the job. No destructor runs, so none can wait for a peer. Do not wrap run_main in
/// a try block that catches the error, or the stack unwinds first (destructors then skip their
/// collectives, see UnwindGuard, and the handler must call job_failed itself).
/// propagate: the exception is caught after the stack has unwound, printed, and 1 returned.
template <class F>
int run_main(F&& body) {
  if (failure_policy() == FailurePolicy::abort_job) return std::forward<F>(body)();
  try {
    return std::forward<F>(body)();
  } catch (...) {
    return job_failed(std::current_exception());
  }
}

/// Local. Makes std::terminate (an exception nobody caught, on any thread) print the exception's
/// message and end the job through the abort hook. Idempotent.
inline void install_terminate_handler() noexcept {
  std::set_terminate([] {
    std::exception_ptr e = std::current_exception();
    std::string line;
    try {
      line = e ? detail::describe(e)
               : detail::rank_prefix(detail::thread_rank()) + "std::terminate called";
    } catch (...) {
      line = "dtrain: std::terminate called";
    }
    abort_job(line, 1);
  });
}

/// Tells a destructor whether it runs because of an error: true when more exceptions are in
/// flight than when the guard was made (the owner is being destroyed by stack unwinding) or the
/// process is failing (job_failing()). Such a destructor must not run collectives (close an
/// MPI-IO file, free a window, wait for a barrier): it leaks the resource instead. Local,
/// thread-compatible (each object holds its own guard; construct it with the object).
class UnwindGuard {
 public:
  UnwindGuard() noexcept : count_(std::uncaught_exceptions()) {}
  bool failing() const noexcept { return std::uncaught_exceptions() > count_ || job_failing(); }

 private:
  int count_;
};

}  // namespace dtrain
