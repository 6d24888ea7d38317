// SPDX-License-Identifier: BSD-3-Clause
// dtrain: whether the MPI library accepts device buffers, asked at run time, and the rule that
// turns its answer (or the user's override) into handing device buffers to MPI or staging them.
//
// A GPU-aware MPI moves device memory itself, so a transport over it may take device buffers
// without staging. The answer depends on how the library was built and on the run-time
// environment, so it is asked at run time where the library offers a way:
//   - MPICH >= 4.0.2: MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA / _HIP) where mpi.h defines
//     those constants, else MPIX_Query_cuda_support() / MPIX_Query_hip_support();
//   - Cray MPICH (CRAY_MPICH_VERSION): device buffers only with MPICH_GPU_SUPPORT_ENABLED=1 in
//     the environment (its documented switch), and then the MPICH query above where it exists;
//   - Open MPI: MPIX_Query_cuda_support() / MPIX_Query_rocm_support() from <mpi-ext.h>, where
//     the build declares them (MPIX_CUDA_AWARE_SUPPORT / MPIX_ROCM_AWARE_SUPPORT).
// Other libraries, and older MPICH, are not asked: `queried` is false and `how` says why. Which
// branch runs is fixed by the mpi.h every translation unit of a program includes.
#pragma once

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include <cstdlib>
#include <optional>
#include <string>

#include <dtrain/core/env.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/space.hpp>

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
#if defined(MPIX_GPU_SUPPORT_CUDA) && defined(MPIX_GPU_SUPPORT_HIP)
  int cuda = 0, hip = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &cuda) != MPI_SUCCESS) cuda = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_HIP, &hip) != MPI_SUCCESS) hip = 0;
  s.cuda = cuda != 0;
  s.hip = hip != 0;
  s.how = "MPIX_GPU_query_support";
#else
  s.cuda = MPIX_Query_cuda_support() != 0;
  s.hip = MPIX_Query_hip_support() != 0;
  s.how = "MPIX_Query_cuda_support / MPIX_Query_hip_support";
#endif
  s.how += std::string(" (MPICH ") + MPICH_VERSION + ")";
#if defined(CRAY_MPICH_VERSION)
  {
    const char* on = std::getenv("MPICH_GPU_SUPPORT_ENABLED");
    if (!on || std::string(on) != "1") {
      s.cuda = s.hip = false;
      s.how += "; Cray MPICH without MPICH_GPU_SUPPORT_ENABLED=1";
    }
  }
#endif
#elif defined(CRAY_MPICH_VERSION)
  {
    const char* on = std::getenv("MPICH_GPU_SUPPORT_ENABLED");
    s.queried = true;
    s.cuda = s.hip = on && std::string(on) == "1";
    s.how = std::string("Cray MPICH: MPICH_GPU_SUPPORT_ENABLED=") + (on ? on : "(unset)");
  }
#elif defined(MPICH_NUMVERSION)
  s.how = std::string("not asked: MPICH ") + MPICH_VERSION +
          " declares no MPIX_GPU_query_support (4.0.2 or newer does)";
#elif defined(OPEN_MPI) && OPEN_MPI
  s.how = "Open MPI:";
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  s.queried = true;
  s.cuda = MPIX_Query_cuda_support() == 1;
  s.how += " MPIX_Query_cuda_support";
#else
  s.how += " built without CUDA support";
#endif
#if defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
  s.queried = true;
  s.hip = MPIX_Query_rocm_support() == 1;
  s.how += ", MPIX_Query_rocm_support";
#else
  s.how += ", built without ROCm support";
#endif
#else
  s.how = "not asked: neither MPICH nor Open MPI (no run-time GPU query is known for it)";
#endif
  return s;
}

/// How device buffers of one space go to MPI.
enum class MpiDeviceBuffers : unsigned char {
  host_memory,  ///< the buffers are host memory: nothing to decide
  staged,       ///< copied to host memory and back around each MPI call (the fallback)
  handed_over,  ///< given to MPI as they are (a GPU-aware MPI)
};

/// The choice and why it was made (for the log and errors).
struct MpiDeviceChoice {
  MpiDeviceBuffers mode = MpiDeviceBuffers::host_memory;
  std::string why;
};

/// The rule, a pure function: buffers of `space` are handed over when the user forces it
/// (`override_value` "1", the value of DTRAIN_MPI_GPU_AWARE; trusted, not checked), or when it is
/// unset or "auto" and the library answered yes for that space (CUDA or HIP); they are staged when
/// the user forces it ("0") or the library answered no or was not asked. Host memory needs no
/// choice. Throws InvalidArgument naming DTRAIN_MPI_GPU_AWARE for any other value.
inline MpiDeviceChoice choose_mpi_device_buffers(const MpiGpuSupport& s, Space space,
                                                 const std::optional<std::string>& override_value) {
  if (space == Space::host) return {MpiDeviceBuffers::host_memory, "host memory"};
  const int forced = override_value ? env::parse_choice("DTRAIN_MPI_GPU_AWARE", *override_value,
                                                        {"auto", "0", "1"})
                                    : 0;
  const std::string kind = name_of(space);
  if (forced == 1) return {MpiDeviceBuffers::staged, "staged: DTRAIN_MPI_GPU_AWARE=0"};
  if (forced == 2)
    return {MpiDeviceBuffers::handed_over,
            "handed over: DTRAIN_MPI_GPU_AWARE=1 (the library's answer not used: " + s.how + ")"};
  const bool yes = space == Space::cuda ? s.cuda : s.hip;
  if (yes)
    return {MpiDeviceBuffers::handed_over,
            "handed over: " + kind + " buffers accepted (" + s.how + ")"};
  return {MpiDeviceBuffers::staged,
          "staged: " + kind + " buffers " + (s.queried ? "refused" : "not known to be accepted") +
              " (" + s.how + "); DTRAIN_MPI_GPU_AWARE=1 forces the hand-over"};
}

/// The choice for buffers of `space` in this process: the library's answer (mpi_gpu_support) and
/// DTRAIN_MPI_GPU_AWARE (auto, 0 or 1; unset: auto), by choose_mpi_device_buffers. Logged at
/// info level the first time a device space is decided. Local; call between MPI_Init and
/// MPI_Finalize; throws InvalidArgument for a bad DTRAIN_MPI_GPU_AWARE.
inline MpiDeviceChoice mpi_device_buffers(Space space) {
  MpiDeviceChoice c =
      choose_mpi_device_buffers(mpi_gpu_support(), space, env::get("DTRAIN_MPI_GPU_AWARE"));
  if (c.mode != MpiDeviceBuffers::host_memory) {
    static const bool logged = [&] {
      DTRAIN_LOG(info, "MPI and " << name_of(space) << " device buffers: " << c.why);
      return true;
    }();
    (void)logged;
  }
  return c;
}

}  // namespace dtrain
