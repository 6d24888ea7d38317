// SPDX-License-Identifier: BSD-3-Clause
// dtrain: reduce-scatters(avg) and all-gathers of device buffers handed to a transport that takes
// them as they are (transport_capabilities.hpp: device_buffers_of): GradientSync's buckets (an
// all-reduce is the reduce-scatter then the all-gather of the averages; sharded steps gather the
// updated parameters instead) and FullyShardedSync's units. Direct: in the reduce-scatter rank r
// receives every rank's part r, reduces them in rank order on the device with the execution
// policy's kernels (reduce_into, scale_avg, and convert for 16-bit floats: widened once, summed
// in f32, rounded once; the reduction contract, the bits of the ordered all-reduce); in the
// all-gather it sends its part to every rank. Each rank sends and receives (p-1)/p of the buffer
// per round, the ring's volume, in one latency round. The host never touches the buffers: the
// transport moves the bytes, the policy reduces and copies them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
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
/// kFirstAlgorithmChannel, and below the cost-model calibration's 32767. Reduce-scatters use the
/// first, all-gathers the second; each is posted in the same order on every rank.
inline constexpr int kHandoverPartsTag = 32765;
inline constexpr int kHandoverAveragesTag = 32766;

inline bool is_16bit_dtype(DType dtype) noexcept {
  return dtype == DType::f16 || dtype == DType::bf16;
}

