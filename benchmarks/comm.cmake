# All-reduce benchmark: dtrain's algorithms against MPI_Allreduce on the same buffers.
if(DTRAIN_HAVE_MPI)
  dtrain_add_benchmark(NAME allreduce_bench
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/allreduce_bench.cpp
    LINK dtrain::mpi dtrain::loopback)
endif()
