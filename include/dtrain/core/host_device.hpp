// SPDX-License-Identifier: BSD-3-Clause
// dtrain: DTRAIN_HOST_DEVICE, the annotation for functions that host and device code share.
//
// Under nvcc or hipcc it expands to __host__ __device__, so one definition (the f16/bf16
// conversions, the counter-based dropout mask, the optimizer element updates) is compiled for both
// sides; a plain C++ compiler sees nothing. Only the annotation differs between compilers, never
// the body, so a host translation unit and a device translation unit that both use such a function
// agree on what it computes.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DTRAIN_HOST_DEVICE __host__ __device__
#else
#define DTRAIN_HOST_DEVICE
#endif
