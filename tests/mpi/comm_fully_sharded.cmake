# Fully sharded training on real MPI: the replicated step's bits in reproducible mode.
dtrain_add_mpi_test(NAME mpi_comm_fully_sharded IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_fully_sharded_mpi.cpp
  NP 2 3
  TIMEOUT 120)
