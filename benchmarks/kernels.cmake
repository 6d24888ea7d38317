# kernels_bench: host GEMM paths against direct BLAS calls, the host reduction against its former
# loop, and the MLP step split by phase.
# With nvcc/hipcc the same source also builds kernels_bench_cuda / kernels_bench_hip, which add the
# device kernels against the vendor BLAS and a device memcpy.
set(_kb_link "")
set(_kb_defs "")
set(_kb_incs "")
set(_kb_libs "")
if(DTRAIN_HAVE_BLAS)
  set(_kb_link dtrain::blas)
  set(_kb_defs DTRAIN_HAVE_CBLAS=1)
  set(_kb_incs "${DTRAIN_CBLAS_INCLUDE_DIR}")
  # As -L/-l: nvcc's "-x cu" would otherwise read a library path as a source file.
  get_filename_component(_kb_dir "${DTRAIN_CBLAS_LIBRARY}" DIRECTORY)
  get_filename_component(_kb_name "${DTRAIN_CBLAS_LIBRARY}" NAME_WE)
  string(REGEX REPLACE "^lib" "" _kb_name "${_kb_name}")
  set(_kb_libs "-L${_kb_dir}" "-l${_kb_name}")
endif()
dtrain_add_benchmark(NAME kernels_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_bench.cpp LINK ${_kb_link})

include("${PROJECT_SOURCE_DIR}/cmake/dtrain_gpu.cmake")
foreach(_dialect IN LISTS DTRAIN_GPU_DIALECTS)
  # DTRAIN_BENCHMARK_OPT (cmake/dtrain_testing.cmake) reaches nvcc's host compiler; hipcc's
  # host and device code.
  set(_kb_opt "")
  if(DTRAIN_BENCHMARK_OPT AND _dialect STREQUAL "cuda")
    set(_kb_opt "-Xcompiler=${DTRAIN_BENCHMARK_OPT}")
  elseif(DTRAIN_BENCHMARK_OPT)
    set(_kb_opt ${DTRAIN_BENCHMARK_OPT})
  endif()
  set(_kb_check "")
  if(DTRAIN_GPU_PROGRAMS_COMPILE_CHECK)
    set(_kb_check COMPILE_CHECK)
  endif()
  dtrain_add_gpu_executable(NAME kernels_bench_${_dialect}
    SOURCE "${CMAKE_CURRENT_LIST_DIR}/kernels_bench.cpp" DIALECT ${_dialect}
    DEFINES ${_kb_defs} INCLUDES ${_kb_incs} HOST_LIBS ${_kb_libs} FLAGS ${_kb_opt} ${_kb_check})
endforeach()

# conv_bench: forward + backward of a convolutional surrogate stack (Conv2d 1 -> 32 -> 32 -> 1,
# 64 x 64 grid, batch 16) on one BLAS thread, against the measured FMA peak; PyTorch's figure of
# the same stack comes from benchmarks/compare/conv_torch.py.
if(DTRAIN_HAVE_BLAS)
  dtrain_add_benchmark(NAME conv_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/conv_bench.cpp LINK dtrain::blas)
endif()
