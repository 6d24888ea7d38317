// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the MPI-RMA transport, the one-sided protocol (<dtrain/transports/one_sided/
// protocol.hpp>) over MPI-3 one-sided communication on any communicator the application hands
// in. Needs dtrain::mpi. The same protocol runs over raw verbs (<dtrain/transports/ibverbs.hpp>).
#pragma once

#include <dtrain/transports/one_sided/mpi_backend.hpp>
#include <dtrain/transports/one_sided/protocol.hpp>

namespace dtrain {

/// `MpiRmaTransport t(comm)` or `MpiRmaTransport t(OneSidedConfig{...}, comm)`: collective over
/// `comm` (duplicated; any communicator works). Satisfies is_transport_v. Used by one thread at a
/// time; a progress thread is allowed at MPI_THREAD_MULTIPLE.
using MpiRmaTransport = OneSidedTransport<detail::MpiRmaBackend>;

static_assert(detail::check_transport<MpiRmaTransport>(), "");

}  // namespace dtrain
