// The MPI library's run-time answer about device buffers (dtrain::mpi_gpu_support) against an
// independent source: the configure line MPICH reports through `mpichversion`. A build without a
// CUDA / HIP configure option cannot accept such buffers, whatever the run-time environment.
// Then the rule that hands device buffers over or stages them (choose_mpi_device_buffers), on
// made-up answers and on this process's own with DTRAIN_MPI_GPU_AWARE set and unset.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <dtrain/transports/mpi_gpu_support.hpp>

namespace {
// The output of `mpichversion` (empty when it cannot run).
std::string mpichversion() {
  std::string out;
  if (FILE* f = ::popen("mpichversion 2>/dev/null", "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    ::pclose(f);
  }
  return out;
}
}  // namespace

TEST_CASE("the MPI library is asked about device buffers where it can answer") {
  const dtrain::MpiGpuSupport s = dtrain::mpi_gpu_support();
  MESSAGE("MPI GPU support: cuda " << s.cuda << ", hip " << s.hip << " (" << s.how << ")");
  CHECK(!s.how.empty());
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40002000
  CHECK(s.queried);
  const std::string info = mpichversion();
  if (info.find("MPICH configure") == std::string::npos) {
    MESSAGE("mpichversion not available: the answers are not cross-checked");
    return;
  }
  const std::string cfg = info.substr(info.find("MPICH configure"));
  const std::string line = cfg.substr(0, cfg.find('\n'));
  if (line.find("cuda") == std::string::npos) CHECK_FALSE(s.cuda);
  if (line.find("hip") == std::string::npos) CHECK_FALSE(s.hip);
#else
  CHECK_FALSE(s.queried);
  CHECK_FALSE(s.cuda);
  CHECK_FALSE(s.hip);
#endif
}

TEST_CASE(
    "device buffers: handed over or staged by the library's answer and DTRAIN_MPI_GPU_AWARE") {
  using dtrain::MpiDeviceBuffers;
  using dtrain::Space;
  dtrain::MpiGpuSupport yes_cuda;
  yes_cuda.queried = true;
  yes_cuda.cuda = true;
  yes_cuda.how = "test query";
  dtrain::MpiGpuSupport unknown;
  unknown.how = "not asked";
  const std::optional<std::string> unset, automatic = "auto", off = "0", on = "1";
  auto mode = [](const dtrain::MpiGpuSupport& s, Space sp, const std::optional<std::string>& o) {
    return dtrain::choose_mpi_device_buffers(s, sp, o).mode;
  };
  CHECK(mode(yes_cuda, Space::host, on) == MpiDeviceBuffers::host_memory);
  CHECK(mode(yes_cuda, Space::cuda, unset) == MpiDeviceBuffers::handed_over);
  CHECK(mode(yes_cuda, Space::cuda, automatic) == MpiDeviceBuffers::handed_over);
  CHECK(mode(yes_cuda, Space::hip, unset) == MpiDeviceBuffers::staged);  // refused for HIP
  CHECK(mode(yes_cuda, Space::cuda, off) == MpiDeviceBuffers::staged);
  CHECK(mode(unknown, Space::cuda, unset) == MpiDeviceBuffers::staged);
  CHECK(mode(unknown, Space::hip, on) == MpiDeviceBuffers::handed_over);
  const auto why = dtrain::choose_mpi_device_buffers(unknown, Space::cuda, unset).why;
  CHECK(why.find("not known to be accepted") != std::string::npos);
  CHECK(why.find("DTRAIN_MPI_GPU_AWARE=1") != std::string::npos);  // says how to override
  const auto refused = dtrain::choose_mpi_device_buffers(yes_cuda, Space::hip, unset).why;
  CHECK(refused.find("refused (test query)") != std::string::npos);
  try {
    (void)dtrain::choose_mpi_device_buffers(yes_cuda, Space::cuda, std::string("yes"));
    FAIL("a bad DTRAIN_MPI_GPU_AWARE was accepted");
  } catch (const dtrain::InvalidArgument& e) {
    CHECK(std::string(e.what()).find("DTRAIN_MPI_GPU_AWARE") != std::string::npos);
  }
  // This process: the library's own answer, then the override from the environment.
  const dtrain::MpiGpuSupport s = dtrain::mpi_gpu_support();
  ::unsetenv("DTRAIN_MPI_GPU_AWARE");
  CHECK((dtrain::mpi_device_buffers(Space::cuda).mode == MpiDeviceBuffers::handed_over) == s.cuda);
  ::setenv("DTRAIN_MPI_GPU_AWARE", "1", 1);
  CHECK(dtrain::mpi_device_buffers(Space::hip).mode == MpiDeviceBuffers::handed_over);
  ::setenv("DTRAIN_MPI_GPU_AWARE", "0", 1);
  CHECK(dtrain::mpi_device_buffers(Space::cuda).mode == MpiDeviceBuffers::staged);
  ::unsetenv("DTRAIN_MPI_GPU_AWARE");
}
