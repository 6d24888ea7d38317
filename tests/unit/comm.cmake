# Collectives over the loopback transport (threads in one process).
dtrain_add_unit_test(NAME unit_comm IN test_comm
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/comm_allreduce_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/comm_safety_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/comm_gradient_sync_test.cpp
  LINK dtrain::loopback
  TIMEOUT 240)
# The reduction contract of kernels/host/reduce.hpp, alone and through every algorithm.
dtrain_add_unit_test(NAME unit_comm_reduce_contract IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_reduce_contract_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
# The transport seam: detected capabilities, registration, device memory, persistent channels.
dtrain_add_unit_test(NAME unit_comm_transport IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_transport_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
# Strict environment parsing and where it is read.
dtrain_add_unit_test(NAME unit_comm_env IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_env_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
# Its own executable: the test replaces the global operator new and delete to count allocations,
# which would apply to every test linked with it.
dtrain_add_unit_test(NAME unit_comm_noalloc
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_noalloc_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
# Scratch memory shared by a communicator's plans.
dtrain_add_unit_test(NAME unit_comm_scratch IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_scratch_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
