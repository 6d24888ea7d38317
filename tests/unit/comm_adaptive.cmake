# automatic all-reduce plans that check their algorithm while in use: the window schedule, and
# loopback ranks changing algorithm together under synthetic timings.
dtrain_add_unit_test(NAME unit_comm_adaptive IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_adaptive_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
