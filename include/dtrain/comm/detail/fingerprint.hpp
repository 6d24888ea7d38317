// SPDX-License-Identifier: BSD-3-Clause
// dtrain: call fingerprints that let ranks detect mismatched collectives instead of hanging.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

enum class CollectiveKind : std::uint8_t {
  barrier,
  broadcast,
  allreduce,
  reduce_scatter,
  allgather,
  calibrate
};

inline const char* name_of(CollectiveKind k) noexcept {
  switch (k) {
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::calibrate: return "cost-model calibration";
  }
  return "?";
}

/// What one rank is calling: sent to peers, compared byte for byte. Trivially copyable with no
/// padding holes (the explicit fields fill 32 bytes).
struct Fingerprint {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::int32_t root = -1;
  std::uint8_t kind = 0;
  std::uint8_t op = 0;
  std::uint8_t dtype = 0;
  std::uint8_t algo = 0;
  std::uint64_t reserved = 0;

  bool operator==(const Fingerprint& o) const noexcept {
    return std::memcmp(this, &o, sizeof(Fingerprint)) == 0;
  }
  bool operator!=(const Fingerprint& o) const noexcept { return !(*this == o); }
};
static_assert(sizeof(Fingerprint) == 32, "Fingerprint must have no padding");

inline Fingerprint make_fingerprint(CollectiveKind kind, std::uint64_t seq, std::size_t count,
                                    DType dtype, ReduceOp op, AllreduceAlgorithm algo, int root) {
  Fingerprint f;
  f.seq = seq;
  f.count = count;
  f.root = root;
  f.kind = static_cast<std::uint8_t>(kind);
  f.op = static_cast<std::uint8_t>(op);
  f.dtype = static_cast<std::uint8_t>(dtype);
  f.algo = static_cast<std::uint8_t>(algo);
  return f;
}

/// "allreduce #12 (ring, sum, f32, 1000 elements)": the full call, for mismatch reports.
inline std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<CollectiveKind>(f.kind);
  std::string s = concat(name_of(kind), " #", f.seq);
  const auto dt = static_cast<DType>(f.dtype);
  switch (kind) {
    case CollectiveKind::barrier:
    case CollectiveKind::calibrate: return s;
    case CollectiveKind::broadcast:
      return s + concat(" (root ", f.root, ", ", name_of(dt), ", ", f.count, " elements)");
    case CollectiveKind::allreduce:
      return s + concat(" (", name_of(static_cast<AllreduceAlgorithm>(f.algo)), ", ",
                        name_of(static_cast<ReduceOp>(f.op)), ", ", name_of(dt), ", ", f.count,
                        " elements)");
    case CollectiveKind::reduce_scatter:
      return s + concat(" (", name_of(static_cast<ReduceOp>(f.op)), ", ", name_of(dt), ", ",
                        f.count, " elements)");
    case CollectiveKind::allgather:
      return s + concat(" (", name_of(dt), ", ", f.count, " elements)");
  }
  return s;
}

/// "allreduce #812 (ring, 4194304 B)": the operation named in timeout messages.
inline std::string operation_label(const Fingerprint& f) {
  const auto kind = static_cast<CollectiveKind>(f.kind);
  std::string s = concat(name_of(kind), " #", f.seq);
  const std::size_t bytes = f.count * size_of(static_cast<DType>(f.dtype));
  if (kind == CollectiveKind::allreduce)
    return s + concat(" (", name_of(static_cast<AllreduceAlgorithm>(f.algo)), ", ", bytes, " B)");
  if (kind == CollectiveKind::barrier || kind == CollectiveKind::calibrate) return s;
  return s + concat(" (", bytes, " B)");
}

/// The ranks that made one call, ascending: a group of a mismatch report.
struct CallGroup {
  Fingerprint call;
  std::vector<int> ranks;
};

/// "rank 4", "ranks 1-3, 5, 6": ascending ranks, runs of three or more as ranges.
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) s += ", ";
    if (j >= i + 2) {
      s += concat(ranks[i], "-", ranks[j]);
    } else {
      s += std::to_string(ranks[i]);
      if (j > i) s += concat(", ", ranks[j]);
    }
    i = j + 1;
  }
  return s;
}

/// "mismatched collective calls: rank 0 called allreduce #12 (...); ranks 1-3 called broadcast
/// #12 (...)": the groups of ranks by call, smallest first, so that the largest (the majority,
/// where there is one) comes last; groups of the same size in the order of their lowest ranks,
/// and "(no majority)" when the two largest are the same size. `others`: ranks whose calls are
/// not among the groups (more different calls than a CheckState holds), named at the end.
/// Every rank that has the same groups writes the same text.
inline std::string mismatch_report(std::vector<CallGroup> groups,
                                   const std::vector<int>& others = {}) {
  std::sort(groups.begin(), groups.end(), [](const CallGroup& x, const CallGroup& y) {
    if (x.ranks.size() != y.ranks.size()) return x.ranks.size() < y.ranks.size();
    return x.ranks.front() < y.ranks.front();
  });
  const std::size_t n = groups.size();
  std::string s = "mismatched collective calls";
  if (n >= 2 && groups[n - 1].ranks.size() == groups[n - 2].ranks.size() && others.empty())
    s += " (no majority)";
  s += ": ";
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += "; ";
    s += concat(rank_list(groups[i].ranks), " called ", describe(groups[i].call));
  }
  if (!others.empty()) s += concat("; ", rank_list(others), " called other collectives");
  return s;
}

