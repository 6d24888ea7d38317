// SPDX-License-Identifier: BSD-3-Clause
// dtrain: which node each rank runs on, as the hierarchical all-reduce and the cost model see it.
//
// A transport states its grouping through two optional members (detected, see node_map_of and
// node_segments_of below):
//   const NodeMap& node_map() const;          the node of every rank of the group
//   SharedSegments* node_segments() noexcept; segments shared by the ranks of this rank's node,
//                                             indexed by rank within the node (null when the
//                                             node has one rank or segments are off)
// A transport without them counts as one node when it has whole-group shared segments and as
// one node per rank otherwise. MpiTransport groups by MPI_COMM_TYPE_SHARED, LoopbackTransport
// puts every thread on one node unless its world was given a map; both subdivide their nodes
// as DTRAIN_RANKS_PER_NODE says when it is set (SharedSegmentConfig::ranks_per_node: blocks of
// that many ranks, or a list of node sizes such as 3,1), so multi-node paths run on one machine.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/comm/transport_traits.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/detect.hpp>

namespace dtrain {

/// The shape of a node grouping, what the cost model needs: number of nodes and the largest and
/// smallest number of ranks on one node. Plain value type.
struct Topology {
  int nodes = 1;
  int max_ranks_per_node = 1;
  int min_ranks_per_node = 1;

  /// `p` ranks, one per node (what a flat algorithm over p ranks assumes).
  static Topology flat(int p) noexcept { return Topology{p < 1 ? 1 : p, 1, 1}; }
  /// True when a two-level algorithm can differ from a flat one: several nodes, and some node
  /// with several ranks.
  bool hierarchical() const noexcept { return nodes > 1 && max_ranks_per_node > 1; }
};

/// Node of every rank of a group. Nodes are numbered 0.. in the order of their lowest rank, so
/// every rank derives the same numbering from the same map. Plain value type; local.
class NodeMap {
 public:
  NodeMap() = default;
  /// From a rank -> node label map (any labels; equal labels = same node). Throws
  /// InvalidArgument for an empty map.
  explicit NodeMap(const std::vector<int>& node_label) {
    DTRAIN_REQUIRE(!node_label.empty(), "NodeMap", "empty rank -> node map");
    node_of_.assign(node_label.size(), -1);
    std::vector<int> labels;
    for (std::size_t r = 0; r < node_label.size(); ++r) {
      const auto it = std::find(labels.begin(), labels.end(), node_label[r]);
      node_of_[r] = static_cast<int>(it - labels.begin());
      if (it == labels.end()) labels.push_back(node_label[r]);
    }
    members_.resize(labels.size());
    local_.resize(node_of_.size());
    for (std::size_t r = 0; r < node_of_.size(); ++r) {
      auto& m = members_[static_cast<std::size_t>(node_of_[r])];
      local_[r] = static_cast<int>(m.size());
      m.push_back(static_cast<int>(r));
    }
    machine_ranks_.resize(node_of_.size());
    for (std::size_t r = 0; r < node_of_.size(); ++r)
      machine_ranks_[r] = static_cast<int>(members_[static_cast<std::size_t>(node_of_[r])].size());
  }
  /// `p` ranks on one node.
  static NodeMap single(int p) { return NodeMap(std::vector<int>(static_cast<std::size_t>(p), 0)); }
  /// `p` ranks, each on a node of its own.
  static NodeMap separate(int p) {
    std::vector<int> v(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) v[static_cast<std::size_t>(r)] = r;
    return NodeMap(v);
  }
  /// `node_label` with every node cut into consecutive blocks of `ranks_per_node` of its ranks
  /// (the last block of a node may be smaller); 0 keeps the map.
  static NodeMap subdivided(const std::vector<int>& node_label, int ranks_per_node) {
    NodeMap base(node_label);
    if (ranks_per_node <= 0) return base;
    std::vector<int> v(node_label.size());
    for (std::size_t r = 0; r < v.size(); ++r)
      v[r] = base.node_of_[r] * static_cast<int>(v.size()) + base.local_[r] / ranks_per_node;
    return NodeMap(v, base);
  }

