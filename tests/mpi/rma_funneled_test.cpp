// The MPI-RMA transport below MPI_THREAD_MULTIPLE (mpiexec -n 2): MPI initialised with
// MPI_THREAD_FUNNELED, so the backend writes and flushes on the caller's thread (no writer
// thread, no progress thread). Ring, rhd and tree all-reduces on eager and zero-copy sizes must
// equal MPI_Allreduce bit for bit (small integers in f32: exact in any order). Its own main (the
// shared MPI test main asks for MPI_THREAD_MULTIPLE); exit code: the worst over the ranks.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi_rma.hpp>

namespace {

int run(int rank) {
  using namespace dtrain;
  int failures = 0;
  OneSidedConfig oc;
  oc.slots = 4;
  oc.slot_bytes = 256;  // messages over 192 B go zero-copy
  MpiRmaTransport t(oc, MPI_COMM_WORLD);
  if (t.backend().asynchronous()) {
    std::fprintf(stderr, "rank %d: writer thread started below MPI_THREAD_MULTIPLE\n", rank);
    ++failures;
  }
  CommConfig cfg;
  cfg.timeout_s = 60;
  cfg.segment_bytes = 1024;
  Communicator comm(t, cfg);
  for (std::size_t n : {std::size_t{1}, std::size_t{40}, std::size_t{5000}})
    for (AllreduceAlgorithm algo :
         {AllreduceAlgorithm::ring, AllreduceAlgorithm::rhd, AllreduceAlgorithm::tree}) {
      std::vector<float> x(n), want(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i % 17) + 3 * rank);
      MPI_Allreduce(x.data(), want.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, algo);
      if (x != want) {
        std::fprintf(stderr, "rank %d: %s all-reduce of %zu floats differs from MPI_Allreduce\n",
                     rank, name_of(algo), n);
        ++failures;
      }
    }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  try {
    code = run(rank) ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 1;
  }
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst == 0)
    std::printf("mpi-rma below MPI_THREAD_MULTIPLE: all-reduces exact\n");
  MPI_Finalize();
  return worst;
}
