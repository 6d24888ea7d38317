// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the allocator over one rank's node-shared heap (SharedSegmentConfig::heap_bytes).
// Memory from it lies in a segment that every rank of the node maps, so the shm all-reduce reads
// a buffer there in place instead of having its owner copy it into the segment's slots first
// (detail/algo/shm.hpp). A model built on Communicator::shared_allocator() keeps its parameter and
// gradient arenas there; nothing else about the model changes (it sees an Allocator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {

/// Allocator over [base, base + bytes) (one rank's node-shared heap), first fit with coalescing
/// of freed neighbours. Blocks are zeroed (by the owning rank, so their pages are first touched
/// where they are used) and, from HostAllocator::kStaggerBytes on, staggered within a page as
/// HostAllocator's are. A request that does not fit (or any request without a heap) is served by
/// `fallback` instead, so code written for the heap runs unchanged where there is none;
/// owns() tells which. A freed block of at least kReleaseMinBytes gives its pages back to the
/// system (they would otherwise stay resident in every process that touched them). Thread-safe.
/// The heap's memory and `fallback` must outlive every block.
class SharedHeapAllocator final : public Allocator {
 public:
  SharedHeapAllocator(unsigned char* base, std::size_t bytes,
                      Allocator& fallback = default_allocator())
      : base_(base), bytes_(base ? bytes : 0), fallback_(&fallback) {
    if (bytes_) free_.emplace(0, bytes_);
  }
  SharedHeapAllocator(const SharedHeapAllocator&) = delete;
  SharedHeapAllocator& operator=(const SharedHeapAllocator&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) return nullptr;
    if (alignment < 64) alignment = 64;
    DTRAIN_REQUIRE((alignment & (alignment - 1)) == 0, "SharedHeapAllocator::allocate",
                   "alignment " << alignment << " is not a power of two");
    unsigned char* got = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::size_t skew =
          bytes >= HostAllocator::kStaggerBytes ? staggered_offset(next_, alignment) : 0;
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        const std::size_t start = it->first, len = it->second;
        const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(base_ + start);
        const std::size_t pad = (alignment - at % alignment) % alignment + skew;
        if (pad > len || len - pad < bytes) continue;
        // Take [start, start + pad + bytes) and keep the rest free.
        const std::size_t used = pad + bytes;
        free_.erase(it);
        if (len > used) free_.emplace(start + used, len - used);
        got = base_ + start + pad;
        blocks_.emplace(got, Block{start, used});
        used_ += used;
        if (skew) ++next_;
        break;
      }
    }
    if (!got) return fallback_->allocate(bytes, alignment);
    std::memset(got, 0, bytes);  // outside the lock: the block is this caller's already
    return got;
  }

  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (!p) return;
    if (!owns(p)) {
      fallback_->deallocate(p, bytes);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const auto b = blocks_.find(static_cast<unsigned char*>(p));
    if (b == blocks_.end()) return;  // not a block of this heap: nothing to give back
    std::size_t start = b->second.start, len = b->second.bytes;
    used_ -= len;
    blocks_.erase(b);
    release_pages(start, len);
    // Merge with the free neighbours on both sides.
    auto next = free_.lower_bound(start);
    if (next != free_.end() && next->first == start + len) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_.emplace(start, len);
  }

  Space space() const noexcept override { return Space::host; }

  /// Whether `p` lies in the heap (a block of it, not one of the fallback's).
  bool owns(const void* p) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto b = reinterpret_cast<std::uintptr_t>(base_);
    return bytes_ && a >= b && a - b < bytes_;
  }
  /// The heap's size (0: none, every block comes from the fallback).
  std::size_t capacity() const noexcept { return bytes_; }
  /// Bytes of the heap in blocks now, alignment and stagger included.
  std::size_t used() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return used_;
  }
  /// Freed blocks at least this large give their whole pages back to the system.
  static constexpr std::size_t kReleaseMinBytes = 1u << 20;
  /// Bytes given back to the system so far (pages of freed blocks, see deallocate()).
  std::size_t released() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return released_;
  }

 private:
  // A page of node-shared memory stays resident after its block is freed, counted in every
  // process that touched it, until it is removed from the shared memory object: the pages wholly
  // inside a freed block of at least kReleaseMinBytes are removed (MADV_REMOVE; the next block
  // there is zeroed by allocate() anyway). Best effort: memory that is not a shared mapping (a
  // heap in private memory, as ranks-as-threads tests make) refuses it and stays as it is. Under
  // the lock, so no allocation takes the range meanwhile; nobody else reads a freed block.
  void release_pages(std::size_t start, std::size_t len) noexcept {
#if defined(MADV_REMOVE)
    static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    if (page == 0 || page > kReleaseMinBytes) return;
    const auto at = reinterpret_cast<std::uintptr_t>(base_ + start);
    const std::uintptr_t lo = (at + page - 1) / page * page, hi = (at + len) / page * page;
    if (hi <= lo || hi - lo < kReleaseMinBytes) return;
    if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_REMOVE) == 0) released_ += hi - lo;
#else
    (void)start;
    (void)len;
#endif
  }

  struct Block {
    std::size_t start, bytes;  // the range taken from the free list, padding included
  };
  unsigned char* base_;
  std::size_t bytes_;
  Allocator* fallback_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, disjoint, never adjacent
  std::map<unsigned char*, Block> blocks_;
  std::size_t used_ = 0;
  std::size_t next_ = 0;      // staggered blocks handed out
  std::size_t released_ = 0;  // bytes given back by release_pages
};

}  // namespace dtrain
