# Abandonment: the polled deadline (descheduling, abandon flag), a handle dropped while an error
# unwinds, a late peer after a timeout (loopback; the ASan build runs it too).
dtrain_add_unit_test(NAME unit_comm_abandon IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_abandon_test.cpp
  LINK dtrain::loopback
  TIMEOUT 90)
