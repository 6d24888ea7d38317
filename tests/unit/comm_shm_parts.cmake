# reduce_scatter and allgather on one node read in place from the node-shared heaps (one hand-off
# per call) against exact results, the shm all-reduce's bits, overwrite-on-return and a partner
# that never arrives; the ring where some rank's buffers lie elsewhere or on fake nodes.
dtrain_add_unit_test(NAME unit_comm_shm_parts IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_shm_parts_test.cpp
  LINK dtrain::loopback
  TIMEOUT 180)