/// What travels in the message-path fingerprint exchange: the distinct calls a rank knows of,
/// each with the ranks known to have made it. A rank starts with its own call; merging takes
/// the union, which is idempotent and order-free, so the dissemination rounds (whose coverage
/// overlaps) leave every rank with the same state: every call and every rank, compared byte for
/// byte. Bounded so that it stays one small message: at most kCalls calls, the first kCalls in
/// byte order (keeping the smallest ones of a union is itself order-free, and a call that is kept
/// at the end was never dropped on the way, so its ranks are complete); `more` says that others
/// were dropped. Rank sets are bitmasks of kRanks bits: 256 ranks cover the jobs the message path
/// serves on one or a few nodes with 4 * 8 bytes per call (216 bytes in all, against 112 for the
/// earlier pair of calls); ranks at or above it are not recorded in the masks, and a report for
/// more ranks names each call with its lowest rank (`lowest`, merged by minimum) instead.
struct CheckState {
  static constexpr int kCalls = 3;
  static constexpr int kRanks = 256;
  static constexpr int kWords = kRanks / 64;

  Fingerprint call[kCalls];               // ascending byte order, `calls` of them
  std::uint64_t ranks[kCalls][kWords]{};  // bit r: rank r made call[i] (r < kRanks)
  std::int32_t lowest[kCalls]{};          // the lowest rank that made call[i]
  std::int32_t calls = 0;
  std::int32_t more = 0;  // 1: more than kCalls different calls, the last in byte order dropped
  std::int32_t reserved = 0;

  /// One rank's own state.
  static CheckState of(const Fingerprint& f, int rank) noexcept {
    CheckState s;
    s.call[0] = f;
    s.lowest[0] = rank;
    s.calls = 1;
    if (rank >= 0 && rank < kRanks)
      s.ranks[0][rank / 64] = std::uint64_t{1} << static_cast<unsigned>(rank % 64);
    return s;
  }

  bool mismatch() const noexcept { return calls > 1 || more; }

  void merge(const CheckState& o) noexcept {
    if (calls == 1 && o.calls == 1 && call[0] == o.call[0]) {  // the common case: one call
      absorb(0, o, 0);
      more |= o.more;
      return;
    }
    CheckState m;  // both ascending lists merged, the first kCalls kept
    m.more = more | o.more;
    auto take = [&m](int k, const CheckState& s, int x) {
      m.call[k] = s.call[x];
      m.lowest[k] = s.lowest[x];
      std::memcpy(m.ranks[k], s.ranks[x], sizeof(m.ranks[k]));
    };
    // A peer's count, bounded: it indexes arrays (a corrupt message garbles a report only).
    const int n = std::min(std::max(calls, 0), kCalls), on = std::min(std::max(o.calls, 0), kCalls);
    int i = 0, j = 0;
    while (i < n || j < on) {
      const int c = i == n    ? 1
                    : j == on ? -1
                              : std::memcmp(&call[i], &o.call[j], sizeof(Fingerprint));
      if (m.calls == kCalls) {
        m.more = 1;
        break;
      }
      const int k = m.calls++;
      if (c <= 0) {
        take(k, *this, i++);
        if (c == 0) m.absorb(k, o, j++);
      } else {
        take(k, o, j++);
      }
    }
    *this = m;
  }

  /// The report of a mismatch among p ranks (the same text on every rank holding this state).
  std::string report(int p) const {
    if (p <= kRanks) {
      std::vector<CallGroup> groups;
      std::vector<int> others;
      for (int i = 0; i < calls; ++i) groups.push_back(CallGroup{call[i], {}});
      for (int r = 0; r < p; ++r) {
        int i = 0;
        while (i < calls && !(ranks[i][r / 64] >> (r % 64) & 1u)) ++i;
        (i < calls ? groups[static_cast<std::size_t>(i)].ranks : others).push_back(r);
      }
      groups.erase(std::remove_if(groups.begin(), groups.end(),
                                  [](const CallGroup& g) { return g.ranks.empty(); }),
                   groups.end());
      return mismatch_report(std::move(groups), others);
    }
    // At most kCalls entries, by lowest rank: an insertion sort (std::sort on so small an array
    // draws a false -Warray-bounds from GCC 12 at -O3 in every program that includes this).
    int order[kCalls] = {};
    for (int i = 0; i < calls; ++i) {
      int j = i;
      for (; j > 0 && lowest[order[j - 1]] > lowest[i]; --j) order[j] = order[j - 1];
      order[j] = i;
    }
    std::string s = concat("mismatched collective calls among ", p,
                           " ranks (each call named with the lowest rank that made it): ");
    for (int i = 0; i < calls; ++i)
      s += concat(i ? "; rank " : "rank ", lowest[order[i]], " called ", describe(call[order[i]]));
    if (more) s += "; and other collectives";
    return s;
  }

 private:
  void absorb(int k, const CheckState& o, int j) noexcept {
    for (int w = 0; w < kWords; ++w) ranks[k][w] |= o.ranks[j][w];
    if (o.lowest[j] < lowest[k]) lowest[k] = o.lowest[j];
  }
};
static_assert(sizeof(CheckState) == 216, "CheckState must have no padding");
static_assert(std::is_trivially_copyable<CheckState>::value, "CheckState travels as bytes");

}  // namespace dtrain::detail
