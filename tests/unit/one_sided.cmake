# The one-sided protocol over loopback RMA (threads): point-to-point paths, flow control,
# registration cache, the collectives matrix and the injected faults.
dtrain_add_unit_test(NAME unit_one_sided IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/one_sided_test.cpp
  TIMEOUT 240)
