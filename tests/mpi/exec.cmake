# The MPI library's run-time answer about device buffers (MPIX_Query_*_support on MPICH).
dtrain_add_mpi_test(NAME mpi_exec_gpu_support IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_mpi_gpu_support.cpp
  NP 1
  TIMEOUT 60)
# Ranks sharing one device, data parallel and fully sharded, in reproducible mode: here on the
# emulated GPU; tests/gpu/run_on_device.sh builds the same file with nvcc / hipcc for a real one.
dtrain_add_mpi_test(NAME mpi_exec_device_ranks IN test_mpi
  SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/mpi_gpu_test.cpp
  NP 2
  TIMEOUT 60)
# GradientSync over MPI with device gradients: hand-over or staging by DTRAIN_MPI_GPU_AWARE and
# the library's answer; the staged step against MPI_Allreduce.
dtrain_add_mpi_test(NAME mpi_exec_handover IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_mpi_handover.cpp
  NP 2
  TIMEOUT 60)
# GradientSync's device IPC between MPI processes on the emulated device (memfd windows opened
# through /proc/<pid>/fd): one node, and fake nodes of 2 + 1 ranks; against an MPI_Allgather
# rank-order reference and the staged path.
dtrain_add_mpi_test(NAME mpi_exec_ipc IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_mpi_ipc.cpp
  NP 2 3
  TIMEOUT 60)
