# Collectives over MPI, compared with MPI's own collectives.
dtrain_add_mpi_test(NAME mpi_comm IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_mpi_test.cpp
  NP 1 2 3 4
  TIMEOUT 180)
