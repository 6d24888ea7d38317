// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the RDMA verbs transport, the one-sided protocol (<dtrain/transports/one_sided/
// protocol.hpp>) over libibverbs reliable-connected queue pairs, bootstrapped over the
// application's MPI communicator. Needs dtrain::ibverbs and dtrain::mpi. The protocol logic is
// the one tested over loopback RMA and MPI RMA; this backend only maps it onto verbs.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include <dtrain/comm/detail/peer_liveness.hpp>
#include <dtrain/core/env.hpp>
#include <dtrain/transports/one_sided/ibverbs_backend.hpp>
#include <dtrain/transports/one_sided/mpi_backend.hpp>
#include <dtrain/transports/one_sided/protocol.hpp>

namespace dtrain {

/// `IbverbsTransport t(comm)`, `IbverbsTransport t(OneSidedConfig{...}, comm)` or
/// `IbverbsTransport t(OneSidedConfig{...}, comm, IbverbsDeviceConfig{...}[, timeout_s])`:
/// collective over `comm` (duplicated), which carries only the start-up exchange of queue-pair
/// numbers, LIDs/GIDs, PSNs, addresses and keys, and of the processes of the ranks on this node,
/// and the closing agreement. `timeout_s` (default kDefaultTimeout; from DTRAIN_COMM_TIMEOUT_S in
/// the constructors that read the environment) bounds each of those collective steps: a rank
/// that never arrives (failed or stopped before) ends the job during the setup, with a message
/// from every waiting rank, and makes the close leave the communicator allocated. Throws
/// TransportError when no RDMA device or active port is found. Satisfies is_transport_v; used
/// by one thread at a time.
class IbverbsTransport : public OneSidedTransport<detail::IbverbsBackend> {
 public:
  static constexpr double kDefaultTimeout = 300;

  /// The device choice of the environment (IbverbsDeviceConfig::from_env) and its deadline
  /// (DTRAIN_COMM_TIMEOUT_S, strictly parsed), read here.
  explicit IbverbsTransport(MPI_Comm comm) : IbverbsTransport(OneSidedConfig{}, comm) {}
  /// The device choice and deadline of the environment, read here (as above).
  IbverbsTransport(const OneSidedConfig& cfg, MPI_Comm comm)
      : IbverbsTransport(cfg, comm, IbverbsDeviceConfig::from_env(),
                         env::get_double("DTRAIN_COMM_TIMEOUT_S", kDefaultTimeout, 1e-3, 1e9)) {}
  /// Exactly `device` and `timeout_s` (reads no environment).
  IbverbsTransport(const OneSidedConfig& cfg, MPI_Comm comm, const IbverbsDeviceConfig& device,
                   double timeout_s = kDefaultTimeout)
      : OneSidedTransport<detail::IbverbsBackend>(cfg, comm, device, timeout_s),
        peers_(survey(comm, timeout_s)) {}

  /// Local, never throws: what Linux reports about `peer`'s process when it runs on this node;
  /// PeerState::unknown otherwise. Timeout messages use it to name a stopped or exited rank.
  detail::PeerStatus peer_status(int peer) const noexcept {
    if (peer < 0 || peer >= size() || peer == rank()) return {};
    return detail::process_status(peers_[static_cast<std::size_t>(peer)]);
  }

 private:
  static std::vector<detail::ProcessId> survey(MPI_Comm comm, double timeout_s) {
    const detail::IoWatchdog setup_watch = detail::mpi_setup_watchdog(
        comm, timeout_s, "IbverbsTransport (node survey)", detail::IbverbsBackend::kTimeoutOption);
    return detail::mpi_node_survey(comm, "IbverbsTransport").processes;
  }

  std::vector<detail::ProcessId> peers_;  // same-node peers' processes; pid 0 elsewhere
};

static_assert(detail::check_transport<IbverbsTransport>(), "");

}  // namespace dtrain
