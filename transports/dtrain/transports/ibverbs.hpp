// dtrain: the RDMA verbs transport, the one-sided protocol (<dtrain/transports/one_sided/
// protocol.hpp>) over libibverbs reliable-connected queue pairs, bootstrapped over the
// application's MPI communicator. Needs dtrain::ibverbs and dtrain::mpi. The protocol logic is
// the one tested over loopback RMA and MPI RMA; this backend only maps it onto verbs.
#pragma once

#include <dtrain/transports/one_sided/ibverbs_backend.hpp>
#include <dtrain/transports/one_sided/protocol.hpp>

namespace dtrain {

/// `IbverbsTransport t(comm)` or `IbverbsTransport t(OneSidedConfig{...}, comm)`: collective
/// over `comm` (duplicated), which carries only the start-up exchange of queue-pair numbers,
/// LIDs/GIDs, PSNs, addresses and keys. Throws TransportError when no RDMA device or active port
/// is found. Satisfies is_transport_v; used by one thread at a time.
using IbverbsTransport = OneSidedTransport<detail::IbverbsBackend>;

static_assert(detail::check_transport<IbverbsTransport>(), "");

}  // namespace dtrain
