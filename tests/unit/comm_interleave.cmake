# Back-to-back collectives of every all-reduce algorithm, interleaved as allreduce_bench runs
# them, on loopback worlds with and without MPI's weak progress (a send completes only when its
# receiver calls into the transport again): no rank may wait for a peer without driving progress.
dtrain_add_unit_test(NAME unit_comm_interleave IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_interleave_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
