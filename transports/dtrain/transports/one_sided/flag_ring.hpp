// SPDX-License-Identifier: BSD-3-Clause
// dtrain: notification rings for backends without immediate data (loopback RMA, MPI RMA). The
// receiver keeps one ring of 64-bit entries per sender; the sender's n-th notification stores
// ((n + 1) << 32) | imm into entry n mod ring size, after its data is in place. The protocol's
// credits keep at most ring-size notifications outstanding, so an entry is never overwritten
// before it was read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <dtrain/transports/one_sided/backend.hpp>

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

/// Appends the notifications that arrived in `peer`'s ring to out[n..max) as events; returns
/// the new n.
inline int ring_events(const std::uint64_t* ring, std::uint64_t size, std::uint64_t& rx, int peer,
                       one_sided::Event* out, int n, int max) noexcept {
  std::uint32_t imm = 0;
  while (n < max && read_ring(ring, size, rx, imm)) {
    one_sided::Event e;
    e.kind = one_sided::Event::notified;
    e.peer = peer;
    e.imm = imm;
    out[n++] = e;
  }
  return n;
}

/// Events of backends whose writes finish inside the posting call (loopback, MPI), kept for
/// the next poll. Local.
class EventQueue {
 public:
  void done(int peer, std::uint64_t wr_id) {
    one_sided::Event e;
    e.kind = one_sided::Event::write_done;
    e.peer = peer;
    e.wr_id = wr_id;
    events_.push_back(e);
  }
  void failed(int peer, std::uint64_t wr_id, const char* status, int code, const char* opcode) {
    one_sided::Event e;
    e.kind = one_sided::Event::failed;
    e.peer = peer;
    e.wr_id = wr_id;
    e.status = status;
    e.code = code;
    e.opcode = opcode;
    events_.push_back(e);
  }
  /// Moves up to `max` queued events to `out`; returns how many.
  int drain(one_sided::Event* out, int max) {
    int n = 0;
    while (n < max && head_ < events_.size()) out[n++] = events_[head_++];
    if (head_ == events_.size()) {
      events_.clear();
      head_ = 0;
    }
    return n;
  }

 private:
  std::vector<one_sided::Event> events_;
  std::size_t head_ = 0;
};

}  // namespace dtrain::detail::rma
