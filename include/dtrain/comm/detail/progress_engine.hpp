// SPDX-License-Identifier: BSD-3-Clause
// dtrain: how non-blocking collectives make progress.
//
// Each communicator owns one ProgressEngine. With a progress thread (the default when the
// transport allows one: loopback always, MPI at MPI_THREAD_MULTIPLE), a started collective is
// queued and a dedicated thread runs the whole algorithm while the caller computes. Cost: one
// thread per communicator, asleep on a condition variable while nothing is queued; while a
// collective runs it competes for a core with the caller, so the thread marks itself as a
// progress thread (detail::wait_history()): its waits spin for at most kProgressSpinSeconds,
// then shared-segment waits block in the kernel and message waits poll with sleeps as soon as a
// yield shows the core contended (detail/backoff.hpp). Each start/finish costs a
// condition-variable hand-off (a few microseconds), which is why blocking calls with nothing
// queued run inline on the caller's thread instead.
// Without a progress thread (MPI below MPI_THREAD_MULTIPLE, CommConfig::progress `caller`, or
// `automatic` on a rank without a core to spare), a started collective runs, in issue order,
// inside the first test() or wait() that needs it: no concurrent overlap, but correct, and no
// second thread competing for the rank's only core.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include <dtrain/comm/detail/backoff.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// Whether a rank has a core to spare for a progress thread (CommProgress::automatic): its CPUs
/// per rank are at least 2. A rank whose affinity mask is narrower than the machine was bound to
/// its own CPUs by the launcher (srun --cpus-per-task, mpiexec -bind-to) and has them all;
/// otherwise the `ranks_on_node` ranks share the machine's `online_cpus`. Local, pure.
inline bool progress_thread_pays(int affinity_cpus, int online_cpus, int ranks_on_node) noexcept {
  if (affinity_cpus <= 0) affinity_cpus = online_cpus;
  if (online_cpus <= 0) online_cpus = affinity_cpus;
  if (affinity_cpus <= 0) return true;  // nothing known: the thread, as before
  if (affinity_cpus < online_cpus) return affinity_cpus >= 2;
  return online_cpus >= 2 * (ranks_on_node > 1 ? ranks_on_node : 1);
}

/// The CPUs this process may run on (sched_getaffinity) and the machine's online CPUs; 0 where
/// unknown. Local.
inline int affinity_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
}
inline int online_cpus() noexcept {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 0;
}

class ProgressEngine;

/// One unit of collective work (a planned collective). Status moves idle -> queued -> running
/// -> done; a failure is stored and rethrown by the waiter.
class Job {
 public:
  enum Status : int { idle = 0, queued = 1, running = 2, done = 3 };
  virtual ~Job() = default;
  /// Runs the collective to completion on the calling thread (throws on failure).
  virtual void run() = 0;
  /// "allreduce #12 (ring, 4096 B)" for messages about this job.
  virtual std::string label() const = 0;

  std::atomic<int> status{idle};
  std::exception_ptr error;
  std::uint64_t ticket = 0;  // position in the engine's queue order
  ProgressEngine* engine = nullptr;
};

class ProgressEngine {
 public:
  static constexpr std::size_t capacity = 1024;

  ProgressEngine(bool threaded, int rank, double timeout_s)
      : threaded_(threaded), rank_(rank), timeout_s_(timeout_s) {}
  ~ProgressEngine() { stop(); }
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  bool threaded() const noexcept { return threaded_; }
  /// Local, thread-safe, permanent. Abandons this engine's collectives: every wait bounded by a
  /// deadline that watches abandon_flag() (all waits of the plans) ends at once, and a collective
  /// not yet started fails at its start. Called when a collective fails and when a handle or
  /// plan is dropped while an error unwinds the stack, so that no one waits out a deadline for
  /// work nobody needs any more.
  void abandon() noexcept { abandon_.store(true, std::memory_order_release); }
  bool abandoned() const noexcept { return abandon_.load(std::memory_order_acquire); }
  const std::atomic<bool>& abandon_flag() const noexcept { return abandon_; }
  void set_timeout(double s) noexcept { timeout_s_ = s; }
  /// True when nothing is queued or running (a blocking collective may then run inline).
  bool idle() const noexcept { return outstanding_.load(std::memory_order_acquire) == 0; }

