// A program outside the dtrain tree, built against the installed package.
#include <dtrain/dtrain.hpp>
#include <hdf5.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dtrain::detail::RankScope scope(rank);
  dtrain::Tensor t({4}, dtrain::DType::f32);
  auto v = t.as<float>();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank + 1);
  float sum[4];
  MPI_Allreduce(v.data(), sum, 4, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const float expect = static_cast<float>(size * (size + 1) / 2);
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  int ok = sum[0] == expect;
  if (rank == 0)
    std::printf("consumer: dtrain %s, HDF5 %u.%u.%u, %d ranks, %s\n", dtrain::version_string(), maj,
                min, rel, size, ok ? "ok" : "WRONG");
  MPI_Finalize();
  return ok ? 0 : 1;
}
