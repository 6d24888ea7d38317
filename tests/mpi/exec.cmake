# The MPI library's run-time answer about device buffers (MPIX_Query_*_support on MPICH).
dtrain_add_mpi_test(NAME mpi_exec_gpu_support IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_mpi_gpu_support.cpp
  NP 1
  TIMEOUT 60)
