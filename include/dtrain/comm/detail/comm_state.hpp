// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the state one Communicator shares with its plans.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/comm_config.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/progress_engine.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

/// Scratch memory shared by the plans of one communicator. Its collectives run one at a time
/// (issue order), and every algorithm writes its scratch before it reads it within one execution,
/// so all plans can work in the same block instead of each holding its own: a training step's
/// bucket plans then cost one bucket's scratch, not the whole gradient's. A plan keeps every block
/// it carved from alive (shared ownership); a plan that needs more than the current block gets a
/// new, larger one, which later plans use, and the old one is freed with the last plan using it.
/// Only for transports that need no registration of the memory (the one-sided and verbs
/// transports register each plan's scratch with the hardware: those plans keep their own).
class ScratchPool {
 public:
  using Block = std::shared_ptr<std::vector<unsigned char>>;
  /// A block of at least `bytes` (zeroed when new). Thread-safe.
  Block acquire(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!block_ || block_->size() < bytes) {
      block_ = std::make_shared<std::vector<unsigned char>>(bytes);
      ++blocks_made_;
    }
    return block_;
  }
  /// Bytes of the current block (what a new plan shares), 0 before the first plan.
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return block_ ? block_->size() : 0;
  }
  /// Blocks allocated so far (for tests and diagnostics).
  std::size_t blocks_made() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return blocks_made_;
  }

 private:
  mutable std::mutex mutex_;
  Block block_;
  std::size_t blocks_made_ = 0;
};

/// Whether a communicator over `t` with progress setting `mode` runs a progress thread (before
/// the transport's own consent): `automatic` asks progress_thread_pays with the number of ranks
/// on this rank's machine (fake nodes of DTRAIN_RANKS_PER_NODE share it). Local.
template <class Transport>
bool wants_progress_thread(CommProgress mode, Transport& t) {
  if (mode != CommProgress::automatic) return mode == CommProgress::thread;
  return progress_thread_pays(affinity_cpus(), online_cpus(),
                              node_map_of(t).machine_ranks(t.rank()));
}

template <class Transport>
struct CommState {
  CommState(Transport& t, CommConfig c)
      : transport(&t),
        config(c),
        engine(wants_progress_thread(c.progress, t) && transport_allows_progress_thread(t),
               t.rank(), c.timeout_s) {}

  Transport* transport;
  CommConfig config;
  ProgressEngine engine;
  // Collectives run one at a time (issue order), so the counter needs no lock; it is atomic
  // only because the progress thread and the caller take turns.
  std::atomic<std::uint64_t> seq{0};
  CostModel cost{};
  ScratchPool scratch_pool;
  // What `automatic` all-reduce runs per size; set together with `cost`.
  AllreduceDecisions decisions;
  // The calibration's probes, each as its size and the algorithms it measured, fastest first
  // (agreed times: the same on every rank); empty for a given or loaded model. An adaptive plan
  // checks itself against the fastest other algorithm of the probe nearest its size.
  struct MeasuredOrder {
    std::size_t bytes = 0;
    std::vector<AllreduceAlgorithm> fastest_first;
  };
  std::vector<MeasuredOrder> measured;
  std::mutex broken_mutex;
  std::string broken;  // first failure; non-empty = unusable

  // Also abandons the engine: collectives queued behind the failed one fail at once instead of
  // waiting for peers that are leaving.
  void mark_broken(const std::string& why) {
    std::lock_guard<std::mutex> lock(broken_mutex);
    if (broken.empty()) broken = why;
    engine.abandon();
  }
  void check_usable(const std::string& op) {
    std::lock_guard<std::mutex> lock(broken_mutex);
    if (!broken.empty())
      raise<RemoteError>(op, "communicator unusable after an earlier failure (" + broken + ")");
    if (engine.abandoned())
      raise<RemoteError>(op,
                         "communicator abandoned: a collective handle was dropped while an error "
                         "unwound the stack");
  }
};

}  // namespace dtrain::detail
