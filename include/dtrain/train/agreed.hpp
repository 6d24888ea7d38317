// SPDX-License-Identifier: BSD-3-Clause
// dtrain: agreed(), so that an error on some ranks ends a phase of the job on every rank at once.
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/reduce_op.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain {

/// An error every rank of a job knows: agreed() throws it on each rank with the same message, and
/// a program may throw it itself where every rank finds the same problem (an option that does not
/// match the checkpoint). Catch it around the whole job, print it on one rank and return the same
/// exit code everywhere: no rank is left waiting in a collective.
class AgreedError : public Error {
 public:
  using Error::Error;
};

/// Collective over `comm`: one all-reduce of an integer, plus two broadcasts when something failed.
/// Runs `f` on every rank; when it threw a std::exception on any rank, every rank throws
/// AgreedError with the message of the lowest failing rank (which keeps its "dtrain: rank R:"
/// prefix). Meant for local work that may fail on some ranks only, such as opening a file,
/// checking this rank's shard or taking a lock on rank 0, so that one bad row ends the whole job
/// with one clear message instead of leaving the other ranks in the next collective. `f` may run
/// collectives itself only if it cannot throw before them on some ranks alone. Blocking; call it
/// from the thread that drives `comm`. `Comm` needs rank(), allreduce(BufferView, ReduceOp) and
/// broadcast(BufferView, int root) (dtrain::Communicator).
template <class Comm, class F>
void agreed(Comm& comm, F&& f) {
  std::string err;
  try {
    std::forward<F>(f)();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "an error without a message";
  }
  std::int64_t first = err.empty() ? INT64_MAX : comm.rank();
  comm.allreduce(BufferView(&first, 1, DType::i64), ReduceOp::min);
  if (first == INT64_MAX) return;
  const int root = static_cast<int>(first);
  std::int64_t len = static_cast<std::int64_t>(err.size());
  comm.broadcast(BufferView(&len, 1, DType::i64), root);
  // The text travels as 64-bit words: the communicator's buffers carry typed elements.
  std::vector<std::int64_t> words((static_cast<std::size_t>(len) + 7) / 8 + 1, 0);
  std::memcpy(words.data(), err.data(), err.size());
  comm.broadcast(BufferView(words.data(), words.size(), DType::i64), root);
  throw AgreedError(
      std::string(reinterpret_cast<const char*>(words.data()), static_cast<std::size_t>(len)));
}

}  // namespace dtrain
