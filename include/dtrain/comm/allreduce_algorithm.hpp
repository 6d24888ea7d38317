// dtrain: the all-reduce algorithms a caller (or DTRAIN_ALLREDUCE_ALGO) can ask for.
#pragma once

#include <string>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// All-reduce algorithm. Every value has a real implementation.
///   automatic  chosen per call from the communicator's alpha-beta-gamma cost model
///   ring       reduce-scatter + all-gather around a ring, segmented and pipelined
///   tree       pipelined double binary tree (each rank is interior in at most one tree)
///   rhd        recursive halving / doubling (Rabenseifner), any number of ranks
///   rd         recursive doubling of the whole vector: fewest steps, for small messages
///   shm        reduce-scatter + all-gather by loads and stores through node-shared segments,
///              chunk-pipelined; needs a transport with shared segments (all ranks on one node)
enum class AllreduceAlgorithm : unsigned char { automatic, ring, tree, rhd, rd, shm };

constexpr const char* name_of(AllreduceAlgorithm a) noexcept {
  switch (a) {
    case AllreduceAlgorithm::automatic: return "auto";
    case AllreduceAlgorithm::ring: return "ring";
    case AllreduceAlgorithm::tree: return "tree";
    case AllreduceAlgorithm::rhd: return "rhd";
    case AllreduceAlgorithm::rd: return "rd";
    case AllreduceAlgorithm::shm: return "shm";
  }
  return "?";
}

/// Parses "auto" (or "automatic"), "ring", "tree", "rhd", "rd", "shm"; throws InvalidArgument
/// otherwise.
inline AllreduceAlgorithm allreduce_algorithm_from_name(const std::string& s) {
  if (s == "auto" || s == "automatic") return AllreduceAlgorithm::automatic;
  for (AllreduceAlgorithm a :
       {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
        AllreduceAlgorithm::rd, AllreduceAlgorithm::shm})
    if (s == name_of(a)) return a;
  raise<InvalidArgument>("allreduce_algorithm_from_name",
                         "unknown all-reduce algorithm '" + s + "' (auto ring tree rhd rd shm)");
}

}  // namespace dtrain
