dtrain_add_unit_test(NAME unit_core IN test_core
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/core_dtype_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/core_tensor_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/core_rng_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/core_error_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/core_io_watchdog_test.cpp
  TIMEOUT 120)
