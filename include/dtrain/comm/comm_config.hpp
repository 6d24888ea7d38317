// dtrain: settings of a Communicator, with environment overrides.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {

/// Settings of one Communicator. Plain value type; every rank must use the same values (a
/// mismatch in algorithm choice is caught by the collective fingerprints).
struct CommConfig {
  /// Deadline of every blocking wait, in seconds (DTRAIN_COMM_TIMEOUT_S).
  double timeout_s = 300;
  /// Pipelining unit of the segmented algorithms (DTRAIN_COMM_SEGMENT_BYTES). Tests shrink it so
  /// multi-segment paths run on small inputs.
  std::size_t segment_bytes = 256 * 1024;
  /// Exchange call fingerprints before each collective (DTRAIN_COMM_CHECK=0 turns it off).
  bool check_fingerprints = true;
  /// Run non-blocking collectives on a per-communicator progress thread (DTRAIN_COMM_PROGRESS=
  /// thread|caller). Without it, progress happens only inside test()/wait().
  bool progress_thread = true;
  /// Bind every plan message as a persistent channel of the transport at plan construction and
  /// start it on each execution, where the transport has channels (DTRAIN_COMM_PERSISTENT=0 turns
  /// it off: two-sided isend / irecv per message).
  bool persistent_channels = true;
  /// What `automatic` means (DTRAIN_ALLREDUCE_ALGO); an explicit argument wins over it.
  AllreduceAlgorithm default_algorithm = AllreduceAlgorithm::automatic;
  /// A given cost model (DTRAIN_COMM_ALPHA, _BETA, _GAMMA in seconds); invalid = measure once.
  CostModel cost_model{};

  /// Defaults overridden by the environment variables named above. Throws InvalidArgument on
  /// malformed values.
  static CommConfig from_env() {
    CommConfig c;
    if (const char* s = std::getenv("DTRAIN_COMM_TIMEOUT_S"))
      c.timeout_s = parse(s, "DTRAIN_COMM_TIMEOUT_S");
    if (const char* s = std::getenv("DTRAIN_COMM_SEGMENT_BYTES"))
      c.segment_bytes = static_cast<std::size_t>(parse(s, "DTRAIN_COMM_SEGMENT_BYTES"));
    if (const char* s = std::getenv("DTRAIN_COMM_CHECK"))
      c.check_fingerprints = std::string(s) != "0";
    if (const char* s = std::getenv("DTRAIN_COMM_PERSISTENT"))
      c.persistent_channels = std::string(s) != "0";
    if (const char* s = std::getenv("DTRAIN_COMM_PROGRESS")) {
      const std::string v = s;
      DTRAIN_REQUIRE(v == "thread" || v == "caller", "CommConfig::from_env",
                     "DTRAIN_COMM_PROGRESS='" << v << "' (thread or caller)");
      c.progress_thread = v == "thread";
    }
    if (const char* s = std::getenv("DTRAIN_ALLREDUCE_ALGO"); s && *s)
      c.default_algorithm = allreduce_algorithm_from_name(s);
    if (const char* s = std::getenv("DTRAIN_COMM_ALPHA"))
      c.cost_model.alpha = parse(s, "DTRAIN_COMM_ALPHA");
    if (const char* s = std::getenv("DTRAIN_COMM_BETA"))
      c.cost_model.beta = parse(s, "DTRAIN_COMM_BETA");
    if (const char* s = std::getenv("DTRAIN_COMM_GAMMA"))
      c.cost_model.gamma = parse(s, "DTRAIN_COMM_GAMMA");
    return c;
  }

 private:
  static double parse(const char* s, const char* name) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    DTRAIN_REQUIRE(end != s && *end == '\0' && v >= 0, "CommConfig::from_env",
                   name << "='" << s << "' is not a non-negative number");
    return v;
  }
};

}  // namespace dtrain
