# The node-shared heap's allocator and the shm all-reduce reading heap buffers in place (every
# rank's or only some ranks'), and hier / hier_leader doing so inside each node, against
# private-memory buffers and exact sums.
dtrain_add_unit_test(NAME unit_comm_shared_heap IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_shared_heap_test.cpp
  LINK dtrain::loopback
  TIMEOUT 180)
