# Kernel waits on the counters of MPI's node-shared window: woken across processes by the
# partner's publish, no lost wake-up over many hand-offs, shm all-reduce against MPI_Allreduce.
dtrain_add_mpi_test(NAME mpi_comm_wait IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_wait_mpi.cpp
  NP 2
  TIMEOUT 90)
