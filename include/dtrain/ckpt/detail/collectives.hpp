// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what the Checkpointer needs from a communicator, and the few compound steps it builds
// from the communicator's own collectives (broadcast, allreduce, and allgather where the
// communicator has it): byte strings, error agreement, structure agreement, gathering entries.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::detail {

template <class Comm, class = void>
struct ckpt_comm_ok : std::false_type {};
template <class Comm>
struct ckpt_comm_ok<
    Comm, std::void_t<decltype(int(std::declval<const Comm&>().rank())),
                      decltype(int(std::declval<const Comm&>().size())),
                      decltype(std::declval<Comm&>().barrier()),
                      decltype(std::declval<Comm&>().broadcast(BufferView(), 0)),
                      decltype(std::declval<Comm&>().allreduce(BufferView(), ReduceOp::sum))>>
    : std::true_type {};

/// Optional: allgather(BufferView in, BufferView out) with equal parts (dtrain::Communicator).
template <class Comm, class = void>
struct ckpt_comm_has_allgather : std::false_type {};
template <class Comm>
struct ckpt_comm_has_allgather<
    Comm, std::void_t<decltype(std::declval<Comm&>().allgather(BufferView(), BufferView()))>>
    : std::true_type {};

template <class Comm>
void ckpt_bcast_i64(Comm& comm, std::vector<std::int64_t>& v, int root) {
  if (!v.empty()) comm.broadcast(BufferView(v.data(), v.size(), DType::i64), root);
}

template <class Comm>
std::int64_t ckpt_allreduce_i64(Comm& comm, std::int64_t x, ReduceOp op) {
  comm.allreduce(BufferView(&x, 1, DType::i64), op);
  return x;
}

/// Broadcasts a byte string of any length from `root` (length first, then 8-byte words: the
/// communicator moves typed elements, and i64 is the widest).
template <class Comm>
void ckpt_bcast_bytes(Comm& comm, std::vector<unsigned char>& bytes, int root) {
  std::vector<std::int64_t> n{static_cast<std::int64_t>(bytes.size())};
  ckpt_bcast_i64(comm, n, root);
  const std::size_t len = static_cast<std::size_t>(n[0]);
  const std::size_t words = (len + 7) / 8;
  bytes.resize(words * 8);
  if (words) comm.broadcast(BufferView(bytes.data(), words, DType::i64), root);
  bytes.resize(len);
}

template <class Comm>
void ckpt_bcast_string(Comm& comm, std::string& s, int root) {
  std::vector<unsigned char> b(s.begin(), s.end());
  ckpt_bcast_bytes(comm, b, root);
  s.assign(b.begin(), b.end());
}

/// Collective: true when (a, b) is the same on every rank (one allreduce(max) of (a, b, -a, -b):
/// the maximum of x and of -x agree exactly when every rank holds the same x).
template <class Comm>
bool ckpt_same_everywhere(Comm& comm, std::uint32_t a, std::uint32_t b) {
  std::int64_t v[4] = {a, b, -static_cast<std::int64_t>(a), -static_cast<std::int64_t>(b)};
  comm.allreduce(BufferView(v, 4, DType::i64), ReduceOp::max);
  return v[0] == -v[2] && v[1] == -v[3];
}

enum class ErrCode : std::int64_t {
  error = 0,
  invalid_argument = 1,
  io = 2,
  timeout = 3,
  remote = 4
};

inline std::pair<ErrCode, std::string> classify(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const InvalidArgument& x) {
    return {ErrCode::invalid_argument, x.what()};
  } catch (const IoError& x) {
    return {ErrCode::io, x.what()};
  } catch (const TimeoutError& x) {
    return {ErrCode::timeout, x.what()};
  } catch (const RemoteError& x) {
    return {ErrCode::remote, x.what()};
  } catch (const std::exception& x) {
    return {ErrCode::error, x.what()};
  } catch (...) {
    return {ErrCode::error, "unknown exception"};
  }
}

/// Collective: every rank learns whether any rank failed. The lowest failing rank rethrows its
/// own exception; the others throw the same type for bad arguments (everyone's problem) and
/// RemoteError otherwise, quoting the failing rank's message.
/// Under FailurePolicy::abort_job a rank with a local error does not enter the agreement: it
/// reports its error and aborts the job at once (the peers are then ended by the abort).
template <class Comm>
void ckpt_agree(Comm& comm, const std::exception_ptr& local, const char* operation) {
  if (local && failure_policy() == FailurePolicy::abort_job) job_failed(local);
  const std::int64_t none = std::numeric_limits<std::int64_t>::max();
  const std::int64_t me = local ? comm.rank() : none;
  const std::int64_t first = ckpt_allreduce_i64(comm, me, ReduceOp::min);
  if (first == none) return;
  std::pair<ErrCode, std::string> what;
  if (local && first == comm.rank()) what = classify(local);
  std::vector<std::int64_t> code{static_cast<std::int64_t>(what.first)};
  ckpt_bcast_i64(comm, code, static_cast<int>(first));
  ckpt_bcast_string(comm, what.second, static_cast<int>(first));
  if (first == comm.rank()) std::rethrow_exception(local);
  const std::string detail = "rank " + std::to_string(first) + " failed: " + what.second;
  if (static_cast<ErrCode>(code[0]) == ErrCode::invalid_argument)
    raise<InvalidArgument>(operation, detail);
  raise<RemoteError>(operation, detail);
}

