// SPDX-License-Identifier: BSD-3-Clause
// The execution policy behind --device, for MPI examples (not part of the library).
//
// On the CPU the layers' GEMM is the host policy's: CBLAS when the build links it
// (DTRAIN_HAVE_CBLAS=1), else dtrain's blocked kernel. A program compiled by nvcc or hipcc with
// DTRAIN_EXAMPLE_GPU=1 can also run on the GPU: the vendor BLAS (cuBLAS / hipBLAS) where the build
// has it, else dtrain's tiled kernel (on an H200 it ran the MLP's GEMMs at 0.12-0.63x cuBLAS:
// benchmarks/RESULTS.md).
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <utility>

#include <dtrain/exec/host_exec.hpp>
#include <dtrain/train/agreed.hpp>
#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
#include <dtrain/kernels/host/blas_exec.hpp>
#endif

#include "common/device.hpp"

namespace dtrain_cli {

#if defined(DTRAIN_HAVE_CBLAS) && DTRAIN_HAVE_CBLAS
using HostPolicy = dtrain::HostBlasExec;
#else
using HostPolicy = dtrain::HostExec;
#endif
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
#if defined(DTRAIN_GPU_VENDOR_BLAS)
using GpuPolicy = dtrain::GpuBlasExec;
#else
using GpuPolicy = dtrain::GpuExec;
#endif
#endif

/// Collective over `comm` (resolve_device). Resolves --device `want` on every rank, makes the
/// execution policy it names (HostPolicy, or GpuPolicy on the rank's GPU) and returns
/// f(exec, device); the policy lives for the call. A device that cannot be used throws
/// dtrain::AgreedError with the same message on every rank ("<program>: --device cuda: ...").
template <class F>
int with_exec_policy(const std::string& want, const std::string& program, F&& f,
                     MPI_Comm comm = MPI_COMM_WORLD) {
  DeviceChoice device;
  try {
    device = resolve_device(want, comm);
  } catch (const std::runtime_error& e) {
    throw dtrain::AgreedError(program + ": " + e.what());
  }
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
  if (device.kind != DeviceKind::cpu) {
    GpuPolicy exec(device.index);
    return std::forward<F>(f)(exec, device);
  }
#endif
  HostPolicy exec;
  return std::forward<F>(f)(exec, device);
}

}  // namespace dtrain_cli
