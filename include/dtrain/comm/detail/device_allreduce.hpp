// SPDX-License-Identifier: BSD-3-Clause
// dtrain: all-reduce(avg) of device buffers handed to a transport that takes them as they are
// (GradientSync's hand-over, transport_capabilities.hpp: device_buffers_of). A direct
// reduce-scatter then all-gather: rank r receives every rank's part r of the bucket, reduces them
// in rank order on the device with the execution policy's kernels (reduce_into, scale_avg: the
// reduction contract, the bits of the ordered all-reduce), and sends its average to every rank.
// Each rank sends and receives 2(p-1)/p of the bucket, the ring's volume, in two latency rounds.
// The host never touches the buckets: the transport moves the bytes, the policy reduces them.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/exec/exec_traits.hpp>

namespace dtrain {
namespace detail {

/// Tags of the hand-over's two rounds: above the plans' channel ids, which count up from
/// kFirstAlgorithmChannel, and below the cost-model calibration's 32767.
inline constexpr int kHandoverPartsTag = 32765;
inline constexpr int kHandoverAveragesTag = 32766;

/// Whether the hand-over reduces buffers of `dtype`: the accumulator types. 16-bit floats would
/// need an f32 accumulator on the device (the contract's one rounding); they are staged.
inline bool handover_reduces(DType dtype) noexcept {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64;
}

/// The buckets' all-reduces, with the transport type hidden from GradientSync's users.
struct DeviceBucketReducer {
  virtual ~DeviceBucketReducer() = default;
  /// Posts bucket b's first round (its parts to their owners); non-blocking.
  virtual void start(std::size_t b) = 0;
  /// Non-blocking: moves bucket b on as far as it goes without waiting (first round arrived:
  /// queue the reduction; reduction done: post the second round). Returns whether the second
  /// round is posted. Call for the started buckets in bucket order, stopping at the first that
  /// returns false, so that every rank posts the second rounds in the same order.
  virtual bool progress(std::size_t b) = 0;
  /// Completes bucket b: what is left of its first round, the reduction, the second round.
  /// Blocking, bounded by the communicator's timeout (transfers) and exec_timeout_s() (the
  /// reduction).
  virtual void finish(std::size_t b) = 0;
  /// Abandons bucket b's posted transfers (error paths). Never throws.
  virtual void cancel(std::size_t b) noexcept = 0;
};

/// Buckets of device memory of policy Exec, all-reduced(avg) over Transport, which must take
/// them as they are. Built once (receive buffers: (p-1)/p of every bucket, from the policy's
/// allocator, and one request per message); start/finish allocate nothing. Local object of one
/// rank, used by one thread; transport and policy must outlive it.
template <class Transport, class Exec>
class DeviceBucketAllreduce final : public DeviceBucketReducer {
 public:
  DeviceBucketAllreduce(Transport& t, Exec& exec, const std::vector<BufferView>& buckets,
                        double timeout_s)
      : t_(&t), exec_(&exec), buckets_(buckets), timeout_s_(timeout_s) {
    rank_ = t.rank();
    size_ = t.size();
    std::size_t total = 0;
    for (const BufferView& v : buckets_) {
      DTRAIN_REQUIRE(v.space == Exec::space && handover_reduces(v.dtype), "GradientSync hand-over",
                     "a bucket of " << name_of(v.dtype) << " in " << name_of(v.space)
                                    << " memory (the hand-over reduces f32, f64, i32 and i64 "
                                    << name_of(Exec::space) << " buckets)");
      offsets_.push_back(total);
      total += own(v) * static_cast<std::size_t>(size_ - 1);
    }
    if (!buckets_.empty() && size_ > 1)
      scratch_ = Tensor({static_cast<std::int64_t>(total)}, buckets_[0].dtype, exec.allocator());
    const std::size_t per = 2 * static_cast<std::size_t>(size_ - 1);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      requests_.emplace_back(new typename Transport::Request[per > 0 ? per : 1]);
      active_.emplace_back(per, 0);
      state_.push_back(kIdle);
      done_.emplace_back(exec);
    }
    if (size_ > 1) stream_ = ExecStream<Exec>(exec);
  }
  ~DeviceBucketAllreduce() override {
    for (std::size_t b = 0; b < buckets_.size(); ++b) cancel(b);
  }

  void start(std::size_t b) override {
    if (size_ == 1) return;
    state_[b] = kPartsPosted;
    const BufferView v = buckets_[b];
    const std::size_t m = own(v), es = size_of(v.dtype);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::size_t k = slot(q);
      if (m) post_recv(b, k, q, kHandoverPartsTag, slot_view(b, k).data, m * es);
      const std::size_t mq = partition_count(v.count, size_, q);
      if (mq)
        post_send(b, size_ - 1 + k, q, kHandoverPartsTag,
                  static_cast<char*>(v.data) + partition_begin(v.count, size_, q) * es, mq * es);
    }
  }

  bool progress(std::size_t b) override {
    if (size_ == 1) return true;
    if (state_[b] == kPartsPosted) {
      if (!arrived(b)) return false;
      reduce(b);
    }
    if (state_[b] == kReducing) {
      if (!exec_->query(done_[b].get())) return false;
      post_averages(b);
    }
    return state_[b] == kAveragesPosted;
  }