/// Whether the hand-over reduces buffers of `dtype` with any policy: the accumulator types.
inline bool handover_reduces(DType dtype) noexcept { return !is_16bit_dtype(dtype); }
/// Whether it reduces them with policy Exec: also the 16-bit floats where Exec converts them to
/// an f32 accumulator (exec_converts_v).
template <class Exec>
bool handover_reduces_on(DType dtype) noexcept {
  return handover_reduces(dtype) || exec_converts_v<Exec>;
}
/// Why the hand-over does not reduce `dtype` (for the log line of the staging it falls back to).
inline std::string handover_refusal(DType dtype) {
  return std::string(name_of(dtype)) +
         " needs an f32 accumulator and the execution policy has no convert()";
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

/// What the log and errors of a hand-over call things.
struct HandoverNames {
  const char* operation;  // "GradientSync hand-over"
  const char* item;       // "bucket", "unit"
  const char* scatter;    // the reduce-scatter round: "parts"
  const char* gather;     // the all-gather round: "averages"
};

/// The reduce-scatters and all-gathers of a list of operations (buckets, units) over a
/// transport that takes device memory of policy Exec; the transport type hidden. Operation i has
/// a whole buffer to reduce-scatter (`scatter_in`, may be empty) and a part to all-gather into a
/// whole buffer (`gather_part` into `gather_whole`, may be empty), fixed at construction
/// (set_gather changes the latter). Every rank must post the same operations' rounds in the same
/// order. As a DeviceBucketReducer, operation b is a bucket all-reduced in place: start(b) posts
/// its reduce-scatter into this rank's part of the bucket, progress and finish its all-gather
/// from there. Local object of one rank, used by one thread.
template <class Exec>
struct DeviceExchange : DeviceBucketReducer {
  using event_type = typename Exec::event_type;
  using stream_type = typename Exec::stream_type;
  /// Posts operation i's reduce-scatter: this rank's part of every rank's scatter_in to this
  /// rank, averaged into `out` (this rank's part of scatter_in itself, or another buffer of the
  /// part's count and type). Non-blocking, but waits (on the event) for the reduction that last
  /// read the receive slots it reuses. scatter_in is read from device memory until it completes.
  virtual void start_scatter(std::size_t i, BufferView out) = 0;
  /// Non-blocking: queues the reduction once the parts have arrived; true once it is queued.
  virtual bool scatter_progress(std::size_t i) = 0;
  /// Blocking (the communicator's deadline): completes the parts' transfers and queues the
  /// reduction. Later device work that reads `out` waits for reduced_event(i).
  virtual void finish_scatter(std::size_t i) = 0;
  /// Recorded behind operation i's last queued reduction (a never-recorded event is complete).
  virtual event_type reduced_event(std::size_t i) const = 0;
  /// Posts operation i's all-gather: gather_part to every rank, theirs into gather_whole (this
  /// rank's part copied on the device where it lies elsewhere). The part must be final in device
  /// memory (the transport reads it when the send is posted): after a reduce-scatter of the same
  /// operation it waits for its reduction. Non-blocking otherwise.
  virtual void start_gather(std::size_t i) = 0;
  /// Blocking: completes the all-gather's transfers; work queued on `order` afterwards sees the
  /// whole buffer.
  virtual void finish_gather(std::size_t i, stream_type order) = 0;
  /// Changes operation i's all-gather (sharded steps gather the parameters, not the averages).
  virtual void set_gather(std::size_t i, BufferView part, BufferView whole) = 0;
  /// Blocking all-gather of this rank's `part` (at `whole`'s part of this rank) into `whole`,
  /// outside the operations (between steps: optimizer state).
  virtual void allgather(BufferView part, BufferView whole) = 0;
  /// Abandons operation i's posted transfers (error paths). Never throws.
  virtual void cancel(std::size_t i) noexcept = 0;
  /// Whether operation i has transfers posted and not completed.
  virtual bool active(std::size_t i) const noexcept = 0;
  /// Device bytes of the receive slots and the 16-bit accumulator.
  virtual std::size_t scratch_bytes() const noexcept = 0;
};

/// One operation of a DeviceParts: `lane` names receive slots shared by operations whose
/// reduce-scatters never run at the same time (a unit's gradient buffer); each lane holds p-1
/// parts of its largest operation.
struct DevicePartsOp {
  BufferView scatter_in;
  BufferView gather_part, gather_whole;
  std::size_t lane = 0;
};

/// DeviceExchange over Transport. Built once (receive slots, one request per message, the
/// events, the 16-bit accumulator); the rounds allocate nothing. Transport and policy must
/// outlive it.
template <class Transport, class Exec>
class DeviceParts final : public DeviceExchange<Exec> {
 public:
  using event_type = typename Exec::event_type;
  using stream_type = typename Exec::stream_type;

  DeviceParts(Transport& t, Exec& exec, std::vector<DevicePartsOp> ops, double timeout_s,
              HandoverNames names)
      : t_(&t), exec_(&exec), ops_(std::move(ops)), timeout_s_(timeout_s), names_(names) {
    rank_ = t.rank();
    size_ = t.size();
    const auto peers = static_cast<std::size_t>(size_ - 1);
    std::size_t lanes = 0, widest = 0;
    for (const DevicePartsOp& op : ops_) {
      for (const BufferView& v : {op.scatter_in, op.gather_part, op.gather_whole})
        DTRAIN_REQUIRE(
            v.count == 0 || (v.space == Exec::space && handover_reduces_on<Exec>(v.dtype)),
            names_.operation,
            "a buffer of " << name_of(v.dtype) << " in " << name_of(v.space)
                           << " memory (the hand-over takes " << name_of(Exec::space)
                           << " memory it can reduce)");
      lanes = std::max(lanes, op.lane + 1);
    }
    lane_parts_.assign(lanes, 0);
    lane_type_.assign(lanes, DType::f32);
    for (const DevicePartsOp& op : ops_) {
      const std::size_t m = own(op.scatter_in);
      if (op.scatter_in.count) lane_type_[op.lane] = op.scatter_in.dtype;
      lane_parts_[op.lane] = std::max(lane_parts_[op.lane], m);
      if (is_16bit_dtype(op.scatter_in.dtype)) widest = std::max(widest, m);
    }
    if (size_ > 1) {
      for (std::size_t l = 0; l < lanes; ++l)
        slots_.emplace_back(
            Tensor({static_cast<std::int64_t>(std::max<std::size_t>(lane_parts_[l] * peers, 1))},
                   lane_type_[l], exec.allocator()));
      if (widest)
        accumulator_ = Tensor({static_cast<std::int64_t>(widest)}, DType::f32, exec.allocator());
      stream_ = ExecStream<Exec>(exec);
    }
    lane_last_.assign(lanes, npos);
    const std::size_t per = 4 * peers;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      requests_.emplace_back(new typename Transport::Request[per > 0 ? per : 1]);
      active_.emplace_back(per, 0);
      scatter_.push_back(kIdle);
      gathering_.push_back(0);
      out_.emplace_back();
      done_.emplace_back(exec);
      copied_.emplace_back(exec);
      copy_queued_.push_back(0);
    }
    once_.reset(new typename Transport::Request[2 * peers > 0 ? 2 * peers : 1]);
    once_active_.assign(2 * peers, 0);
  }
  /// GradientSync's buckets, each all-reduced in place (its own receive slots).
  DeviceParts(Transport& t, Exec& exec, const std::vector<BufferView>& buckets, double timeout_s)
      : DeviceParts(t, exec, bucket_ops(buckets, t.rank(), t.size()), timeout_s,
                    HandoverNames{"GradientSync hand-over", "bucket", "parts", "averages"}) {}
  ~DeviceParts() override {
    for (std::size_t i = 0; i < ops_.size(); ++i) cancel(i);
  }

  void start_scatter(std::size_t i, BufferView out) override {
    const BufferView v = ops_[i].scatter_in;
    const std::size_t m = own(v), es = size_of(v.dtype);
    DTRAIN_REQUIRE(out.count == m && out.dtype == v.dtype && out.space == v.space, names_.operation,
                   names_.item << " " << i << ": the average of " << m << " x " << name_of(v.dtype)
                               << " goes to " << out.count << " x " << name_of(out.dtype));
    out_[i] = out;
    if (size_ == 1) {
      // The average of one rank is its own part.
      if (out.data != v.data && m) {
        exec_->copy_d2d(stream_or_compute(), out.data, v.data, m * es);
        exec_->record(done_[i].get(), stream_or_compute());
      }
      scatter_[i] = kReduced;
      return;
    }
    // The receive slots of the lane are free once the reduction that read them last has run.
    const std::size_t lane = ops_[i].lane;
    if (lane_last_[lane] != npos)
      exec_wait(*exec_, done_[lane_last_[lane]].get(), exec_timeout_s(), names_.operation);
    lane_last_[lane] = i;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::size_t k = slot(q);
      if (m) post(i, k, q, kHandoverPartsTag, slot_view(i, k).data, m * es, false);
      const std::size_t mq = partition_count(v.count, size_, q);
      if (mq)
        post(i, peers() + k, q, kHandoverPartsTag,
             static_cast<char*>(v.data) + partition_begin(v.count, size_, q) * es, mq * es, true);
    }
    scatter_[i] = kPartsPosted;
  }

  bool scatter_progress(std::size_t i) override {
    if (scatter_[i] == kPartsPosted) {
      if (!arrived(i, 0)) return false;
      reduce(i);
    }
    return scatter_[i] != kPartsPosted;
  }

  void finish_scatter(std::size_t i) override {
    if (scatter_[i] != kPartsPosted) return;
    complete(i, 0, names_.scatter);
    reduce(i);
  }

  event_type reduced_event(std::size_t i) const override { return done_[i].get(); }

  void start_gather(std::size_t i) override {
    const DevicePartsOp& op = ops_[i];
    if (scatter_[i] == kReduced && out_[i].data == op.gather_part.data && size_ > 1) {
      // The part to send is the reduction's average: the transport reads it from device memory
      // when the send is posted.
      exec_wait(*exec_, done_[i].get(), exec_timeout_s(), names_.operation);
    }
    const BufferView whole = op.gather_whole;
    const std::size_t es = size_of(whole.dtype);
    char* own_at = static_cast<char*>(whole.data) + partition_begin(whole.count, size_, rank_) * es;
    copy_queued_[i] = 0;
    if (op.gather_part.count && op.gather_part.data != own_at) {
      exec_->copy_d2d(stream_or_compute(), own_at, op.gather_part.data, op.gather_part.bytes());
      exec_->record(copied_[i].get(), stream_or_compute());
      copy_queued_[i] = 1;
    }
    post_gather(requests_[i].get() + 2 * peers(), active_[i].data() + 2 * peers(), op.gather_part,
                whole);
    gathering_[i] = 1;
  }

  void finish_gather(std::size_t i, stream_type order) override {
    if (!gathering_[i]) return;
    complete(i, 2, names_.gather);
    if (copy_queued_[i]) exec_->stream_wait(order, copied_[i].get());
    gathering_[i] = 0;
  }

  void start(std::size_t i) override {
    const BufferView v = ops_[i].scatter_in;
    start_scatter(i, v.slice(partition_begin(v.count, size_, rank_), own(v)));
  }

  bool progress(std::size_t i) override {
    if (size_ == 1 || gathering_[i]) return true;
    if (!scatter_progress(i) || !exec_->query(done_[i].get())) return false;
    start_gather(i);
    return true;
  }

  void finish(std::size_t i) override {
    if (size_ == 1) return;
    finish_scatter(i);
    if (!gathering_[i]) start_gather(i);
    finish_gather(i, exec_->compute_stream());
  }

  void set_gather(std::size_t i, BufferView part, BufferView whole) override {
    DTRAIN_REQUIRE(!gathering_[i], names_.operation,
                   names_.item << " " << i << ": its all-gather is running");
    DTRAIN_REQUIRE((part.count == 0 || part.space == Exec::space) &&
                       part.count == partition_count(whole.count, size_, rank_),
                   names_.operation,
                   names_.item << " " << i << ": a part of " << part.count << " for a whole of "
                               << whole.count);
    ops_[i].gather_part = part;
    ops_[i].gather_whole = whole;
  }

  void allgather(BufferView part, BufferView whole) override {
    DTRAIN_REQUIRE(
        part.count == partition_count(whole.count, size_, rank_) && part.dtype == whole.dtype &&
            whole.space == Exec::space && part.space == Exec::space,
        names_.operation,
        "all-gather of " << part.count << " x " << name_of(part.dtype) << " in "
                         << name_of(part.space) << " memory into " << whole.count << " x "
                         << name_of(whole.dtype) << " in " << name_of(whole.space) << " memory");
    const std::size_t es = size_of(whole.dtype);
    char* own_at = static_cast<char*>(whole.data) + partition_begin(whole.count, size_, rank_) * es;
    if (part.count && part.data != own_at) {
      exec_->copy_d2d(stream_or_compute(), own_at, part.data, part.bytes());
      exec_synchronize(*exec_, stream_or_compute(), exec_timeout_s(), names_.operation);
    }
    if (size_ == 1) return;
    post_gather(once_.get(), once_active_.data(), part, whole);
    const Deadline deadline(timeout_s_);
    for (std::size_t j = 0; j < once_active_.size(); ++j) {
      if (!once_active_[j]) continue;
      if (!t_->wait_until(once_[j], deadline)) {
        for (std::size_t k = 0; k < once_active_.size(); ++k) {
          if (once_active_[k]) t_->cancel(once_[k]);
          once_active_[k] = 0;
        }
        raise<TimeoutError>(names_.operation,
                            concat("all-gather of ", whole.bytes(),
                                   " B: ", j < peers() ? "receive from" : "send to", " rank ",
                                   peer_of(j % peers()), " timed out after ", timeout_s_, " s"));
      }
      once_active_[j] = 0;
    }
  }

  void cancel(std::size_t i) noexcept override {
    for (std::size_t j = 0; j < active_[i].size(); ++j)
      if (active_[i][j]) {
        t_->cancel(requests_[i][j]);
        active_[i][j] = 0;
      }
    scatter_[i] = kIdle;
    gathering_[i] = 0;
  }

  bool active(std::size_t i) const noexcept override {
    return scatter_[i] == kPartsPosted || gathering_[i];
  }

  std::size_t scratch_bytes() const noexcept override {
    std::size_t b = accumulator_.bytes();
    for (const Tensor& s : slots_) b += s.bytes();
    return b;
  }

 private:
  // An operation's reduce-scatter and all-gather run independently (a fully sharded unit's
  // gather for the next pass may start while its gradients are still being reduced).
  enum : unsigned char { kIdle, kPartsPosted, kReduced };
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  static std::vector<DevicePartsOp> bucket_ops(const std::vector<BufferView>& buckets, int rank,
                                               int size) {
    std::vector<DevicePartsOp> ops;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const BufferView v = buckets[b];
      ops.push_back(
          {v, v.slice(partition_begin(v.count, size, rank), partition_count(v.count, size, rank)),
           v, b});
    }
    return ops;
  }
  std::size_t peers() const noexcept { return static_cast<std::size_t>(size_ - 1); }
  std::size_t own(const BufferView& v) const noexcept {
    return partition_count(v.count, size_, rank_);
  }
  // Receive slot of rank q's part (every rank but this one), and its rank.
  std::size_t slot(int q) const noexcept { return static_cast<std::size_t>(q < rank_ ? q : q - 1); }
  int peer_of(std::size_t k) const noexcept {
    return static_cast<int>(k) < rank_ ? static_cast<int>(k) : static_cast<int>(k) + 1;
  }
  BufferView slot_view(std::size_t i, std::size_t k) const {
    const std::size_t m = own(ops_[i].scatter_in);
    const std::size_t stride = lane_parts_[ops_[i].lane];
    return slots_[ops_[i].lane].view().slice(k * stride, m);
  }
  stream_type stream_or_compute() { return size_ > 1 ? stream_.get() : exec_->compute_stream(); }

  // Every posted message of operation i's round (0: reduce-scatter, 2: all-gather) complete,
  // checked without blocking.
  bool arrived(std::size_t i, std::size_t round) {
    const std::size_t first = round * peers(), last = first + 2 * peers();
    for (std::size_t j = first; j < last; ++j) {
      if (!active_[i][j]) continue;
      if (!t_->test(requests_[i][j])) return false;
      active_[i][j] = 0;
    }
    return true;
  }
  // Queues the reduction of this rank's part on the hand-over's stream. Rank order, accumulator
  // first: ((x0 + x1) + x2) ... / p, whichever rank owns the part; 16-bit floats widened into
  // the f32 accumulator, divided there and rounded once.
  void reduce(std::size_t i) {
    const BufferView v = ops_[i].scatter_in, out = out_[i];
    const std::size_t m = own(v);
    if (m) {
      Exec& e = *exec_;
      const auto s = stream_.get();
      const BufferView mine = v.slice(partition_begin(v.count, size_, rank_), m);
      auto part = [&](int q) { return q == rank_ ? mine : slot_view(i, slot(q)); };
      if (is_16bit_dtype(v.dtype)) {
        if constexpr (exec_converts_v<Exec>) {
          const BufferView acc = accumulator_.view().slice(0, m);
          e.convert(s, acc, part(0));
          for (int q = 1; q < size_; ++q) e.reduce_into(s, ReduceOp::avg, acc, part(q));
          e.scale_avg(s, acc, size_);
          e.convert(s, out, acc);
        }
      } else {
        const BufferView acc = part(0);
        for (int q = 1; q < size_; ++q) e.reduce_into(s, ReduceOp::avg, acc, part(q));
        e.scale_avg(s, acc, size_);
        if (acc.data != out.data) e.copy_d2d(s, out.data, acc.data, m * size_of(v.dtype));
      }
      e.record(done_[i].get(), s);
    }
    scatter_[i] = kReduced;  // a never-recorded event (empty part) counts as complete
  }
  // Posts an all-gather's messages: `part` to every rank, theirs into `whole`; reqs/act hold
  // 2(p-1) requests (receives first).
  void post_gather(typename Transport::Request* reqs, unsigned char* act, BufferView part,
                   BufferView whole) {
    const std::size_t es = size_of(whole.dtype);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::size_t k = slot(q), mq = partition_count(whole.count, size_, q);
      if (mq) {
        t_->irecv(reqs[k], q, kHandoverAveragesTag,
                  static_cast<char*>(whole.data) + partition_begin(whole.count, size_, q) * es,
                  mq * es);
        act[k] = 1;
      }
      if (part.count) {
        t_->isend(reqs[peers() + k], q, kHandoverAveragesTag, part.data, part.bytes());
        act[peers() + k] = 1;
      }
    }
  }
  void post(std::size_t i, std::size_t j, int peer, int tag, void* data, std::size_t bytes,
            bool send) {
    if (send)
      t_->isend(requests_[i][j], peer, tag, data, bytes);
    else
      t_->irecv(requests_[i][j], peer, tag, data, bytes);
    active_[i][j] = 1;
  }
  // Waits for every posted message of operation i's round (0 or 2, as arrived); on a timeout
  // abandons the rest and says which peer and round.
  void complete(std::size_t i, std::size_t round, const char* name) {
    const Deadline deadline(timeout_s_);
    const std::size_t first = round * peers(), last = first + 2 * peers();
    for (std::size_t j = first; j < last; ++j) {
      if (!active_[i][j]) continue;
      if (!t_->wait_until(requests_[i][j], deadline)) {
        cancel(i);
        const std::size_t k = (j - first) % peers();
        const BufferView whole = round == 0 ? ops_[i].scatter_in : ops_[i].gather_whole;
        raise<TimeoutError>(names_.operation,
                            concat(names_.item, " ", i, " (", whole.bytes(), " B), ", name,
                                   " round: ", j - first < peers() ? "receive from" : "send to",
                                   " rank ", peer_of(k), " timed out after ", timeout_s_, " s"));
      }
      active_[i][j] = 0;
    }
  }

  Transport* t_;
  Exec* exec_;
  std::vector<DevicePartsOp> ops_;
  double timeout_s_;
  HandoverNames names_;
  int rank_ = 0, size_ = 1;
  std::vector<std::size_t> lane_parts_;  // elements of each lane's slot (its largest part)
  std::vector<DType> lane_type_;
  std::vector<std::size_t> lane_last_;  // the operation whose reduction read the lane last
  std::vector<Tensor> slots_;           // per lane: p-1 receive slots
  Tensor accumulator_;                  // f32, the largest 16-bit part
  std::vector<std::unique_ptr<typename Transport::Request[]>> requests_;
  // Per operation: reduce-scatter receives, sends, all-gather receives, sends (p-1 each).
  std::vector<std::vector<unsigned char>> active_;
  std::vector<unsigned char> scatter_;    // kIdle, kPartsPosted or kReduced
  std::vector<unsigned char> gathering_;  // the all-gather is posted
  std::vector<BufferView> out_;           // the running reduce-scatter's destination
  std::vector<ExecEvent<Exec>> done_, copied_;
  std::vector<unsigned char> copy_queued_;
  std::unique_ptr<typename Transport::Request[]> once_;  // allgather()
  std::vector<unsigned char> once_active_;
  ExecStream<Exec> stream_;
};

/// GradientSync's hand-over of its buckets.
template <class Transport, class Exec>
using DeviceBucketAllreduce = DeviceParts<Transport, Exec>;

}  // namespace detail
}  // namespace dtrain
