# Data subsystem on real MPI ranks: sharding, resume on another rank count, parallel HDF5 reads.
find_package(ZLIB QUIET)
if(DTRAIN_HAVE_HDF5 AND ZLIB_FOUND)
  dtrain_add_mpi_test(NAME data_mpi_test IN test_mpi SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_mpi_test.cpp
    NP 1 2 3 4 LINK dtrain::hdf5 ZLIB::ZLIB TIMEOUT 120)
endif()
