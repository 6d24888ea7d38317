# Waits that do not burn a core: futex waits on shared-segment counters (woken by the writer,
# bounded by the deadline, no lost wake-up), shm over many chunks, the backoff's contention memory
# (renewed by evidence only off the progress thread), its sleeps, a stalled wait's CPU cost.
dtrain_add_unit_test(NAME unit_comm_wait IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_wait_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
