// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the narrow interface under the one-sided protocol (<dtrain/transports/one_sided/
// protocol.hpp>), and the types it passes. Three backends implement it: loopback RMA (threads of
// one process), MPI-3 RMA (dynamic windows) and libibverbs (reliable-connected queue pairs).
//
// A backend B provides, for one fixed group of ranks:
//
//   static constexpr const char* name;           "loopback-rma", "mpi-rma", "ibverbs"
//   int rank() const;  int size() const;
//   void exchange(const void* mine, std::size_t bytes, void* all);
//       collective, construction only: all-gather of `bytes` bytes from every rank (bootstrap)
//   void open(int notifications);
//       collective, once, before any post: connect to every peer so that up to `notifications`
//       notified writes from one peer can be outstanding at this rank (receive queue depth)
//   Region register_memory(void* data, std::size_t bytes, Access access);
//   void deregister_memory(Region&) noexcept;
//   bool write(int peer, const void* src, const Region& src_region, std::size_t bytes,
//              RemoteAddr dst, std::uint64_t wr_id, bool signaled, const std::uint32_t* imm);
//       one-sided write of [src, src+bytes) (inside src_region) to dst at `peer`; with `imm`, the
//       peer's poll later reports a notification carrying *imm, which it sees only after the
//       data. Writes to one peer take effect and complete in the order they were posted. A
//       signaled write reports write_done(wr_id) once the source may be reused; it also stands
//       for every earlier write to that peer. Returns false (nothing posted) when the send queue
//       to `peer` is full: the caller polls and retries.
//   bool write_word(int peer, std::uint64_t value, RemoteAddr dst, std::uint64_t wr_id,
//                   bool signaled);
//       stores one aligned 64-bit word at the peer, atomically (credit return); no notification.
//   std::uint64_t load_word(const std::uint64_t* word);
//       reads a local word that peers store with write_word
//   int poll(Event* out, int max);
//       non-blocking: up to `max` events (local write completions, notifications, failures)
//   void close(bool failing) noexcept;
//       collective unless `failing`: the last call; returns once no peer writes here any more
//   void check_alive();
//       throws RemoteError when the backend learnt that another rank failed (loopback world)
//
// Every call is made by one thread at a time (the transport's owner or its progress thread).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::one_sided {

/// What peers may do with a registered range: nothing (`local`, a write source only) or write
/// into it (`remote_write`). Registrations grant no more than that.
enum class Access { local, remote_write };

/// One registered range as a backend returns it. `addr` is the address peers write to. `rkey` is
/// what a peer needs to write into it (ibv_mr::rkey, a loopback key, 0 for MPI dynamic windows),
/// `lkey` what a local write needs to read from it; `handle` is backend-private (ibv_mr*). Value
/// type.
struct Region {
  void* data = nullptr;
  std::size_t bytes = 0;
  std::uint64_t addr = 0;  ///< `data` as peers address it (MPI_Get_address for MPI windows)
  std::uint64_t rkey = 0;
  std::uint64_t lkey = 0;
  void* handle = nullptr;
};

/// Where a write lands at the peer: an address in the peer's address space and its key.
struct RemoteAddr {
  std::uint64_t addr = 0;
  std::uint64_t rkey = 0;
  RemoteAddr offset(std::uint64_t bytes) const noexcept { return {addr + bytes, rkey}; }
};

/// One event reported by a backend's poll.
struct Event {
  enum Kind : int {
    write_done,  ///< signaled write `wr_id` to `peer` (and every earlier one) completed
    notified,    ///< `peer` finished a notified write here; `imm` is its immediate value
    failed       ///< a work request failed; the first one is the error, later ones echo it
  };
  Kind kind = write_done;
  int peer = -1;
  std::uint64_t wr_id = 0;
  std::uint32_t imm = 0;
  // failed only: the backend's own status, numeric code, queue pair and opcode where it has them
  const char* status = "";
  int code = 0;
  std::uint32_t qp = 0;
  const char* opcode = "";
};

}  // namespace dtrain::one_sided
