# The two-level all-reduces over loopback ranks grouped into nodes (even, uneven, interleaved),
# the node grouping and the cost model's hierarchical terms.
dtrain_add_unit_test(NAME unit_comm_hier IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_hier_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
