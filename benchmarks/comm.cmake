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
  # reduce_scatter and allgather (from the node-shared heaps, and on private buffers) against
  # MPI_Reduce_scatter_block and MPI_Allgather on one node.
  dtrain_add_benchmark(NAME parts_bench
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/parts_bench.cpp
    LINK dtrain::mpi)
endif()
