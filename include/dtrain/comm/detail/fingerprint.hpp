// SPDX-License-Identifier: BSD-3-Clause
// dtrain: call fingerprints that let ranks detect mismatched collectives instead of hanging.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

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

/// What travels in the fingerprint exchange: the fingerprint this rank has seen (with its
/// origin) and the first disagreement anyone has seen. Merging is idempotent and order-free, so a
/// dissemination pattern spreads a disagreement to every rank in ceil(log2 p) rounds.
struct CheckState {
  Fingerprint seen;
  Fingerprint a;
  Fingerprint b;
  std::int32_t seen_rank = -1;
  std::int32_t mismatch = 0;
  std::int32_t a_rank = -1;
  std::int32_t b_rank = -1;

  void merge(const CheckState& o) noexcept {
    if (mismatch) return;
    if (o.mismatch) {
      mismatch = 1;
      a = o.a;
      b = o.b;
      a_rank = o.a_rank;
      b_rank = o.b_rank;
    } else if (o.seen != seen) {
      mismatch = 1;
      a = seen;
      a_rank = seen_rank;
      b = o.seen;
      b_rank = o.seen_rank;
    }
  }
};

}  // namespace dtrain::detail
