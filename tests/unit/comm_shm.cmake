# The shm all-reduce's chunk placement in large slots (a chunk at its output's offset within a
# page): exact sums with buffers at other offsets on every rank.
dtrain_add_unit_test(NAME unit_comm_shm IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_shm_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
