// SPDX-License-Identifier: BSD-3-Clause
// dtrain: which RDMA device, port and GID the verbs transport uses. Needs nothing but the C++
// library (no libibverbs), so the environment reading is checked on any machine.
#pragma once

#include <string>

#include <dtrain/core/env.hpp>

namespace dtrain {

/// Device, port and GID choice of IbverbsTransport. The defaults pick the first device with an
/// active port, its first active port, and on Ethernet (RoCE) the first RoCE v2 GID of that port.
struct IbverbsDeviceConfig {
  std::string device;  ///< device name (ibv_devices), empty: the first with an active port
  int port = 0;        ///< 1-based port number, 0: the first active port
  int gid_index = -1;  ///< GID table index, -1: automatic (RoCE v2 on Ethernet, none on IB)

  /// Local. The choice from DTRAIN_IB_DEVICE (name), DTRAIN_IB_PORT (1-255) and
  /// DTRAIN_IB_GID_INDEX (0-65535), read strictly here and nowhere else: a value that is not an
  /// integer in range is an InvalidArgument naming the variable. Unset or empty: the default.
  static IbverbsDeviceConfig from_env() {
    IbverbsDeviceConfig c;
    if (const auto name = env::get("DTRAIN_IB_DEVICE")) c.device = *name;
    c.port = static_cast<int>(env::get_int("DTRAIN_IB_PORT", c.port, 1, 255));
    c.gid_index = static_cast<int>(env::get_int("DTRAIN_IB_GID_INDEX", c.gid_index, 0, 65535));
    return c;
  }
};

}  // namespace dtrain
