// Checkpoint tests: a minimal communicator over threads (N ranks in one process) that provides
// exactly the members the Checkpointer relies on, and a runner for N-rank test bodies.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::test {

class ThreadWorld {
 public:
  explicit ThreadWorld(int n) : n_(n), slots_(static_cast<std::size_t>(n), nullptr) {}
  int size() const { return n_; }

  // Generation barrier with a deadline, so a broken test fails instead of hanging.
  void barrier(int rank, double timeout_s = 60) {
    std::unique_lock<std::mutex> lock(m_);
    if (failed_) raise<RemoteError>("test barrier", "another rank failed");
    const std::uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return gen_ != gen || failed_; }))
      raise<TimeoutError>("test barrier", "rank " + std::to_string(rank) + " timed out");
    if (gen_ == gen) raise<RemoteError>("test barrier", "another rank failed");
  }
  void fail() {
    std::lock_guard<std::mutex> lock(m_);
    failed_ = true;
    cv_.notify_all();
  }
  void*& slot(int r) { return slots_[static_cast<std::size_t>(r)]; }

 private:
  int n_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t gen_ = 0;
  bool failed_ = false;
  std::vector<void*> slots_;
};

/// The communicator contract of the Checkpointer, over threads.
class ThreadComm {
 public:
  ThreadComm(ThreadWorld& w, int rank) : w_(&w), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const { return w_->size(); }
  void barrier() { w_->barrier(rank_); }

  void broadcast(BufferView buf, int root) {
    ++broadcasts;
    w_->slot(rank_) = buf.data;
    w_->barrier(rank_);
    if (rank_ != root && buf.bytes()) std::memcpy(buf.data, w_->slot(root), buf.bytes());
    w_->barrier(rank_);
  }

  void allreduce(BufferView buf, ReduceOp op) {
    w_->slot(rank_) = buf.data;
    w_->barrier(rank_);
    std::vector<unsigned char> out(buf.bytes());
    switch (buf.dtype) {
      case DType::i64: reduce<std::int64_t>(buf, op, out.data()); break;
      case DType::i32: reduce<std::int32_t>(buf, op, out.data()); break;
      case DType::f64: reduce<double>(buf, op, out.data()); break;
      case DType::f32: reduce<float>(buf, op, out.data()); break;
      default: raise<InvalidArgument>("test allreduce", "dtype not supported by the test comm");
    }
    w_->barrier(rank_);
    if (!out.empty()) std::memcpy(buf.data, out.data(), out.size());
  }

  long broadcasts = 0;

 private:
  template <class T>
  void reduce(BufferView buf, ReduceOp op, unsigned char* out) {
    const int n = size();
    for (std::size_t i = 0; i < buf.count; ++i) {
      T acc = static_cast<const T*>(w_->slot(0))[i];
      for (int r = 1; r < n; ++r) {
        const T x = static_cast<const T*>(w_->slot(r))[i];
        switch (op) {
          case ReduceOp::sum:
          case ReduceOp::avg: acc = acc + x; break;
          case ReduceOp::min: acc = std::min(acc, x); break;
          case ReduceOp::max: acc = std::max(acc, x); break;
          case ReduceOp::prod: acc = acc * x; break;
        }
      }
      if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(n));
      std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
    }
  }
  ThreadWorld* w_;
  int rank_;
};

/// Runs body(comm) on n threads, one rank each; rethrows the first exception.
inline void run_ranks(int n, const std::function<void(ThreadComm&)>& body) {
  ThreadWorld world(n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      detail::RankScope scope(r);
      ThreadComm comm(world, r);
      try {
        body(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        world.fail();
      }
    });
  for (auto& t : threads) t.join();
  // Prefer a rank's own error over the "another rank failed" it caused elsewhere.
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const RemoteError&) {
    } catch (...) {
      throw;
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dtrain::test
