// SPDX-License-Identifier: BSD-3-Clause
// dtrain: umbrella header for the core (no MPI, no GPU runtime, no HDF5, no verbs).
#pragma once

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/space.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/core/version.hpp>
