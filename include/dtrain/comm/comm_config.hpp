// SPDX-License-Identifier: BSD-3-Clause
// dtrain: settings of a Communicator, with environment overrides.
#pragma once

#include <cstddef>
#include <string>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/core/env.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {

/// Who runs a communicator's non-blocking collectives (CommConfig::progress).
enum class CommProgress {
  /// `thread` where this rank has a core to spare, `caller` otherwise (detail::progress_thread_pays
  /// in <dtrain/comm/detail/progress_engine.hpp>).
  automatic,
  /// A progress thread per communicator runs them while the caller computes (where the transport
  /// allows one: loopback always, MPI at MPI_THREAD_MULTIPLE; otherwise `caller`).
  thread,
  /// They run on the caller's thread, in issue order, inside test() / wait().
  caller
};

/// Settings of one Communicator. Plain value type; every rank must use the same values (a
/// mismatch in algorithm choice is caught by the collective fingerprints).
struct CommConfig {
  /// Deadline of every blocking wait, in seconds (DTRAIN_COMM_TIMEOUT_S).
  double timeout_s = 300;
  /// Pipelining unit of the segmented algorithms (DTRAIN_COMM_SEGMENT_BYTES). Tests shrink it so
  /// multi-segment paths run on small inputs.
  std::size_t segment_bytes = 256 * 1024;
  /// Exchange call fingerprints before each collective (DTRAIN_COMM_CHECK, boolean).
  bool check_fingerprints = true;
  /// Who runs non-blocking collectives (DTRAIN_COMM_PROGRESS=auto|thread|caller). A progress
  /// thread overlaps communication with the caller's compute only where a core is free for it: on
  /// 2 ranks filling 2 cores it competed with its own rank's compute, and training ran 8-18%
  /// faster with the collectives on the caller's thread (benchmarks/RESULTS.md). A trainer whose
  /// host thread mostly waits on a device keeps its core idle meanwhile and should ask for
  /// `thread`.
  CommProgress progress = CommProgress::automatic;
  /// Bind every plan message as a persistent channel of the transport at plan construction and
  /// start it on each execution, where the transport has channels (DTRAIN_COMM_PERSISTENT, boolean;
  /// off: two-sided isend / irecv per message).
  bool persistent_channels = true;
  /// What `automatic` means (DTRAIN_ALLREDUCE_ALGO); an explicit argument wins over it.
  AllreduceAlgorithm default_algorithm = AllreduceAlgorithm::automatic;
  /// A given cost model (DTRAIN_COMM_ALPHA, _BETA, _GAMMA in seconds); invalid = measure once.
  CostModel cost_model{};
  /// Tuning file caching this machine's calibration (DTRAIN_TUNING_FILE; empty = none): read at
  /// the first calibration when present and made for the same job shape, written otherwise
  /// (detail/tuning.hpp). Makes `automatic` choose alike on every run.
  std::string tuning_file;
  /// Bitwise reproducible all-reduce and reduce-scatter (DTRAIN_COMM_REPRODUCIBLE, boolean):
  /// every request runs as an ordered algorithm (see AllreduceAlgorithm), so each element is the
  /// rank-order reduction ((x0 + x1) + x2) + ... whatever algorithm, bucket size, transport or
  /// timing. Costs about what ring costs in bandwidth; see benchmarks/RESULTS.md.
  bool reproducible = false;
  /// Let `automatic` all-reduce plans check their algorithm while in use (DTRAIN_ALLREDUCE_ADAPT,
  /// boolean; off by default: on the machine measured it did not choose better in short runs and
  /// its checks cost time there, benchmarks/RESULTS.md): each keeps its runner-up's plan, times it
  /// against its own in a short window now and then (at the 5th execution, then after gaps of 16
  /// executions doubling to 1024 while the choice holds), and all ranks change to it together when
  /// two windows in a row found it faster by more than 10% (detail/adaptive.hpp). Applies only
  /// where the choice is not promised to repeat: not with a tuning file (every run chooses alike)
  /// and not in reproducible mode.
  bool adaptive = false;

  /// Defaults overridden by the environment variables named above, parsed strictly
  /// (<dtrain/core/env.hpp>): an unset or empty variable keeps the default, a malformed value
  /// throws InvalidArgument naming the variable and the accepted values. Local; reads the
  /// environment once per call.
  static CommConfig from_env() {
    CommConfig c;
    c.timeout_s = env::get_double("DTRAIN_COMM_TIMEOUT_S", c.timeout_s, 1e-3, 1e9);
    c.segment_bytes = static_cast<std::size_t>(env::get_int(
        "DTRAIN_COMM_SEGMENT_BYTES", static_cast<long long>(c.segment_bytes), 64, 1ll << 31));
    c.check_fingerprints = env::get_bool("DTRAIN_COMM_CHECK", c.check_fingerprints);
    c.persistent_channels = env::get_bool("DTRAIN_COMM_PERSISTENT", c.persistent_channels);
    c.progress = static_cast<CommProgress>(env::get_choice(
        "DTRAIN_COMM_PROGRESS", static_cast<int>(c.progress), {"auto", "thread", "caller"}));
    if (const auto v = env::get("DTRAIN_ALLREDUCE_ALGO")) {
      env::parse_choice("DTRAIN_ALLREDUCE_ALGO", *v,
                        {"auto", "automatic", "ring", "tree", "rhd", "rd", "shm", "ordered",
                         "ordered_shm", "hier", "hier_leader"});
      c.default_algorithm = allreduce_algorithm_from_name(*v);
    }
    c.cost_model.alpha = env::get_double("DTRAIN_COMM_ALPHA", c.cost_model.alpha, 0, 1e3);
    c.cost_model.beta = env::get_double("DTRAIN_COMM_BETA", c.cost_model.beta, 0, 1e3);
    c.cost_model.gamma = env::get_double("DTRAIN_COMM_GAMMA", c.cost_model.gamma, 0, 1e3);
    c.tuning_file = env::get("DTRAIN_TUNING_FILE").value_or("");
    c.reproducible = env::get_bool("DTRAIN_COMM_REPRODUCIBLE", c.reproducible);
    c.adaptive = env::get_bool("DTRAIN_ALLREDUCE_ADAPT", c.adaptive);
    return c;
  }
};

}  // namespace dtrain
