// SPDX-License-Identifier: BSD-3-Clause
// Test support: tests/c_api/emulated_device_c.h over the C API's emulated device 0.
#include "emulated_device_c.h"

#include "emulated_policy.hpp"

extern "C" {

void* test_device_alloc(size_t bytes) {
  return dtrain_c_device::policy(0).allocator().allocate(bytes, 64);
}

void test_device_free(void* p, size_t bytes) {
  dtrain_c_device::policy(0).allocator().deallocate(p, bytes);
}

void test_device_upload(void* device_dst, const void* host_src, size_t bytes) {
  auto& d = dtrain_c_device::policy(0);
  d.copy_h2d(d.compute_stream(), device_dst, host_src, bytes);
  dtrain::exec_synchronize(d, d.compute_stream(), 60, "test_device_upload");
}

void test_device_download(void* host_dst, const void* device_src, size_t bytes) {
  auto& d = dtrain_c_device::policy(0);
  d.copy_d2h(d.compute_stream(), host_dst, device_src, bytes);
  dtrain::exec_synchronize(d, d.compute_stream(), 60, "test_device_download");
}

}  // extern "C"
