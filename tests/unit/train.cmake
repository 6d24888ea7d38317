# train/: progress line, step-keyed CSV logs, straggler telemetry, JSON summary, run-directory lock.
dtrain_add_unit_test(NAME unit_train
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/train_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
