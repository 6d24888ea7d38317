# ParameterSet, the "own model" path (the application computes its gradients, dtrain syncs,
# steps and checkpoints them): layout, init, optimizers and clipping against a Sequential, the
# state layout (test_numeric); GradientSync over thread ranks (test_comm); Checkpointer round
# trips through HDF5 (test_ckpt); a set in the emulated device's memory (test_exec).
# `ctest -R own_model` runs them.
set(_dtrain_own_model_blas "")
if(DTRAIN_HAVE_BLAS)
  set(_dtrain_own_model_blas dtrain::blas)
endif()
dtrain_add_unit_test(NAME unit_own_model IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/own_model_test.cpp
  LINK ${_dtrain_own_model_blas}
  TIMEOUT 120 OPTIMIZED)
dtrain_add_unit_test(NAME unit_own_model_sync IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/own_model_sync_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
dtrain_add_unit_test(NAME unit_own_model_device IN test_exec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/own_model_device_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
if(DTRAIN_HAVE_HDF5)
  dtrain_add_unit_test(NAME unit_own_model_ckpt IN test_ckpt
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/own_model_ckpt_test.cpp
    LINK dtrain::hdf5 dtrain::loopback
    TIMEOUT 120)
endif()
