// SPDX-License-Identifier: BSD-3-Clause
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
///   ordered    reproducible: every element is reduced in rank order, ((x0 + x1) + x2) + ...,
///              whatever the timing (direct-exchange reduce-scatter, then all-gather);
///              reduce_scatter too in reproducible mode
///   ordered_shm  the same bits through node-shared segments (the owner of each part reads the
///              p slots in rank order); needs shared segments like shm
///   hier       two levels over the transport's nodes (<dtrain/comm/topology.hpp>): intra-node
///              reduce-scatter (node-shared segments, else messages), inter-node all-reduce
///              of each part among the ranks that own it, intra-node all-gather
///   hier_leader  intra-node reduce to one leader per node, an all-reduce among the leaders,
///              intra-node broadcast: for small messages across nodes
///              (both pick the inter-node algorithm from the cost model, detail/algo/hier.hpp)
/// With CommConfig::reproducible (DTRAIN_COMM_REPRODUCIBLE) every request is mapped to an ordered
/// algorithm: shm to ordered_shm; ring, tree, rhd, rd to ordered; automatic (and any other
/// algorithm) to ordered_shm where the transport has shared segments, else ordered. All of them
/// give the same bits, so results no longer depend on the algorithm, bucket size or transport.
enum class AllreduceAlgorithm : unsigned char {
  automatic,
  ring,
  tree,
  rhd,
  rd,
  shm,
  ordered,
  ordered_shm,
  hier,
  hier_leader
};

constexpr const char* name_of(AllreduceAlgorithm a) noexcept {
  switch (a) {
    case AllreduceAlgorithm::automatic: return "auto";
    case AllreduceAlgorithm::ring: return "ring";
    case AllreduceAlgorithm::tree: return "tree";
    case AllreduceAlgorithm::rhd: return "rhd";
    case AllreduceAlgorithm::rd: return "rd";
    case AllreduceAlgorithm::shm: return "shm";
    case AllreduceAlgorithm::ordered: return "ordered";
    case AllreduceAlgorithm::ordered_shm: return "ordered_shm";
    case AllreduceAlgorithm::hier: return "hier";
    case AllreduceAlgorithm::hier_leader: return "hier_leader";
  }
  return "?";
}

/// The ordered algorithm a request of `a` runs as in reproducible mode (the mapping above);
/// `shared_segments`: whether the transport has node-shared segments. Pure.
constexpr AllreduceAlgorithm reproducible_counterpart(AllreduceAlgorithm a,
                                                      bool shared_segments) noexcept {
  switch (a) {
    case AllreduceAlgorithm::shm:
    case AllreduceAlgorithm::ordered_shm: return AllreduceAlgorithm::ordered_shm;
    case AllreduceAlgorithm::ring:
    case AllreduceAlgorithm::tree:
    case AllreduceAlgorithm::rhd:
    case AllreduceAlgorithm::rd:
    case AllreduceAlgorithm::ordered: return AllreduceAlgorithm::ordered;
    default: break;
  }
  return shared_segments ? AllreduceAlgorithm::ordered_shm : AllreduceAlgorithm::ordered;
}

/// Parses "auto" (or "automatic"), "ring", "tree", "rhd", "rd", "shm", "ordered", "ordered_shm",
/// "hier", "hier_leader"; throws InvalidArgument otherwise.
inline AllreduceAlgorithm allreduce_algorithm_from_name(const std::string& s) {
  if (s == "auto" || s == "automatic") return AllreduceAlgorithm::automatic;
  for (AllreduceAlgorithm a :
       {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
        AllreduceAlgorithm::rd, AllreduceAlgorithm::shm, AllreduceAlgorithm::ordered,
        AllreduceAlgorithm::ordered_shm, AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader})
    if (s == name_of(a)) return a;
  raise<InvalidArgument>("allreduce_algorithm_from_name",
                         "unknown all-reduce algorithm '" + s +
                             "' (auto ring tree rhd rd shm ordered ordered_shm hier hier_leader)");
}

}  // namespace dtrain
