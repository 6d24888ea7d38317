# The failure policy (abort the job or hand the error to the application) without MPI.
dtrain_add_unit_test(NAME fault_policy_test IN test_core
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/../fault/failure_policy_test.cpp TIMEOUT 60)
