// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the host snapshot of a checkpoint's tensors (asynchronous saves write from it while
// training goes on), and the checksums of replicated tensors computed in parallel over the ranks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/assemble.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::detail {

/// Copies a tensor entry's `bytes` bytes from its source memory (entry.data) into host memory.
/// This is the one place where the checkpoint code reads tensor memory for a snapshot: host
/// tensors are memcpy'd; exec-memory tensors (entry.device set) are queued on their policy's
/// copy, and the caller must call the copier's wait() before reading `host_dst`.
using CkptCopyToHost = void (*)(void* host_dst, const CkptEntry& src, std::size_t bytes);

inline void ckpt_copy_to_host(void* host_dst, const CkptEntry& src, std::size_t bytes) {
  if (src.device)
    src.device.download(src.device.exec, host_dst, src.data, bytes);
  else if (bytes)
    std::memcpy(host_dst, src.data, bytes);
}

/// Which entries SnapshotArena::take copies.
enum class SnapshotOf : unsigned char {
  device,        ///< exec-memory tensors only (staged before anything reads the entries)
  caller_memory  ///< every tensor still in caller memory (asynchronous saves)
};

/// A host snapshot buffer: one arena kept between saves, so that a later snapshot costs a copy,
/// not fresh page faults. Local; owned by one Checkpointer. The entries pointed into it stay
/// valid until the next take().
class SnapshotArena {
 public:
  /// Copies the selected tensor entries of `lists` into the arena (through `copy`; device
  /// copies are all queued first, then waited for once per policy) and points each entry there
  /// (marked `staged`, no longer device memory). Blocking; TimeoutError from a device wait.
  void take(std::initializer_list<std::vector<CkptEntry>*> lists, SnapshotOf which,
            CkptCopyToHost copy = &ckpt_copy_to_host) {
    auto aligned = [](std::size_t n) { return (n + 63) / 64 * 64; };
    auto selected = [which](const CkptEntry& e) {
      if (e.kind != EntryKind::tensor || !e.storage.empty() || e.staged) return false;
      return which == SnapshotOf::caller_memory || static_cast<bool>(e.device);
    };
    std::size_t total = 0;
    for (const auto* list : lists)
      for (const auto& e : *list)
        if (selected(e)) total += aligned(e.bytes());
    if (total > bytes_) {
      arena_.reset(new unsigned char[total]);
      bytes_ = total;
    }
    std::size_t off = 0;
    std::vector<ExecCopier> to_wait;
    for (auto* list : lists)
      for (auto& e : *list) {
        if (!selected(e)) continue;
        const std::size_t n = e.bytes();
        copy(arena_.get() + off, e, n);
        if (e.device) {
          bool known = false;
          for (const auto& c : to_wait) known = known || c.exec == e.device.exec;
          if (!known) to_wait.push_back(e.device);
        }
        e.data = arena_.get() + off;
        e.device = ExecCopier{};
        e.staged = true;
        off += aligned(n);
      }
    for (const auto& c : to_wait) c.wait(c.exec, "checkpoint save: download of device tensors");
  }
  /// Frees the arena (the entries pointed into it must no longer be read).
  void release() noexcept {
    arena_.reset();
    bytes_ = 0;
  }
  /// Bytes held for the next take().
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::unique_ptr<unsigned char[]> arena_;
  std::size_t bytes_ = 0;
};

/// This rank's byte-balanced share of the checksums of the first n (replicated) entries, into
/// crcs (zeros elsewhere, so that an allreduce(sum) assembles them: replicas are identical).
/// With skip_rank0 rank 0 gets no share (it is busy writing). Local.
inline void crc_share(const std::vector<CkptEntry>& entries, std::size_t n,
                      std::vector<std::int64_t>& crcs, int rank, int p, bool skip_rank0) {
  const int first = skip_rank0 && p > 1 ? 1 : 0;
  std::vector<std::size_t> load(static_cast<std::size_t>(p - first), 0);
  for (std::size_t i = 0; i < n; ++i) {
    // Tensors assembled from parts have their checksum from rank 0 (parts_crcs).
    if (entries[i].kind != EntryKind::tensor || entries[i].sharded) continue;
    const auto k =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[k] += entries[i].bytes() + 1;
    if (static_cast<int>(k) + first == rank)
      crcs[i] = static_cast<std::int64_t>(crc32c(entries[i].data, entries[i].bytes()));
  }
}

/// Collective: checksums of the replicated tensors `repl`, computed in parallel over the ranks.
template <class Comm>
void fill_replicated_crcs(Comm& comm, std::vector<CkptEntry>& repl) {
  std::vector<std::int64_t> crcs(repl.size(), 0);
  crc_share(repl, repl.size(), crcs, comm.rank(), comm.size(), false);
  parts_crcs(repl, repl.size(), crcs, comm.rank());
  if (comm.size() > 1 && !crcs.empty())
    comm.allreduce(BufferView(crcs.data(), crcs.size(), DType::i64), ReduceOp::sum);
  for (std::size_t i = 0; i < repl.size(); ++i) repl[i].crc = static_cast<std::uint32_t>(crcs[i]);
}

}  // namespace dtrain::detail
