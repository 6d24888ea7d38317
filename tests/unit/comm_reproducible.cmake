# Reproducible mode (ordered all-reduce): rank-order bits from every requested algorithm,
# segment and slot size, and a short training independent of bucket size and algorithm.
dtrain_add_unit_test(NAME unit_comm_reproducible IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_reproducible_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
