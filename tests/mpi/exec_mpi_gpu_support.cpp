// The MPI library's run-time answer about device buffers (dtrain::mpi_gpu_support) against an
// independent source: the configure line MPICH reports through `mpichversion`. A build without a
// CUDA / HIP configure option cannot accept such buffers, whatever the run-time environment.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
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
