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