  /// `node_label` cut as DTRAIN_RANKS_PER_NODE says (RanksPerNode): into blocks of `rpn.every`
  /// ranks per node, or into consecutive nodes of the listed sizes in rank order, each split
  /// where it would span two nodes of `node_label`. Throws InvalidArgument naming the variable
  /// when the listed sizes do not add up to the number of ranks.
  static NodeMap subdivided(const std::vector<int>& node_label, const RanksPerNode& rpn) {
    if (rpn.sizes.empty()) return subdivided(node_label, rpn.every);
    long long sum = 0;
    std::string list;
    for (int n : rpn.sizes) {
      sum += n;
      list += (list.empty() ? "" : ",") + std::to_string(n);
    }
    if (sum != static_cast<long long>(node_label.size()))
      raise<InvalidArgument>(
          "environment",
          detail::concat("DTRAIN_RANKS_PER_NODE='", list, "' lists nodes of ", sum,
                         " ranks in all, but the group has ", node_label.size(), " ranks"));
    NodeMap base(node_label);
    std::vector<int> v(node_label.size());
    std::size_t r = 0;
    for (std::size_t k = 0; k < rpn.sizes.size(); ++k)
      for (int i = 0; i < rpn.sizes[k]; ++i, ++r)
        v[r] = base.node_of_[r] * static_cast<int>(rpn.sizes.size()) + static_cast<int>(k);
    return NodeMap(v, base);
  }

  int size() const noexcept { return static_cast<int>(node_of_.size()); }
  int nodes() const noexcept { return static_cast<int>(members_.size()); }
  int node_of(int rank) const { return node_of_[static_cast<std::size_t>(rank)]; }
  /// Rank within its node (0 = the node's lowest rank).
  int local_rank(int rank) const { return local_[static_cast<std::size_t>(rank)]; }
  /// The ranks of node `node`, ascending.
  const std::vector<int>& members(int node) const {
    return members_[static_cast<std::size_t>(node)];
  }
  int node_size(int node) const { return static_cast<int>(members(node).size()); }
  /// Ranks of the group on the machine of `rank`: its node before `subdivided` cut it (the
  /// fake nodes of DTRAIN_RANKS_PER_NODE share one machine's cores and caches), else its node.
  int machine_ranks(int rank) const { return machine_ranks_[static_cast<std::size_t>(rank)]; }
  /// The largest machine_ranks over the group.
  int max_machine_ranks() const {
    return machine_ranks_.empty() ? 0
                                  : *std::max_element(machine_ranks_.begin(), machine_ranks_.end());
  }
  Topology shape() const {
    Topology t;
    t.nodes = nodes();
    t.max_ranks_per_node = 0;
    t.min_ranks_per_node = size();
    for (const auto& m : members_) {
      t.max_ranks_per_node = std::max(t.max_ranks_per_node, static_cast<int>(m.size()));
      t.min_ranks_per_node = std::min(t.min_ranks_per_node, static_cast<int>(m.size()));
    }
    return t;
  }
  /// "2x2" for even nodes, else the node sizes joined by '+' ("3+1").
  std::string describe() const {
    const Topology t = shape();
    if (t.max_ranks_per_node == t.min_ranks_per_node)
      return std::to_string(t.nodes) + "x" + std::to_string(t.max_ranks_per_node);
    std::string s;
    for (const auto& m : members_) s += (s.empty() ? "" : "+") + std::to_string(m.size());
    return s;
  }

 private:
  /// `node_label`, a cut of `machines` (whose nodes are the machines).
  NodeMap(const std::vector<int>& node_label, const NodeMap& machines) : NodeMap(node_label) {
    machine_ranks_ = machines.machine_ranks_;
  }

  std::vector<int> node_of_, local_, machine_ranks_;
  std::vector<std::vector<int>> members_;
};

namespace detail {
template <class T>
using node_map_call = decltype(std::declval<const T&>().node_map());
template <class T>
using node_segments_call = decltype(std::declval<T&>().node_segments());

template <class T>
using has_node_map = is_detected_exact<const NodeMap&, node_map_call, T>;
template <class T>
using has_node_segments = is_detected_exact<SharedSegments*, node_segments_call, T>;
}  // namespace detail

/// The node grouping of transport `t`: its own answer, else one node when it has whole-group
/// shared segments, else one node per rank. Local.
template <class T>
NodeMap node_map_of(T& t) {
  if constexpr (detail::has_node_map<T>::value) {
    return t.node_map();
  } else {
    return shared_segments_of(t) ? NodeMap::single(t.size()) : NodeMap::separate(t.size());
  }
}

/// Segments shared by the ranks of this rank's node (indexed by rank within the node), or null.
/// Local.
template <class T>
SharedSegments* node_segments_of(T& t) noexcept {
  if constexpr (detail::has_node_segments<T>::value)
    return t.node_segments();
  else
    return shared_segments_of(t);
}

}  // namespace dtrain
