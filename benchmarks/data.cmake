# data_bench: loader throughput (IDX, HDF5 layouts and drivers, in-memory) against read().
find_package(ZLIB QUIET)
if(DTRAIN_HAVE_HDF5 AND ZLIB_FOUND)
  set(_data_bench_links dtrain::hdf5 ZLIB::ZLIB)
  if(DTRAIN_HAVE_BLAS)
    list(APPEND _data_bench_links dtrain::blas)
  endif()
  dtrain_add_benchmark(NAME data_bench SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_bench.cpp
    LINK ${_data_bench_links})
endif()
