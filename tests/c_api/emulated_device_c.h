/* SPDX-License-Identifier: BSD-3-Clause */
/* Test support: device 0 of the C API's test builds (tests/c_api/emulated_policy.hpp) from C and
 * Fortran: allocate its memory and copy to and from it (each copy waits until it is done). */
#ifndef DTRAIN_TEST_EMULATED_DEVICE_C_H
#define DTRAIN_TEST_EMULATED_DEVICE_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void* test_device_alloc(size_t bytes);
void test_device_free(void* p, size_t bytes);
void test_device_upload(void* device_dst, const void* host_src, size_t bytes);
void test_device_download(void* host_dst, const void* device_src, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
