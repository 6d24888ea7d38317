// dtrain: notification rings for backends without immediate data (loopback RMA, MPI RMA). The
// receiver keeps one ring of 64-bit entries per sender; the sender's n-th notification stores
// ((n + 1) << 32) | imm into entry n mod ring size, after its data is in place. The protocol's
// credits keep at most ring-size notifications outstanding, so an entry is never overwritten
// before it was read.
#pragma once

#include <cstdint>

namespace dtrain::detail::rma {

/// The entry value of notification `n` carrying `imm`.
inline std::uint64_t ring_entry(std::uint64_t n, std::uint32_t imm) noexcept {
  return ((n + 1) << 32) | imm;
}

/// Reads the next notification of one ring into `imm`: true when notification `rx` arrived
/// (rx then advances). When it has not but notification rx + 1 has (a writer stores its
/// notifications in order, so rx was lost), returns rx + 1's value and skips rx, so that the
/// protocol's sequence check reports the loss. Local; `ring` is shared memory peers store into.
inline bool read_ring(const std::uint64_t* ring, std::uint64_t size, std::uint64_t& rx,
                      std::uint32_t& imm) noexcept {
  auto arrived = [&](std::uint64_t n) {
    const std::uint64_t v = __atomic_load_n(&ring[n % size], __ATOMIC_ACQUIRE);
    imm = static_cast<std::uint32_t>(v);
    return (v >> 32) == ((n + 1) & 0xffffffffu);
  };
  if (arrived(rx)) {
    ++rx;
    return true;
  }
  // Entry rx + 1 seen (acquire) means its writer's earlier store of entry rx is visible too:
  // if rx is still missing on a second look, it was never written.
  if (size < 2 || !arrived(rx + 1)) return false;
  const std::uint32_t later = imm;
  if (arrived(rx)) {
    ++rx;
    return true;
  }
  imm = later;
  rx += 2;
  return true;
}

}  // namespace dtrain::detail::rma
