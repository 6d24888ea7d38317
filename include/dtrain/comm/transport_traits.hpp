// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what a transport must provide and what it may, checked at compile time.
//
// A transport moves bytes between the ranks of one fixed group; the collective algorithms
// (<dtrain/comm/communicator.hpp>) are written once against its vocabulary. Each part has its
// own header, and this one includes them all:
//   transport_requirements.hpp   Request, rank/size, isend/irecv, test/wait_until, cancel;
//                                is_transport_v and check_transport (required)
//   transport_registration.hpp   MemoryRegion, register_memory/deregister_memory (required)
//   transport_capabilities.hpp   device memory, registration, one-sided and thread-safety flags,
//                                run-time capabilities, progress-thread query (optional)
//   transport_channels.hpp       persistent, plan-scoped channels; channel_tag (optional)
//   shared_segments.hpp          node-shared memory for the shm algorithm (optional)
//   shared_segment_config.hpp    the segments' sizing and the fake-node grouping
// Every optional member is detected (<dtrain/core/detect.hpp>), never declared and forgotten: a
// transport without it gets the fallback its header names.
#pragma once

#include <dtrain/comm/shared_segment_config.hpp>
#include <dtrain/comm/shared_segments.hpp>
#include <dtrain/comm/transport_capabilities.hpp>
#include <dtrain/comm/transport_channels.hpp>
#include <dtrain/comm/transport_registration.hpp>
#include <dtrain/comm/transport_requirements.hpp>
