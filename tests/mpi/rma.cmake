# The one-sided protocol over MPI-3 RMA (mpiexec -n 1..4): collectives against MPI_Allreduce and
# a serial reference, on both protocol paths.
dtrain_add_mpi_test(NAME mpi_rma_test IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/rma_test.cpp
  NP 1 2 3 4
  TIMEOUT 240)
