# Checkpoint benchmark: save MB/s against a plain write + fsync, restore time, step-time cost.
include("${PROJECT_SOURCE_DIR}/examples/common/cli11.cmake")
if(DTRAIN_HAVE_HDF5 AND DTRAIN_HAVE_CLI11)
  dtrain_add_benchmark(NAME ckpt_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_bench.cpp
    LINK dtrain::hdf5 dtrain::mpi)
  target_include_directories(ckpt_bench PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  dtrain_use_cli11(ckpt_bench)
endif()
