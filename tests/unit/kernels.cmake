# Kernel-layer checks that are not tied to one kernel: one definition per host/device function,
# and translation units built with and without BLAS keeping their own documented GEMM.
dtrain_add_unit_test(NAME unit_kernels_single_source IN test_numeric
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_single_source_test.cpp TIMEOUT 60 OPTIMIZED)
target_compile_definitions(test_numeric PRIVATE DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

if(DTRAIN_HAVE_BLAS)
  set(_odr "${CMAKE_CURRENT_LIST_DIR}/kernels_odr")
  # The unit without BLAS gets neither the macro nor <cblas.h>'s include path.
  add_library(unit_kernels_odr_without_blas OBJECT "${_odr}/without_blas.cpp")
  target_link_libraries(unit_kernels_odr_without_blas PRIVATE dtrain::core dtrain_project_flags)
  dtrain_add_unit_test(NAME unit_kernels_odr
    SOURCES "${_odr}/odr_test.cpp" "${_odr}/with_blas.cpp"
            $<TARGET_OBJECTS:unit_kernels_odr_without_blas>
    LINK dtrain::blas TIMEOUT 60 OPTIMIZED)
  # BLAS threads per rank: the choice, strict DTRAIN_BLAS_THREADS, OpenBLAS's setter applied.
  dtrain_add_unit_test(NAME unit_kernels_blas_threads IN test_numeric
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_blas_threads_test.cpp
    LINK dtrain::blas TIMEOUT 60 OPTIMIZED)
endif()
