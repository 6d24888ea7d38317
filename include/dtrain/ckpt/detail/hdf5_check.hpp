// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the checkpoint code's names for the shared HDF5 support in <dtrain/detail/hdf5.hpp>
// (one session type, handle type and check macro for data and checkpoints).
#pragma once

#include <dtrain/detail/hdf5.hpp>

namespace dtrain::detail::ckpt_h5 {

using detail::H5Handle;
using detail::H5Session;

}  // namespace dtrain::detail::ckpt_h5
