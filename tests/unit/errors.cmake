dtrain_add_unit_test(NAME unit_errors IN test_core SOURCES ${CMAKE_CURRENT_LIST_DIR}/errors_test.cpp
  LINK dtrain::loopback TIMEOUT 60)
