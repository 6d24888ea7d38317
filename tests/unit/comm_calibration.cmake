# The calibration behind automatic all-reduce: agreement, robustness to a disturbed sample,
# validation against measured runs, the tuning file (loopback ranks, synthetic timings).
dtrain_add_unit_test(NAME unit_comm_calibration IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_calibration_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
