# Reproducible mode on real MPI: every requested algorithm over MPI two-sided with and without
# node-shared segments and over MPI-RMA gives the bits of a rank-order reduction of the gathered
# inputs.
dtrain_add_mpi_test(NAME mpi_comm_reproducible IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_reproducible_mpi.cpp
  NP 2 3 4
  TIMEOUT 120)
