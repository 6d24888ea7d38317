# Back-to-back collectives of every all-reduce algorithm, interleaved as allreduce_bench runs
# them, against MPI_Allreduce. 4 KiB segments with UCX's rendezvous from 1 KiB up (a variable
# other MPI stacks ignore): many rendezvous messages per step, whose senders complete only when
# the receiver's MPI library answers, so a rank waiting on a node-shared counter without driving
# MPI's progress deadlocks within a few collectives.
dtrain_add_mpi_test(NAME mpi_comm_interleave IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_interleave_mpi.cpp
  NP 2 3 4
  TIMEOUT 90)
if(TEST mpi_comm_interleave_np2)
  foreach(np 2 3 4)
    set_property(TEST mpi_comm_interleave_np${np} APPEND PROPERTY ENVIRONMENT
      "UCX_RNDV_THRESH=1024")
  endforeach()
endif()
