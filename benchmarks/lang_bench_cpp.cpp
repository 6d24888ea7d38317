// SPDX-License-Identifier: BSD-3-Clause
// The C++ side of lang_bench (benchmarks/lang_bench.f90): the same run's train step called from
// C++ directly on a dtrain::ConfiguredRun, timed here, so that the Fortran program measures both
// paths side by side in one process.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include <dtrain/config/configured_run.hpp>

namespace {
std::unique_ptr<dtrain::ConfiguredRun> cpp_run;
}

// Collective. Makes the run (first call), then times `steps` train steps on x and y (batch
// samples, the model's shapes) with MPI_Wtime; returns this rank's seconds, or -1 on an error
// (printed).
extern "C" double lang_bench_cpp_steps(MPI_Fint comm, const char* path, const float* x,
                                       const float* y, std::int64_t batch, std::int64_t steps) {
  try {
    if (!cpp_run)
      cpp_run = std::make_unique<dtrain::ConfiguredRun>(MPI_Comm_f2c(comm), std::string(path));
    const double t0 = MPI_Wtime();
    for (std::int64_t s = 0; s < steps; ++s) cpp_run->train_step(x, y, batch);
    return MPI_Wtime() - t0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return -1;
  }
}

// Collective. Frees the run.
extern "C" void lang_bench_cpp_close() { cpp_run.reset(); }
