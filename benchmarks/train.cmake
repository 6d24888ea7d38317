# train_bench: training samples/s on 1 and 2 ranks in one run, scaling efficiency, phase split.
# benchmarks/compare/ddp_bench.py is the PyTorch DistributedDataParallel counterpart.
include("${PROJECT_SOURCE_DIR}/examples/common/cli11.cmake")
if(DTRAIN_HAVE_MPI AND DTRAIN_HAVE_CLI11)
  set(_train_bench_link dtrain::mpi)
  if(DTRAIN_HAVE_BLAS)
    list(APPEND _train_bench_link dtrain::blas)
  endif()
  dtrain_add_benchmark(NAME train_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/train_bench.cpp
    LINK ${_train_bench_link})
  dtrain_use_cli11(train_bench)
  if(DTRAIN_HAVE_BLAS)
    target_compile_definitions(train_bench PRIVATE DTRAIN_HAVE_CBLAS=1)
  endif()
endif()
# GPU variants (nvcc / hipcc): train_bench_cuda, train_bench_hip, run with --device cuda|hip.
# Opt-in (-DDTRAIN_BUILD_GPU_BENCHMARKS=ON): on a GPU machine, not in every test build.
if(DTRAIN_BUILD_BENCHMARKS AND DTRAIN_BUILD_GPU_BENCHMARKS AND TARGET train_bench)
  include("${PROJECT_SOURCE_DIR}/examples/common/gpu_variant.cmake")
  dtrain_add_gpu_variants(NAME train_bench SOURCE "${CMAKE_CURRENT_LIST_DIR}/train_bench.cpp"
    USES CLI11::CLI11 MPI::MPI_CXX DEFINES DTRAIN_HAVE_MPI=1)
endif()

# model_bench: whole models as users write them (Sequential on its default policy, AdamW,
# GradientSync) on 1 and 2 ranks, every layer kind's share of the step; the PyTorch side is
# benchmarks/compare/model_torch.py. Where oneDNN (libdnnl-dev) is found, the convolution layers of
# the same shapes are also timed in oneDNN; without it the benchmark builds without that column.
if(DTRAIN_HAVE_MPI)
  set(_model_bench_link dtrain::mpi)
  if(DTRAIN_HAVE_BLAS)
    list(APPEND _model_bench_link dtrain::blas)
  endif()
  dtrain_add_benchmark(NAME model_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_bench.cpp
    LINK ${_model_bench_link})
  find_path(DTRAIN_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(DTRAIN_DNNL_LIBRARY dnnl)
  mark_as_advanced(DTRAIN_DNNL_INCLUDE_DIR DTRAIN_DNNL_LIBRARY)
  if(DTRAIN_DNNL_INCLUDE_DIR AND DTRAIN_DNNL_LIBRARY)
    target_include_directories(model_bench PRIVATE "${DTRAIN_DNNL_INCLUDE_DIR}")
    target_link_libraries(model_bench PRIVATE "${DTRAIN_DNNL_LIBRARY}")
    target_compile_definitions(model_bench PRIVATE DTRAIN_BENCH_ONEDNN=1)
  endif()
endif()
# fs_memory_bench: measured memory per rank of a deep MLP, replicated or fully sharded, one mode
# per process (peak resident set), optionally with a checkpoint saved and restored.
if(DTRAIN_HAVE_MPI AND DTRAIN_HAVE_CLI11 AND DTRAIN_HAVE_HDF5)
  set(_fs_memory_link dtrain::mpi dtrain::hdf5)
  if(DTRAIN_HAVE_BLAS)
    list(APPEND _fs_memory_link dtrain::blas)
  endif()
  dtrain_add_benchmark(NAME fs_memory_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/fs_memory_bench.cpp
    LINK ${_fs_memory_link})
  dtrain_use_cli11(fs_memory_bench)
  if(DTRAIN_HAVE_BLAS)
    target_compile_definitions(fs_memory_bench PRIVATE DTRAIN_HAVE_CBLAS=1)
  endif()
endif()
