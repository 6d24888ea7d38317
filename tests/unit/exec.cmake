# Execution policies: HostExec and the test-only emulated device (tests/support/emulated_device.hpp).
# One executable; each doctest suite is its own CTest so that `ctest -R emulated` lists them.
set(_dtrain_exec_blas "")
if(DTRAIN_HAVE_BLAS)
  set(_dtrain_exec_blas dtrain::blas)
endif()
dtrain_add_unit_test(NAME unit_exec_emulated IN test_exec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_emulated_test.cpp
  LINK dtrain::loopback ${_dtrain_exec_blas}
  ARGS --test-suite-exclude=emulated_*
  TIMEOUT 120)
foreach(_suite model optim sync negative)
  add_test(NAME unit_exec_emulated_${_suite}
    COMMAND test_exec "--source-file=*/exec_emulated_test.cpp" --test-suite=emulated_${_suite})
  set_tests_properties(unit_exec_emulated_${_suite} PROPERTIES TIMEOUT 120 LABELS "unit"
    SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=115")
endforeach()
# Grid layers through the emulated device's host kernels and through the functors a GPU runs.
dtrain_add_unit_test(NAME unit_exec_emulated_layers IN test_exec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_emulated_layers_test.cpp
  LINK ${_dtrain_exec_blas}
  TIMEOUT 120)
# Checkpoints of device tensors through the emulated device (HDF5 Checkpointer, loopback ranks).
if(DTRAIN_HAVE_HDF5)
  dtrain_add_unit_test(NAME unit_exec_emulated_ckpt IN test_exec
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_emulated_ckpt_test.cpp
    LINK dtrain::hdf5 dtrain::loopback ${_dtrain_exec_blas}
    TIMEOUT 120)
endif()
# GradientSync's hand-over of device buckets to a transport that takes them (the test transport
# of tests/support/device_loopback.hpp), against staging and a host reference.
dtrain_add_unit_test(NAME unit_exec_emulated_handover IN test_exec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_handover_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
# GradientSync's device IPC among rank threads (the emulated device with IPC on): the rule, the
# bits against a host reference and the staged path on one node and several, a missing rank.
dtrain_add_unit_test(NAME unit_exec_emulated_ipc IN test_exec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_ipc_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
# The hand-over in every sync mode: 16-bit buckets, sharded steps, fully sharded units, each
# against its staged path and a host reference; the choice and its log line.
dtrain_add_unit_test(NAME unit_exec_emulated_handover_modes IN test_exec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/exec_handover_modes_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
