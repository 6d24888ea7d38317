// SPDX-License-Identifier: BSD-3-Clause
// --device auto|cpu|cuda|hip for MPI examples and benchmarks (not part of the library).
//
// A program compiled by nvcc or hipcc with DTRAIN_EXAMPLE_GPU=1 includes the GPU execution policy
// (<dtrain/kernels/gpu_exec.cuh>) and can run on that dialect's devices; a plain C++ build runs on
// the CPU only. resolve_device() turns the option into a choice every rank agrees on:
//   cpu        the host policy
//   cuda, hip  the GPU policy of that dialect; an error when this build has none, or when a rank
//              sees no device ("no CUDA device visible")
//   auto       the GPU when this build has a GPU policy and every rank sees a device, else cpu
// One rank per GPU: a rank takes device (node-local rank mod devices on its node).
#pragma once

#include <mpi.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "common/cli.hpp"

#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
#include <dtrain/kernels/gpu_exec.cuh>
#endif

namespace dtrain_cli {

/// Where a program's model runs.
enum class DeviceKind { cpu, cuda, hip };

inline const char* name_of(DeviceKind k) {
  return k == DeviceKind::cuda ? "cuda" : k == DeviceKind::hip ? "hip" : "cpu";
}
inline const char* vendor_of(DeviceKind k) {
  return k == DeviceKind::cuda ? "CUDA" : k == DeviceKind::hip ? "HIP" : "CPU";
}

/// The GPU dialect this translation unit was compiled for (cpu: none).
constexpr DeviceKind compiled_gpu() {
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU && defined(DTRAIN_GPU_CUDA)
  return DeviceKind::cuda;
#elif defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU && defined(DTRAIN_GPU_HIP)
  return DeviceKind::hip;
#else
  return DeviceKind::cpu;
#endif
}

/// Adds --device (auto|cpu|cuda|hip) bound to `value`.
inline CLI::Option* add_device(CLI::App& app, std::string& value) {
  return app
      .add_option("--device", value,
                  "where the model runs: cpu, cuda, hip, or auto (the GPU when this build has "
                  "one and a device is visible); one rank per GPU, chosen by node-local rank")
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "hip"}))
      ->capture_default_str();
}

/// The outcome of resolve_device on one rank.
struct DeviceChoice {
  DeviceKind kind = DeviceKind::cpu;
  int index = -1;   ///< the GPU this rank uses (kind != cpu)
  int visible = 0;  ///< GPUs this rank sees
  int local_rank = 0, local_size = 1;
  std::string describe() const {
    if (kind == DeviceKind::cpu) return "cpu";
    return std::string(name_of(kind)) + " device " + std::to_string(index) + " of " +
           std::to_string(visible) + " (node-local rank " + std::to_string(local_rank) + " of " +
           std::to_string(local_size) + ")";
  }
};

/// Collective over `comm` (MPI_Allreduce and MPI_Comm_split_type, right after start-up).
/// Resolves --device `want` on every rank; throws std::runtime_error with the same message on
/// every rank when it cannot be honoured (the first failing rank's reason).
inline DeviceChoice resolve_device(const std::string& want, MPI_Comm comm = MPI_COMM_WORLD) {
  DeviceChoice c;
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &c.local_rank);
  MPI_Comm_size(node, &c.local_size);
  MPI_Comm_free(&node);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  constexpr DeviceKind built = compiled_gpu();
#if defined(DTRAIN_EXAMPLE_GPU) && DTRAIN_EXAMPLE_GPU
  c.visible = dtrain::gpu::device_count();
#endif
  // Every rank states whether it has a device; the decision is the same everywhere.
  int all_visible = c.visible > 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_visible, 1, MPI_INT, MPI_MIN, comm);
  int problem_rank = INT_MAX;
  std::string problem;
  if (want == "cpu" || (want == "auto" && (built == DeviceKind::cpu || !all_visible))) {
    c.kind = DeviceKind::cpu;
  } else {
    const DeviceKind asked = want == "cuda"  ? DeviceKind::cuda
                             : want == "hip" ? DeviceKind::hip
                                             : built;
    if (asked != built) {
      problem = std::string("--device ") + want + ": this build has no " + vendor_of(asked) +
                " support (" +
                (built == DeviceKind::cpu
                     ? std::string("a CPU-only build; the GPU variant is compiled by nvcc or hipcc")
                     : std::string("it was compiled for ") + vendor_of(built)) +
                ")";
      problem_rank = rank;
    } else if (c.visible == 0) {
      problem = std::string("--device ") + want + ": no " + vendor_of(asked) +
                " device visible on rank " + std::to_string(rank) +
                " (check the driver and CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)";
      problem_rank = rank;
    }
    c.kind = asked;
    c.index = c.visible > 0 ? c.local_rank % c.visible : -1;
  }
  int first = problem_rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first != INT_MAX) {
    // The first failing rank's message, so that every rank reports the same reason.
    int len = rank == first ? static_cast<int>(problem.size()) : 0;
    MPI_Bcast(&len, 1, MPI_INT, first, comm);
    problem.resize(static_cast<std::size_t>(len));
    MPI_Bcast(&problem[0], len, MPI_CHAR, first, comm);
    throw std::runtime_error(problem);
  }
  return c;
}

}  // namespace dtrain_cli
