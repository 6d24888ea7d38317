# Model, optimizer and host-kernel unit tests. With dtrain::blas the layers run on CBLAS; the
# blocked fallback and the serial references are tested directly in every configuration.
set(_dtrain_model_blas "")
if(DTRAIN_HAVE_BLAS)
  set(_dtrain_model_blas dtrain::blas)
endif()

dtrain_add_unit_test(NAME unit_kernels_host
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_host_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120)

dtrain_add_unit_test(NAME unit_model
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120)

dtrain_add_unit_test(NAME unit_optim
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/optim_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120)
