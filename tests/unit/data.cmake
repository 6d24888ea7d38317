# Data subsystem: sampler, IDX, loader, in-memory store; HDF5 (POSIX driver, no MPI start-up).
dtrain_add_unit_test(NAME data_sampler_test IN test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_sampler_test.cpp
  TIMEOUT 120)
find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  dtrain_add_unit_test(NAME data_idx_test IN test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_idx_test.cpp
    LINK ZLIB::ZLIB TIMEOUT 120)
  dtrain_add_unit_test(NAME data_loader_test IN test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_loader_test.cpp
    LINK ZLIB::ZLIB TIMEOUT 120)
  if(DTRAIN_HAVE_HDF5)
    dtrain_add_unit_test(NAME data_hdf5_test IN test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_hdf5_test.cpp
      LINK dtrain::hdf5 ZLIB::ZLIB TIMEOUT 120)
  endif()
else()
  message(STATUS "dtrain: data IDX/loader tests off: zlib not found (Debian: apt-get install zlib1g-dev)")
endif()
# The same properties over the loopback transport's ranks, when that transport is present.
if(ZLIB_FOUND AND EXISTS "${PROJECT_SOURCE_DIR}/transports/dtrain/transports/loopback.hpp")
  dtrain_add_unit_test(NAME data_loopback_test IN test_data SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_loopback_test.cpp
    LINK ZLIB::ZLIB dtrain::loopback TIMEOUT 120)
endif()
# Running normalisation statistics: Welford / Chan merges, across loopback ranks, checkpointed.
if(EXISTS "${PROJECT_SOURCE_DIR}/transports/dtrain/transports/loopback.hpp")
  dtrain_add_unit_test(NAME data_running_stats_test IN test_data
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_running_stats_test.cpp LINK dtrain::loopback TIMEOUT 60)
endif()
