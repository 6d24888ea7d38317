// SPDX-License-Identifier: BSD-3-Clause
// dtrain: DistributedSampler, the epoch order every rank agrees on, sharded by rank.
//
// The sequence of an epoch
// ------------------------
// For epoch e the sampler forms a permutation P of [0, N): a Fisher-Yates shuffle driven by
// Philox (seed, stream derived from e), or the identity without shuffling. P depends only on
// (seed, epoch, N), never on the number of ranks, so every rank computes it without communication
// (it is held as N 64-bit indices, shared by copies of the sampler).
//
// The sampler's state is a *global position* g: the number of entries of P the whole job has
// consumed this epoch. A step takes the next b*W entries of P, where b is the step's batch size
// (the same on every rank), and gives rank r of W the r-th block of b of them:
//     P[(g + r*b + i) mod N]   for i = 0 .. b-1,
// moving g to g + b*W. So after any number of steps the consumed part of the epoch is exactly the
// prefix P[0, g): the shards of a step are disjoint, their union is the next b*W entries of P, and
// the state needs no rank count. Restoring with a different W continues the same P from the same
// g; from there on the new W splits each step. Blocks (rather than every W-th entry) keep each
// rank's rows contiguous in the file when shuffling is off, so they are read as one run.
//
// The tail (the last entries of P that do not divide evenly among the W ranks):
//   SamplerTail::pad  (default) the remaining R = N - g entries are extended to ceil(R/W)*W by
//                     wrapping to the start of P (P[0], P[1], ...), so every rank gets
//                     ceil(R/W) samples and no sample is dropped; a few appear twice.
//   SamplerTail::drop the last R mod W entries are skipped: every rank gets floor(R/W) samples.
// Each rank thus has q = R'/W samples left, the same on every rank; they form ceil(q/B) batches of
// B (the last one shorter, equally short on every rank), or floor(q/B) full batches with
// drop_last = true. Every rank therefore runs the same number of steps with the same batch sizes,
// so collectives in the training step never wait for a rank that ran out of data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/rng.hpp>

namespace dtrain {

/// How the end of an epoch is made to divide evenly among ranks (see the header comment).
enum class SamplerTail : unsigned char { pad, drop };

constexpr const char* name_of(SamplerTail t) noexcept {
  return t == SamplerTail::pad ? "pad" : "drop";
}

/// Options of DistributedSampler. Plain value type.
struct SamplerOptions {
  /// Shuffle each epoch; false keeps the dataset order (P is the identity).
  bool shuffle = true;
  /// Rank-level tail policy.
  SamplerTail tail = SamplerTail::pad;
  /// Drop the final batch of an epoch when it is shorter than the batch size (on all ranks alike).
  bool drop_last = false;
};

namespace detail {
template <class G, class = void>
struct has_rank_and_size : std::false_type {};
template <class G>
struct has_rank_and_size<G,
                         std::void_t<decltype(static_cast<int>(std::declval<const G&>().rank())),
                                     decltype(static_cast<int>(std::declval<const G&>().size()))>>
    : std::true_type {};
}  // namespace detail

/// Epoch order and per-rank shards (see the header comment for the exact sequence).
/// Local object, no communication: every rank constructs its own with the same num_samples, seed
/// and options. Not thread-safe; copies are independent (they share the immutable permutation),
/// which is how a Loader's background thread reads ahead without touching the original.
class DistributedSampler {
 public:
  /// `num_samples` N >= 0; 0 <= rank < world_size.
  DistributedSampler(std::size_t num_samples, int rank, int world_size, std::uint64_t seed,
                     SamplerOptions options = {})
      : num_samples_(num_samples), rank_(rank), world_(world_size), seed_(seed), opt_(options) {
    DTRAIN_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size, "DistributedSampler",
                   "rank " << rank << " is not in [0, world_size " << world_size << ")");
    rebuild();
  }

  /// Same, taking rank() and size() from a communicator or any group object that has them.
  template <class Group, class = std::enable_if_t<detail::has_rank_and_size<Group>::value>>
  DistributedSampler(std::size_t num_samples, const Group& group, std::uint64_t seed,
                     SamplerOptions options = {})
      : DistributedSampler(num_samples, static_cast<int>(group.rank()),
                           static_cast<int>(group.size()), seed, options) {}

