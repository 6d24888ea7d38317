// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the handle a non-blocking collective returns.
#pragma once

#include <exception>
#include <memory>
#include <utility>

#include <dtrain/comm/detail/progress_engine.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/log.hpp>

namespace dtrain {

/// Completion handle of a started collective. Local object of the rank that started it; not
/// thread-safe (use it from the thread that started the collective). Move-only. Destroying a
/// handle whose collective is still running waits for it (errors are then logged, not thrown),
/// because the collective reads and writes the caller's buffers until it completes. While an
/// exception unwinds the stack (or the job is failing, job_failing()) the destructor abandons
/// the communicator instead of waiting out its deadline: the collective's waits end at once, its
/// transfers are cancelled (or, where MPI cannot cancel them, quarantined by the transport), the
/// communicator becomes unusable, and nothing is logged, so the error being unwound stays the
/// first one reported.
class CollectiveHandle {
 public:
  CollectiveHandle() = default;
  /// Handle of a job owned elsewhere (a plan); `keep` optionally owns it.
  CollectiveHandle(detail::Job* job, std::shared_ptr<detail::Job> keep = nullptr) noexcept
      : job_(job), keep_(std::move(keep)) {}
  CollectiveHandle(CollectiveHandle&& o) noexcept
      : job_(std::exchange(o.job_, nullptr)), keep_(std::move(o.keep_)) {}
  CollectiveHandle& operator=(CollectiveHandle&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      job_ = std::exchange(o.job_, nullptr);
      keep_ = std::move(o.keep_);
    }
    return *this;
  }
  ~CollectiveHandle() { finish_quietly(); }

  /// True when the handle refers to a collective not yet waited for.
  bool valid() const noexcept { return job_ != nullptr; }

  /// Non-blocking check: true once complete (rethrows the collective's failure). Without a
  /// progress thread this runs the queued collectives up to this one, blocking meanwhile.
  bool test() {
    if (!job_) return true;
    if (!job_->engine->test(*job_)) return false;
    release();
    return true;
  }

  /// Blocks until complete and rethrows the collective's failure (TimeoutError, RemoteError,
  /// TransportError). Bounded by the communicator's deadline.
  void wait() {
    if (!job_) return;
    detail::Job* j = job_;
    try {
      j->engine->wait(*j);
    } catch (...) {
      release();
      throw;
    }
    release();
  }

 private:
  void release() noexcept {
    job_ = nullptr;
    keep_.reset();
  }
  void finish_quietly() noexcept {
    if (!job_) return;
    const bool unwinding = std::uncaught_exceptions() > 0 || job_failing();
    if (unwinding) job_->engine->abandon();
    try {
      job_->engine->wait(*job_);
    } catch (const std::exception& e) {
      // While unwinding, this failure is a consequence of the error in flight (or of the
      // abandonment itself): reporting it would put a secondary line before the root cause.
      if (unwinding)
        DTRAIN_LOG(debug, "collective abandoned while an error unwinds: " << e.what());
      else
        DTRAIN_LOG(error, "collective handle dropped while its collective failed: " << e.what());
    } catch (...) {
    }
    release();
  }

  detail::Job* job_ = nullptr;
  std::shared_ptr<detail::Job> keep_;
};

}  // namespace dtrain
