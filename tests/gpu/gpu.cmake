# GPU tests: each device kernel against its host reference. Built with nvcc (sm_80, sm_90) and
# hipcc (gfx90a, gfx942) when present, so they compile in every CI run; without a GPU they exit 77
# and CTest reports them as skipped. tests/gpu/run_on_device.sh runs them on a GPU machine.
include("${PROJECT_SOURCE_DIR}/cmake/dtrain_gpu.cmake")
dtrain_add_gpu_test(NAME gpu_kernels SOURCE "${CMAKE_CURRENT_LIST_DIR}/kernels_gpu_test.cpp" TIMEOUT 300)

# gpu.hpp's host-only path (plain C++ compiler with the vendor runtime).
if(DTRAIN_HAVE_CUDA)
  dtrain_add_unit_test(NAME gpu_host_api_cuda SOURCES "${CMAKE_CURRENT_LIST_DIR}/gpu_host_api_test.cpp"
    LINK dtrain::cuda TIMEOUT 60 LABELS gpu)
endif()
if(DTRAIN_HAVE_HIP)
  dtrain_add_unit_test(NAME gpu_host_api_hip SOURCES "${CMAKE_CURRENT_LIST_DIR}/gpu_host_api_test.cpp"
    LINK dtrain::hip TIMEOUT 60 LABELS gpu)
endif()

# The host optimizer kernels' bit-for-bit tests compiled by nvcc with an FMA host target: nvcc's
# front end drops the GCC pragmas that keep them uncontracted, so the header gives its functions
# the option as an attribute instead (<dtrain/kernels/host/optim.hpp>). Host code only: it runs,
# and must pass, without a GPU.
if("cuda" IN_LIST DTRAIN_GPU_DIALECTS AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native DTRAIN_CXX_HAS_MARCH_NATIVE)
  if(DTRAIN_CXX_HAS_MARCH_NATIVE)
    dtrain_add_gpu_executable(NAME unit_kernels_host_nvcc_native
      SOURCE "${PROJECT_SOURCE_DIR}/tests/unit/kernels_host_test.cpp" DIALECT cuda
      DEFINES DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN FLAGS -Xcompiler=-march=native OUT _exe)
    add_test(NAME unit_kernels_host_nvcc_native COMMAND "${_exe}")
    set_tests_properties(unit_kernels_host_nvcc_native PROPERTIES LABELS "unit;cuda" TIMEOUT 300)
  endif()
endif()

# The GPU execution policy: conformance and Sequential / AdamW / Sgd instantiated on it (compile
# time, both dialects); on a GPU, a short training run against the host run of the same seed.
dtrain_add_gpu_test(NAME gpu_exec SOURCE "${CMAKE_CURRENT_LIST_DIR}/gpu_exec_test.cpp" TIMEOUT 300)

# ABI: a shared library built with nvcc / hipcc keeps dtrain::gpu in the versioned namespace and
# exports none of it. Compile-and-inspect, so it runs without a GPU.
foreach(_dialect IN LISTS DTRAIN_GPU_DIALECTS)
  if(_dialect STREQUAL "cuda")
    set(_cc "${DTRAIN_NVCC}")
  else()
    set(_cc "${DTRAIN_HIPCC}")
  endif()
  add_test(NAME gpu_abi_visibility_${_dialect}
    COMMAND bash "${CMAKE_CURRENT_LIST_DIR}/abi_visibility.sh" ${_dialect} "${_cc}"
            "${PROJECT_SOURCE_DIR}" "${CMAKE_CURRENT_BINARY_DIR}/abi_visibility")
  set_tests_properties(gpu_abi_visibility_${_dialect} PROPERTIES TIMEOUT 300
    LABELS "unit;${_dialect};abi")
endforeach()
