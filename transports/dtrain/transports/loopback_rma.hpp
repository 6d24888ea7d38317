// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the loopback RMA transport, N ranks as N threads of one process running the one-sided
// protocol (<dtrain/transports/one_sided/protocol.hpp>) over memcpy and atomic flags. It runs
// the very logic the MPI-RMA and verbs transports run, so that logic is tested in one process,
// including its error paths (LoopbackRmaWorld::inject).
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <dtrain/transports/one_sided/loopback_backend.hpp>
#include <dtrain/transports/one_sided/protocol.hpp>

namespace dtrain {

/// One rank of a LoopbackRmaWorld: `LoopbackRmaTransport t(world, rank)` or
/// `LoopbackRmaTransport t(OneSidedConfig{...}, world, rank)`. Construction is collective over
/// the world's ranks (each on its own thread). Satisfies is_transport_v.
using LoopbackRmaTransport = OneSidedTransport<detail::LoopbackRmaBackend>;

static_assert(detail::check_transport<LoopbackRmaTransport>(), "");

/// Runs `body` on `n` threads, one per rank of `world` (its size must be n), each with its own
/// LoopbackRmaTransport built with `cfg` and its rank set for messages. When a rank throws, the
/// world is aborted (the others' waits throw RemoteError instead of running into their
/// deadlines); after all threads are joined the first exception thrown is rethrown. Blocking.
inline void run_loopback_rma(LoopbackRmaWorld& world, const OneSidedConfig& cfg,
                             const std::function<void(LoopbackRmaTransport&)>& body) {
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r)
    threads.emplace_back([&, r] {
      detail::RankScope scope(r);
      try {
        LoopbackRmaTransport t(cfg, world, r);
        body(t);
      } catch (...) {
        std::string why = "unknown exception";
        try {
          throw;
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
        }
        {
          std::lock_guard<std::mutex> lock(m);
          if (!first) first = std::current_exception();
        }
        world.abort(r, why);
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

/// Same on a fresh world of `n` ranks with default settings.
inline void run_loopback_rma(int n, const std::function<void(LoopbackRmaTransport&)>& body) {
  LoopbackRmaWorld world(n);
  run_loopback_rma(world, OneSidedConfig{}, body);
}

}  // namespace dtrain
