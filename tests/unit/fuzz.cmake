# Fuzz targets replayed without libFuzzer: every kept seed input and every regression input (a
# crash found by tests/fuzz/run.sh, kept once fixed) runs through the target in an ordinary
# build, so the sanitizer build checks them too. The fuzzing itself is a CI stage (.ci/run).
set(_fuzz_dir "${CMAKE_CURRENT_LIST_DIR}/../fuzz")
set(_fuzz_targets)
find_package(ZLIB QUIET)
if(TARGET ZLIB::ZLIB)
  list(APPEND _fuzz_targets idx)
endif()
if(DTRAIN_HAVE_HDF5)
  list(APPEND _fuzz_targets ckpt_manifest hdf5_open)
endif()
foreach(_t IN LISTS _fuzz_targets)
  add_executable(fuzz_${_t}_replay ${_fuzz_dir}/fuzz_${_t}.cpp ${_fuzz_dir}/replay_main.cpp)
  target_link_libraries(fuzz_${_t}_replay PRIVATE dtrain::core dtrain_project_flags)
  if(_t STREQUAL "idx")
    target_link_libraries(fuzz_${_t}_replay PRIVATE ZLIB::ZLIB)
  else()
    target_link_libraries(fuzz_${_t}_replay PRIVATE dtrain::hdf5)
  endif()
  add_test(NAME fuzz_${_t}_replay
    COMMAND fuzz_${_t}_replay ${_fuzz_dir}/corpus/${_t} ${_fuzz_dir}/regressions/${_t})
  set_tests_properties(fuzz_${_t}_replay PROPERTIES TIMEOUT 60 LABELS "unit;fuzz")
endforeach()
