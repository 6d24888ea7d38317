# Model, optimizer and host-kernel unit tests. With dtrain::blas the layers run on CBLAS; the
# blocked fallback and the serial references are tested directly in every configuration.
set(_dtrain_model_blas "")
if(DTRAIN_HAVE_BLAS)
  set(_dtrain_model_blas dtrain::blas)
endif()

dtrain_add_unit_test(NAME unit_kernels_host IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_host_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120 OPTIMIZED)
# The same tests compiled for this machine's own instruction set (FMA where the CPU has it): the
# optimizer paths promise the scalar order's bits whatever the flags, and a compiler that fused a
# multiply and an add in one path and not in another (GCC's default with FMA in the target) broke
# that before <dtrain/kernels/host/optim.hpp> turned contraction off. On a CPU without FMA this
# build checks what the plain one does.
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-march=native DTRAIN_CXX_HAS_MARCH_NATIVE)
if(DTRAIN_CXX_HAS_MARCH_NATIVE)
  dtrain_add_unit_test(NAME unit_kernels_host_native
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_host_test.cpp
    LINK ${_dtrain_model_blas}
    TIMEOUT 120 OPTIMIZED)
  target_compile_options(unit_kernels_host_native PRIVATE -march=native)
endif()

dtrain_add_unit_test(NAME unit_model IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120 OPTIMIZED)

dtrain_add_unit_test(NAME unit_model_layers IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_layers_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120 OPTIMIZED)

dtrain_add_unit_test(NAME unit_model_conv_direct IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_conv_direct_test.cpp
  TIMEOUT 120 OPTIMIZED)

dtrain_add_unit_test(NAME unit_optim IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/optim_test.cpp
  LINK ${_dtrain_model_blas}
  TIMEOUT 120 OPTIMIZED)
