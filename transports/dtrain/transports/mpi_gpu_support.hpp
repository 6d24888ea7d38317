// SPDX-License-Identifier: BSD-3-Clause
// dtrain: whether the MPI library accepts device buffers, asked at run time.
//
// A GPU-aware MPI moves device memory itself, so a transport over it may report
// supports_device_memory and the gradient sync could hand device buffers over without staging.
// The answer depends on how the library was built and on the run-time environment, so it is asked
// at run time where the library offers a query: MPICH >= 4.0.2 declares MPIX_Query_cuda_support()
// and MPIX_Query_hip_support() in mpi.h (the version is the header's own MPICH_NUMVERSION, the
// same for every translation unit that includes that mpi.h). Other libraries, and older MPICH,
// are not asked: `queried` is false and `how` says why.
#pragma once

#include <mpi.h>

#include <string>

namespace dtrain {

/// The MPI library's answer about device buffers.
struct MpiGpuSupport {
  bool queried = false;  ///< the library was asked (the query exists in its headers)
  bool cuda = false;     ///< CUDA device buffers accepted
  bool hip = false;      ///< HIP device buffers accepted
  std::string how;       ///< which query answered, or why none was asked
};

/// Local, non-blocking. Call between MPI_Init and MPI_Finalize. Never throws.
inline MpiGpuSupport mpi_gpu_support() {
  MpiGpuSupport s;
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40002000
  s.queried = true;
  s.cuda = MPIX_Query_cuda_support() != 0;
  s.hip = MPIX_Query_hip_support() != 0;
  s.how =
      std::string("MPIX_Query_cuda_support / MPIX_Query_hip_support (MPICH ") + MPICH_VERSION + ")";
#elif defined(MPICH_NUMVERSION)
  s.how = std::string("not asked: MPICH ") + MPICH_VERSION +
          " declares no MPIX_Query_*_support (4.0.2 or newer does)";
#else
  s.how = "not asked: not MPICH (no run-time GPU query is used for this MPI library)";
#endif
  return s;
}

}  // namespace dtrain
