# GPU tests: each device kernel against its host reference. Built with nvcc (sm_80, sm_90) and
# hipcc (gfx90a, gfx942) when present, so they compile in every CI run; without a GPU they exit 77
# and CTest reports them as skipped. tests/gpu/run_on_device.sh runs them on a GPU machine.
include("${PROJECT_SOURCE_DIR}/cmake/dtrain_gpu.cmake")
dtrain_add_gpu_test(NAME gpu_kernels SOURCE "${CMAKE_CURRENT_LIST_DIR}/kernels_gpu_test.cpp" TIMEOUT 300)
