# All-reduce benchmark: dtrain's algorithms over the mpi, mpi-rma, ibverbs (when libibverbs is
# found) and loopback transports against MPI_Allreduce on the same buffers.
if(DTRAIN_HAVE_MPI)
  set(_comm_bench_link dtrain::mpi dtrain::loopback)
  if(DTRAIN_HAVE_IBVERBS)
    list(APPEND _comm_bench_link dtrain::ibverbs)
  endif()
  dtrain_add_benchmark(NAME allreduce_bench
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/allreduce_bench.cpp
    LINK ${_comm_bench_link})
endif()
