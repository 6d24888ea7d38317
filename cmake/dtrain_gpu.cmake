# dtrain: building our own GPU translation units (tests, benchmarks) with the installed helper
# cmake/dtrainGpu.cmake, plus the source tree's include roots, tests/support and doctest.
#
# dtrain_add_gpu_test(NAME n SOURCE file [TIMEOUT s])
#   one executable and CTest per available dialect: n_cuda, n_hip (label gpu, skip code 77).
include_guard(DIRECTORY)
set(DTRAIN_GPU_INCLUDE_DIRS
  "${PROJECT_SOURCE_DIR}/include" "${PROJECT_SOURCE_DIR}/transports"
  "${PROJECT_SOURCE_DIR}/kernels" "${PROJECT_SOURCE_DIR}/tests")
if(DTRAIN_DOCTEST_INCLUDE_DIR)
  list(APPEND DTRAIN_GPU_INCLUDE_DIRS "${DTRAIN_DOCTEST_INCLUDE_DIR}")
endif()
# Every header a GPU unit may include: a change rebuilds the units.
file(GLOB_RECURSE DTRAIN_GPU_DEPENDS CONFIGURE_DEPENDS
  "${PROJECT_SOURCE_DIR}/include/dtrain/*.hpp"
  "${PROJECT_SOURCE_DIR}/kernels/dtrain/*.hpp"
  "${PROJECT_SOURCE_DIR}/kernels/dtrain/*.cuh"
  "${PROJECT_SOURCE_DIR}/tests/support/*.hpp")
include("${PROJECT_SOURCE_DIR}/cmake/dtrainGpu.cmake")

function(dtrain_add_gpu_test)
  cmake_parse_arguments(A "" "NAME;SOURCE;TIMEOUT" "" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  math(EXPR _wd "${A_TIMEOUT} - 5")
  set(_unoptimised "")
  if(DTRAIN_GPU_TESTS_UNOPTIMISED)
    set(_unoptimised UNOPTIMISED)
  endif()
  foreach(_dialect IN LISTS DTRAIN_GPU_DIALECTS)
    dtrain_add_gpu_executable(NAME ${A_NAME}_${_dialect} SOURCE "${A_SOURCE}" DIALECT ${_dialect} OUT _exe
      ${_unoptimised})
    add_test(NAME ${A_NAME}_${_dialect} COMMAND "${_exe}")
    set_tests_properties(${A_NAME}_${_dialect} PROPERTIES LABELS "gpu;${_dialect}" TIMEOUT ${A_TIMEOUT}
      SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=${_wd}")
  endforeach()
endfunction()
