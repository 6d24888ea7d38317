// dtrain: the state one Communicator shares with its plans.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/comm_config.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/progress_engine.hpp>
#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

template <class Transport>
struct CommState {
  CommState(Transport& t, CommConfig c)
      : transport(&t),
        config(c),
        engine(c.progress_thread && transport_allows_progress_thread(t), t.rank(), c.timeout_s) {}

  Transport* transport;
  CommConfig config;
  ProgressEngine engine;
  // Collectives run one at a time (issue order), so the counter needs no lock; it is atomic
  // only because the progress thread and the caller take turns.
  std::atomic<std::uint64_t> seq{0};
  CostModel cost{};
  // What `automatic` all-reduce runs per size; set together with `cost`.
  AllreduceDecisions decisions;
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