/// A digest of a list of entries' names, kinds, dtypes and shapes.
inline std::uint32_t structure_digest(const std::vector<CkptEntry>& entries) {
  std::uint32_t crc = 0;
  for (const auto& e : entries) {
    // A tensor held in parts counts by its whole shape (each rank holds other parts).
    std::string s = e.path + "|" + std::to_string(static_cast<int>(e.kind)) + "|" +
                    name_of(e.dtype) + to_string(e.sharded ? e.whole : e.shape) +
                    (e.sharded ? "parts;" : ";");
    crc = crc32c(s.data(), s.size(), crc);
  }
  return crc;
}

/// Collective: every rank's blob, in rank order, on every rank (to_all) or on rank 0 only
/// (elsewhere the result is empty). With the communicator's allgather: two allgathers (sizes,
/// then the blobs padded to the largest); otherwise one allreduce of the sizes and one broadcast
/// per contributing rank.
template <class Comm>
std::vector<std::vector<unsigned char>> ckpt_gather_blobs(Comm& comm,
                                                          const std::vector<unsigned char>& mine,
                                                          bool to_all) {
  const int p = comm.size(), rank = comm.rank();
  const auto up = static_cast<std::size_t>(p);
  std::vector<std::vector<unsigned char>> out;
  if (p == 1) {
    out.push_back(mine);
    return out;
  }
  std::vector<std::int64_t> sizes(up, 0);
  if constexpr (ckpt_comm_has_allgather<Comm>::value) {
    std::int64_t own = static_cast<std::int64_t>(mine.size());
    comm.allgather(BufferView(&own, 1, DType::i64), BufferView(sizes.data(), up, DType::i64));
    std::int64_t largest = 0;
    for (auto s : sizes) largest = std::max(largest, s);
    const std::size_t words = (static_cast<std::size_t>(largest) + 7) / 8;
    if (words == 0) return std::vector<std::vector<unsigned char>>(to_all || rank == 0 ? up : 0);
    std::vector<std::int64_t> in(words, 0), all(words * up, 0);
    if (!mine.empty()) std::memcpy(in.data(), mine.data(), mine.size());
    comm.allgather(BufferView(in.data(), words, DType::i64),
                   BufferView(all.data(), all.size(), DType::i64));
    if (!to_all && rank != 0) return out;
    for (std::size_t s = 0; s < up; ++s) {
      const auto* b = reinterpret_cast<const unsigned char*>(all.data() + s * words);
      out.emplace_back(b, b + sizes[s]);
    }
    return out;
  } else {
    sizes[static_cast<std::size_t>(rank)] = static_cast<std::int64_t>(mine.size());
    comm.allreduce(BufferView(sizes.data(), up, DType::i64), ReduceOp::sum);
    for (int s = 0; s < p; ++s) {
      std::vector<unsigned char> blob;
      if (s == rank) blob = mine;
      if (s != 0 || to_all) ckpt_bcast_bytes(comm, blob, s);
      if (to_all || rank == 0) out.push_back(std::move(blob));
    }
    return out;
  }
}

/// Collective: moves every rank's entries (metadata, with_data: and bytes) to rank 0 (to_all
/// false) or to every rank. Returns all ranks' entries in rank order there, empty elsewhere.
/// The calling rank's own entries point at the caller's memory (no copy).
template <class Comm>
std::vector<CkptEntry> ckpt_exchange(Comm& comm, const std::vector<CkptEntry>& mine, bool with_data,
                                     bool to_all) {
  BlobWriter w;
  w.put_i64(static_cast<std::int64_t>(mine.size()));
  for (const auto& e : mine) encode_entry(w, e, with_data);
  const auto blobs = ckpt_gather_blobs(comm, w.bytes(), to_all);
  std::vector<CkptEntry> out;
  for (std::size_t s = 0; s < blobs.size(); ++s) {
    if (static_cast<int>(s) == comm.rank() && with_data) {
      out.insert(out.end(), mine.begin(), mine.end());
      continue;
    }
    BlobReader r(blobs[s].data(), blobs[s].size());
    const auto n = r.get_i64();
    for (std::int64_t i = 0; i < n; ++i) out.push_back(decode_entry(r));
  }
  return out;
}

}  // namespace dtrain::detail