  /// Queues `j` (user thread). Blocks while the queue is full. Never allocates.
  void submit(Job& j) {
    DTRAIN_REQUIRE(j.status.load() != Job::queued && j.status.load() != Job::running, j.label(),
                   "started again before the previous start completed");
    j.error = nullptr;
    j.engine = this;
    std::unique_lock<std::mutex> lock(mutex_);
    cv_space_.wait(lock, [&] { return tail_ - head_ < capacity; });
    j.ticket = tail_;
    j.status.store(Job::queued, std::memory_order_release);
    ring_[tail_ % capacity] = &j;
    ++tail_;
    outstanding_.fetch_add(1, std::memory_order_acq_rel);
    if (threaded_) {
      if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
      cv_work_.notify_one();
    }
  }

  /// Non-blocking completion check; without a progress thread it runs the queue up to `j`.
  bool test(Job& j) {
    if (!threaded_) run_until(j);
    if (j.status.load(std::memory_order_acquire) != Job::done) return false;
    rethrow(j);
    return true;
  }

  /// Blocks until `j` completes and rethrows its failure. Each queued collective bounds its own
  /// waits by the communicator's deadline, so this wait is bounded by (jobs ahead + 1) of them.
  void wait(Job& j) {
    if (!threaded_) {
      run_until(j);
    } else if (j.status.load(std::memory_order_acquire) != Job::done) {
      std::unique_lock<std::mutex> lock(mutex_);
      const std::uint64_t ahead = j.ticket >= done_count_ ? j.ticket - done_count_ : 0;
      // Polled (checked every 0.5 s at most): if this process is stopped, the collectives'
      // own deadlines move back by the lost time, and so must this outer bound.
      const Deadline deadline = Deadline::polled(timeout_s_ * static_cast<double>(ahead + 1) + 1.0);
      while (j.status.load(std::memory_order_acquire) != Job::done) {
        const double left = deadline.remaining();
        if (left <= 0)
          raise<TimeoutError>(j.label(), concat("not complete after ", deadline.budget(),
                                                " s on the progress thread"));
        cv_done_.wait_for(lock, std::chrono::duration<double>(left < 0.5 ? left : 0.5));
      }
    }
    rethrow(j);
  }

  /// Waits for everything queued (never throws; failures stay with their jobs).
  void drain() noexcept {
    if (!threaded_) {
      for (;;) {
        Job* j = nullptr;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (head_ == tail_) return;
          j = ring_[(tail_ - 1) % capacity];
        }
        run_until(*j);
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    cv_done_.wait(lock, [&] { return head_ == tail_ && !running_; });
  }

 private:
  static void rethrow(Job& j) {
    if (j.error) {
      auto e = j.error;
      j.error = nullptr;
      std::rethrow_exception(e);
    }
  }

  static void execute(Job& j) noexcept {
    j.status.store(Job::running, std::memory_order_release);
    try {
      j.run();
    } catch (...) {
      j.error = std::current_exception();
    }
  }

  // Caller-driven progress: runs queued jobs in issue order until `target` has run.
  void run_until(Job& target) {
    while (target.status.load(std::memory_order_acquire) == Job::queued) {
      Job* j = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (head_ == tail_) break;
        j = ring_[head_ % capacity];
      }
      execute(*j);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++head_;
        ++done_count_;
        j->status.store(Job::done, std::memory_order_release);
        outstanding_.fetch_sub(1, std::memory_order_acq_rel);
      }
      cv_space_.notify_all();
    }
  }

  void worker_loop() {
    RankScope scope(rank_);
    wait_history().progress_thread = true;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_work_.wait(lock, [&] { return stop_ || head_ != tail_; });
      if (head_ == tail_ && stop_) return;
      Job* j = ring_[head_ % capacity];
      running_ = true;
      lock.unlock();
      execute(*j);
      lock.lock();
      ++head_;
      ++done_count_;
      running_ = false;
      j->status.store(Job::done, std::memory_order_release);
      outstanding_.fetch_sub(1, std::memory_order_acq_rel);
      cv_done_.notify_all();
      cv_space_.notify_all();
    }
  }

  void stop() noexcept {
    drain();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_work_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  const bool threaded_;
  const int rank_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable cv_work_, cv_done_, cv_space_;
  Job* ring_[capacity] = {};
  std::uint64_t head_ = 0, tail_ = 0, done_count_ = 0;
  bool running_ = false;
  bool stop_ = false;
  std::atomic<int> outstanding_{0};
  std::atomic<bool> abandon_{false};
  std::thread worker_;
};

}  // namespace dtrain::detail
