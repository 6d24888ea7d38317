// SPDX-License-Identifier: BSD-3-Clause
// dtrain: how large the node-shared segments are and how the ranks group into nodes, read from
// the environment (DTRAIN_SHM, DTRAIN_SHM_SLOT_BYTES, DTRAIN_SHM_SLOTS, DTRAIN_SHM_HEAP_MIB,
// DTRAIN_RANKS_PER_NODE).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <dtrain/comm/shared_segments.hpp>
#include <dtrain/core/env.hpp>

namespace dtrain {

/// How DTRAIN_RANKS_PER_NODE cuts the system's nodes into fake nodes, so that one machine can
/// stand in for several: every node into consecutive blocks of `every` ranks ("2"), or the
/// group in rank order into consecutive nodes of the listed sizes ("3,1": ranks 0-2 and rank 3;
/// the sizes must add up to the group's size, which every rank checks when its transport maps
/// the nodes; a listed node that would span two system nodes is split there). Neither set = as
/// the system groups them. Plain value type.
struct RanksPerNode {
  int every = 0;           ///< block size; 0 = not set
  std::vector<int> sizes;  ///< list form: node sizes in rank order
  RanksPerNode() = default;
  RanksPerNode(int n) : every(n) {}  // NOLINT(google-explicit-constructor): `= 2` reads well
  bool is_set() const noexcept { return every > 0 || !sizes.empty(); }
  /// Parses the value `v` of variable `name` strictly: an integer in [1, 65536], or a
  /// comma-separated list of such integers with at least two entries.
  static RanksPerNode parse(const char* name, const std::string& v) {
    RanksPerNode r;
    if (v.find(',') == std::string::npos) {
      r.every = static_cast<int>(env::parse_int(name, v, 1, 65536));
      return r;
    }
    std::size_t at = 0;
    while (true) {
      const std::size_t comma = v.find(',', at);
      const std::string item =
          v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (item.empty())
        env::detail::bad_value(name, v,
                               "an integer in [1, 65536] or a comma-separated list of node sizes "
                               "in rank order (e.g. 3,1)");
      r.sizes.push_back(static_cast<int>(env::parse_int(name, item, 1, 65536)));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    return r;
  }
};

/// Shared-segment sizing: whether the capability is on (DTRAIN_SHM, boolean), the pipelining
/// chunk (DTRAIN_SHM_SLOT_BYTES, 256 B .. 1 GiB, rounded down to 64 B; default 256 KiB) and how
/// many chunks may be in flight (DTRAIN_SHM_SLOTS, 2..64, default 16). Transports take one in
/// their constructor; their single-argument constructors read it with from_env.
///
/// Why 16 slots (4 MiB a rank) and not 4 (1 MiB, one core's L2 on the machine measured): a slot
/// is written again once every rank has read it, and with 1 MiB of slots its lines are probably
/// still in the reader's cache then. Where the two cores share no L3 (other dies of a multi-die
/// CPU, other sockets), each rewrite then waits for lines held on the other die, and the shm
/// all-reduce of 2 ranks ran 2.5-3x slower than where they share one (1-16 MiB), 1.1-1.8x behind
/// ring. With 16 slots it ran 1.4-2.1x faster than with 4 across dies at 256 KiB-16 MiB, and
/// 2-17% slower than with 4 where the cores share an L3 (benchmarks/RESULTS.md).
struct SharedSegmentConfig {
  bool enabled = true;
  std::size_t slot_bytes = 256 * 1024;
  int slots = 16;
  /// Fake nodes for the hierarchical algorithms (DTRAIN_RANKS_PER_NODE: a block size, 1..65536,
  /// or a list of node sizes such as 3,1; unset = as the system groups them), see RanksPerNode
  /// and NodeMap::subdivided (<dtrain/comm/topology.hpp>).
  RanksPerNode ranks_per_node;
  /// How long an orderly release of the segments waits for every rank before it keeps them
  /// instead (freeing them is collective: a stopped rank would make it wait forever). Seconds.
  double close_timeout_s = 300;
  /// How long the transport's construction, a chain of MPI collectives over its communicator,
  /// may take before the job is ended (<= 0: forever): a rank that failed or stopped before it
  /// would leave the others inside collectives that cannot be cancelled. Seconds; from_env takes
  /// the communicator's deadline, DTRAIN_COMM_TIMEOUT_S, when it is set.
  double setup_timeout_s = 300;
  /// Bytes of each rank's heap, memory the other ranks of the node read in place
  /// (DTRAIN_SHM_HEAP_MIB, 0..1048576 MiB; default 0 = none): a model whose arenas come from
  /// Communicator::shared_allocator() then has its gradients averaged by the shm all-reduce
  /// (hier and hier_leader inside each node) without the copies through the slots (about half
  /// the memory traffic). The pages are
  /// touched only as blocks are handed out; where /dev/shm is small (containers), size it within.
  std::size_t heap_bytes = 0;
  /// The defaults overridden by the variables above, parsed strictly (<dtrain/core/env.hpp>).
  static SharedSegmentConfig from_env() {
    SharedSegmentConfig c;
    c.enabled = env::get_bool("DTRAIN_SHM", c.enabled);
    if (const auto v = env::get("DTRAIN_RANKS_PER_NODE"))
      c.ranks_per_node = RanksPerNode::parse("DTRAIN_RANKS_PER_NODE", *v);
    c.slot_bytes =
        static_cast<std::size_t>(env::get_int(
            "DTRAIN_SHM_SLOT_BYTES", static_cast<long long>(c.slot_bytes), 256, 1ll << 30)) /
        64 * 64;
    c.slots = static_cast<int>(env::get_int("DTRAIN_SHM_SLOTS", c.slots, 2, 64));
    c.setup_timeout_s = env::get_double("DTRAIN_COMM_TIMEOUT_S", c.setup_timeout_s, 1e-3, 1e9);
    c.heap_bytes = static_cast<std::size_t>(env::get_int("DTRAIN_SHM_HEAP_MIB", 0, 0, 1 << 20))
                   << 20;
    return c;
  }
  static constexpr std::size_t kPage = 4096;
  /// Offset of the heap in one rank's segment: after the slots and the counters, on a page.
  std::size_t heap_offset() const noexcept {
    const std::size_t end =
        static_cast<std::size_t>(slots) * slot_bytes + SharedSegments::flag_bytes(slots);
    return (end + kPage - 1) / kPage * kPage;
  }
  /// Bytes of one rank's segment: the slots, then the counters, then (with a heap, from a page
  /// boundary and rounded up to whole pages) the heap.
  std::size_t segment_bytes() const noexcept {
    if (heap_bytes == 0)
      return static_cast<std::size_t>(slots) * slot_bytes + SharedSegments::flag_bytes(slots);
    return heap_offset() + (heap_bytes + kPage - 1) / kPage * kPage;
  }
};

}  // namespace dtrain
