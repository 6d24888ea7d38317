# Checkpoint benchmark: save MB/s against a plain write + fsync, restore time, step-time cost.
if(DTRAIN_HAVE_HDF5)
  dtrain_add_benchmark(NAME ckpt_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_bench.cpp
    LINK dtrain::hdf5)
  target_include_directories(ckpt_bench PRIVATE "${PROJECT_SOURCE_DIR}/tests")
endif()
