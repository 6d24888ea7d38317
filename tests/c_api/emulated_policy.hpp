// Test support: the C API's device policy in a test build (DTRAIN_C_DEVICE_POLICY_HEADER, see
// bindings/c/dtrain_c.cpp): device 0 is one process-wide emulated device, whose memory host code
// cannot read (tests/support/emulated_device.hpp), so that dtrain_create_on and the _device calls
// run and their errors show on a machine without a GPU. Test-only: it never ships.
#pragma once

#include "support/emulated_device.hpp"

namespace dtrain_c_device {
using Policy = dtrain::test::EmulatedDevice;
inline const char* const name = "emulated";
inline Policy& policy(int device) {
  DTRAIN_REQUIRE(device == 0, "dtrain_create_on",
                 "device " << device << " but the emulated build has device 0 only");
  static Policy p;
  return p;
}
inline bool is_device_memory(const void* p) { return policy(0).is_device(p); }
}  // namespace dtrain_c_device
