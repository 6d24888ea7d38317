// dtrain: memory allocators. Arenas and tensors take one, so that a transport or a GPU runtime can
// supply memory it reaches directly (registered, node-shared or device memory).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <memory>
#include <new>

#include <dtrain/core/error.hpp>
#include <dtrain/core/space.hpp>

namespace dtrain {

/// Allocator interface. Implementations must be thread-safe; allocate never returns null for a
/// non-zero size (it throws). The allocator must outlive every block it handed out.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns `bytes` bytes aligned to at least `alignment` (a power of two).
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  /// Frees a block returned by allocate with the same size. Never throws.
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  /// Where the memory lives.
  virtual Space space() const noexcept = 0;
};

/// Zero-initialised, 64-byte aligned host memory from the C heap. Stateless; thread-safe.
class HostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) return nullptr;
    if (alignment < 64) alignment = 64;
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p)
      raise<Error>("HostAllocator::allocate",
                   "out of host memory for " + std::to_string(bytes) + " B");
    std::memset(p, 0, rounded);
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { std::free(p); }
  Space space() const noexcept override { return Space::host; }
};

/// The process-wide default host allocator.
inline Allocator& default_allocator() noexcept {
  static HostAllocator instance;
  return instance;
}

}  // namespace dtrain