  /// Starts epoch `e` at its beginning. Exception: right after a restore (visit_state with
  /// loading()) a call with the restored epoch keeps the restored position, so a loop that calls
  /// set_epoch(e) for e = sampler.epoch() .. resumes mid-epoch instead of restarting it.
  void set_epoch(std::int64_t e) {
    DTRAIN_REQUIRE(e >= 0, "DistributedSampler::set_epoch", "epoch " << e << " is negative");
    const bool keep = resumed_ && e == epoch_;
    resumed_ = false;
    if (keep) return;
    epoch_ = e;
    position_ = 0;
    rebuild();
  }

  /// Moves to an explicit global position of the current epoch; g >= N means the epoch is over.
  void set_position(std::uint64_t g) {
    position_ = g;
    resumed_ = false;
    ++generation_;
  }

  /// Changes N (for a growing in-memory dataset) and restarts the current epoch.
  void set_num_samples(std::size_t n) {
    num_samples_ = n;
    position_ = 0;
    resumed_ = false;
    rebuild();
  }

  std::int64_t epoch() const noexcept { return epoch_; }
  /// Global position in the epoch's permutation (entries consumed by all ranks together).
  std::uint64_t position() const noexcept { return position_; }
  std::uint64_t seed() const noexcept { return seed_; }
  std::size_t num_samples() const noexcept { return num_samples_; }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_; }
  const SamplerOptions& options() const noexcept { return opt_; }
  /// Changes whenever the state is set from outside (set_epoch, set_position, restore, resize),
  /// but not on advance(): lets a Loader notice that its read-ahead no longer applies.
  std::uint64_t generation() const noexcept { return generation_; }

  /// Entry k of the epoch's permutation, k in [0, N).
  std::int64_t permuted(std::uint64_t k) const noexcept {
    return perm_ ? (*perm_)[k] : static_cast<std::int64_t>(k);
  }

  /// Samples per rank left in the epoch from global position g (the same on every rank).
  std::uint64_t samples_per_rank_from(std::uint64_t g) const noexcept {
    if (g >= num_samples_) return 0;
    const std::uint64_t r = num_samples_ - g, w = static_cast<std::uint64_t>(world_);
    return opt_.tail == SamplerTail::pad ? (r + w - 1) / w : r / w;
  }
  /// Batches of `batch_size` this rank gets from global position g to the end of the epoch.
  std::size_t batches_from(std::uint64_t g, std::size_t batch_size) const {
    check_batch(batch_size, "DistributedSampler::batches_from");
    const std::uint64_t q = samples_per_rank_from(g);
    return static_cast<std::size_t>(opt_.drop_last ? q / batch_size
                                                   : (q + batch_size - 1) / batch_size);
  }
  /// Batches per rank in a whole epoch (from position 0) with this world size.
  std::size_t num_batches(std::size_t batch_size) const { return batches_from(0, batch_size); }
  /// Batches per rank left in the current epoch.
  std::size_t remaining_batches(std::size_t batch_size) const {
    return batches_from(position_, batch_size);
  }
  /// Rows of the batch that starts at global position g (0 when the epoch is over).
  std::size_t batch_rows_at(std::uint64_t g, std::size_t batch_size) const {
    check_batch(batch_size, "DistributedSampler::batch_rows_at");
    const std::uint64_t q = samples_per_rank_from(g);
    if (q == 0 || (opt_.drop_last && q < batch_size)) return 0;
    return static_cast<std::size_t>(q < batch_size ? q : batch_size);
  }
  /// This rank's dataset indices for the batch starting at global position g, in batch order.
  void indices_at(std::uint64_t g, std::size_t batch_size, std::vector<std::int64_t>& out) const {
    const std::size_t b = batch_rows_at(g, batch_size);
    out.resize(b);
    const std::uint64_t first = g + static_cast<std::uint64_t>(rank_) * b;
    for (std::size_t i = 0; i < b; ++i) out[i] = permuted((first + i) % num_samples_);
  }
  /// Global position after the batch that starts at g.
  std::uint64_t position_after(std::uint64_t g, std::size_t batch_size) const {
    return g + static_cast<std::uint64_t>(batch_rows_at(g, batch_size)) *
                   static_cast<std::uint64_t>(world_);
  }
  /// This rank's indices for the next batch (empty at the end of the epoch). Does not advance.
  std::vector<std::int64_t> next_indices(std::size_t batch_size) const {
    std::vector<std::int64_t> out;
    indices_at(position_, batch_size, out);
    return out;
  }
  /// Marks the next batch as consumed (the Loader calls this when it hands a batch over).
  void advance(std::size_t batch_size) { position_ = position_after(position_, batch_size); }

  /// Checkpoint protocol (<dtrain/core/state.hpp>): seed, epoch, position, num_samples and the
  /// options. Loading restores them (rank and world size stay those of the running job) and
  /// rebuilds the permutation; a different num_samples is an InvalidArgument, since positions
  /// would refer to another sequence.
  template <class V>
  void visit_state(V& v) {
    std::int64_t seed = static_cast<std::int64_t>(seed_);
    std::int64_t epoch = epoch_;
    std::int64_t position = static_cast<std::int64_t>(position_);
    std::int64_t num_samples = static_cast<std::int64_t>(num_samples_);
    std::int64_t shuffle = opt_.shuffle ? 1 : 0;
    std::string tail = name_of(opt_.tail);
    std::int64_t drop_last = opt_.drop_last ? 1 : 0;
    v.scalar("seed", seed);
    v.scalar("epoch", epoch);
    v.scalar("position", position);
    v.scalar("num_samples", num_samples);
    v.scalar("shuffle", shuffle);
    v.scalar("tail", tail);
    v.scalar("drop_last", drop_last);
    if (!v.loading()) return;
    const char* op = "DistributedSampler: restore";
    DTRAIN_REQUIRE(
        num_samples == static_cast<std::int64_t>(num_samples_), op,
        "the checkpoint is for " << num_samples << " samples, this dataset has " << num_samples_);
    DTRAIN_REQUIRE(epoch >= 0 && position >= 0, op,
                   "invalid epoch " << epoch << " / position " << position);
    DTRAIN_REQUIRE(tail == "pad" || tail == "drop", op, "unknown tail policy '" << tail << "'");
    SamplerOptions restored{shuffle != 0, tail == "pad" ? SamplerTail::pad : SamplerTail::drop,
                            drop_last != 0};
    if (restored.shuffle != opt_.shuffle || restored.tail != opt_.tail ||
        restored.drop_last != opt_.drop_last || static_cast<std::uint64_t>(seed) != seed_)
      DTRAIN_LOG(debug,
                 "DistributedSampler: restore replaces seed/options by the checkpoint's "
                 "(seed "
                     << static_cast<std::uint64_t>(seed) << ", tail " << tail << ", shuffle "
                     << shuffle << ", drop_last " << drop_last << ")");
    seed_ = static_cast<std::uint64_t>(seed);
    opt_ = restored;
    epoch_ = epoch;
    position_ = static_cast<std::uint64_t>(position);
    rebuild();
    resumed_ = true;
  }

 private:
  static void check_batch(std::size_t b, const char* op) {
    DTRAIN_REQUIRE(b >= 1, op, "batch size must be at least 1");
  }
  // The permutation is computed eagerly whenever (seed, epoch, N) change, so that every const
  // member is a pure read and copies can be used from other threads.
  void rebuild() {
    ++generation_;
    if (!opt_.shuffle) {
      perm_.reset();
      return;
    }
    auto p = std::make_shared<std::vector<std::int64_t>>(num_samples_);
    for (std::size_t i = 0; i < num_samples_; ++i) (*p)[i] = static_cast<std::int64_t>(i);
    // Stream tag keeps sampler draws apart from other users of the same seed (initialisation,
    // dropout), which take small stream numbers.
    RngStream rng(seed_, kStreamTag ^ static_cast<std::uint64_t>(epoch_));
    for (std::size_t i = num_samples_; i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(rng.below(i));
      std::swap((*p)[i - 1], (*p)[j]);
    }
    perm_ = std::move(p);
  }

  static constexpr std::uint64_t kStreamTag = 0x5348554646000000ull;  // "SHUFF"

  std::size_t num_samples_;
  int rank_, world_;
  std::uint64_t seed_;
  SamplerOptions opt_;
  std::int64_t epoch_ = 0;
  std::uint64_t position_ = 0;
  std::uint64_t generation_ = 0;
  bool resumed_ = false;
  std::shared_ptr<const std::vector<std::int64_t>> perm_;
};

}  // namespace dtrain