  void finish(std::size_t b) override {
    if (size_ == 1) return;  // the average of one rank is its own gradient
    if (state_[b] == kPartsPosted) {
      complete(b, "parts");
      reduce(b);
    }
    if (state_[b] == kReducing) {
      // The transport reads the average from device memory when the send is posted.
      exec_wait(*exec_, done_[b].get(), exec_timeout_s(),
                "GradientSync hand-over (a bucket's average)");
      post_averages(b);
    }
    complete(b, "averages");
    state_[b] = kIdle;
  }

  void cancel(std::size_t b) noexcept override {
    for (std::size_t i = 0; i < active_[b].size(); ++i)
      if (active_[b][i]) {
        t_->cancel(requests_[b][i]);
        active_[b][i] = 0;
      }
    state_[b] = kIdle;
  }

 private:
  enum : unsigned char { kIdle, kPartsPosted, kReducing, kAveragesPosted };

  // Every posted message of bucket b complete (checked without blocking).
  bool arrived(std::size_t b) {
    for (std::size_t i = 0; i < active_[b].size(); ++i) {
      if (!active_[b][i]) continue;
      if (!t_->test(requests_[b][i])) return false;
      active_[b][i] = 0;
    }
    return true;
  }
  // Queues the reduction of this rank's part on the hand-over's stream. Rank order, accumulator
  // first: ((x0 + x1) + x2) ... / p, whichever rank owns the part.
  void reduce(std::size_t b) {
    const BufferView v = buckets_[b];
    const std::size_t m = own(v);
    if (m) {
      Exec& e = *exec_;
      const BufferView mine = v.slice(partition_begin(v.count, size_, rank_), m);
      auto part = [&](int q) { return q == rank_ ? mine : slot_view(b, slot(q)); };
      const BufferView acc = part(0);
      for (int q = 1; q < size_; ++q) e.reduce_into(stream_.get(), ReduceOp::avg, acc, part(q));
      e.scale_avg(stream_.get(), acc, size_);
      if (acc.data != mine.data)
        e.copy_d2d(stream_.get(), mine.data, acc.data, m * size_of(v.dtype));
      e.record(done_[b].get(), stream_.get());
    }
    state_[b] = kReducing;  // a never-recorded event (empty part) counts as complete
  }
  // Posts the second round: this rank's average to every rank, the others' into the bucket.
  void post_averages(std::size_t b) {
    const BufferView v = buckets_[b];
    const std::size_t m = own(v), es = size_of(v.dtype);
    const void* mine = static_cast<char*>(v.data) + partition_begin(v.count, size_, rank_) * es;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::size_t k = slot(q), mq = partition_count(v.count, size_, q);
      if (mq)
        post_recv(b, k, q, kHandoverAveragesTag,
                  static_cast<char*>(v.data) + partition_begin(v.count, size_, q) * es, mq * es);
      if (m) post_send(b, size_ - 1 + k, q, kHandoverAveragesTag, mine, m * es);
    }
    state_[b] = kAveragesPosted;
  }
  std::size_t own(const BufferView& v) const noexcept {
    return partition_count(v.count, size_, rank_);
  }
  // Receive slot of rank q's part (every rank but this one).
  std::size_t slot(int q) const noexcept { return static_cast<std::size_t>(q < rank_ ? q : q - 1); }
  BufferView slot_view(std::size_t b, std::size_t k) const {
    const std::size_t m = own(buckets_[b]);
    return scratch_.view().slice(offsets_[b] + k * m, m);
  }
  void post_recv(std::size_t b, std::size_t i, int peer, int tag, void* data, std::size_t bytes) {
    t_->irecv(requests_[b][i], peer, tag, data, bytes);
    active_[b][i] = 1;
  }
  void post_send(std::size_t b, std::size_t i, int peer, int tag, const void* data,
                 std::size_t bytes) {
    t_->isend(requests_[b][i], peer, tag, data, bytes);
    active_[b][i] = 1;
  }
  // Waits for every posted message of bucket b; on a timeout abandons the rest and says which
  // peer and round.
  void complete(std::size_t b, const char* round) {
    const Deadline deadline(timeout_s_);
    for (std::size_t i = 0; i < active_[b].size(); ++i) {
      if (!active_[b][i]) continue;
      if (!t_->wait_until(requests_[b][i], deadline)) {
        cancel(b);
        const std::size_t k = i % static_cast<std::size_t>(size_ - 1);
        const int peer =
            static_cast<int>(k) < rank_ ? static_cast<int>(k) : static_cast<int>(k) + 1;
        raise<TimeoutError>(
            "GradientSync hand-over",
            concat("bucket ", b, " (", buckets_[b].bytes(), " B), ", round,
                   " round: ", i < static_cast<std::size_t>(size_ - 1) ? "receive from" : "send to",
                   " rank ", peer, " timed out after ", timeout_s_, " s"));
      }
      active_[b][i] = 0;
    }
  }

  Transport* t_;
  Exec* exec_;
  std::vector<BufferView> buckets_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  std::vector<std::size_t> offsets_;  // each bucket's receive slots in scratch_
  Tensor scratch_;
  std::vector<std::unique_ptr<typename Transport::Request[]>> requests_;
  std::vector<std::vector<unsigned char>> active_;
  std::vector<unsigned char> state_;  // per bucket, kIdle ... kAveragesPosted
  std::vector<ExecEvent<Exec>> done_;
  ExecStream<Exec> stream_;
};

}  // namespace detail
}  // namespace dtrain
