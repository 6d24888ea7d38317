# data_bench: loader throughput (IDX, HDF5 layouts and drivers, in-memory) against read().
find_package(ZLIB QUIET)
include("${PROJECT_SOURCE_DIR}/examples/common/cli11.cmake")
if(DTRAIN_HAVE_HDF5 AND ZLIB_FOUND AND DTRAIN_HAVE_CLI11)
  set(_data_bench_links dtrain::hdf5 ZLIB::ZLIB)
  if(DTRAIN_HAVE_BLAS)
    list(APPEND _data_bench_links dtrain::blas)
  endif()
  dtrain_add_benchmark(NAME data_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_bench.cpp
    LINK ${_data_bench_links})
  dtrain_use_cli11(data_bench)
endif()
