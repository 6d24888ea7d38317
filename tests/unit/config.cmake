# Run descriptions (the `config` component, yaml-cpp): the reader's keys, types and errors, models
# built from a file against models built by hand, the description recorded in checkpoints, and
# the fuzz target's kept inputs replayed.
if(DTRAIN_HAVE_CONFIG)
  dtrain_add_unit_test(NAME config_reader_test IN test_config
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_reader_test.cpp LINK dtrain::config TIMEOUT 60)
  target_compile_definitions(test_config PRIVATE DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(DTRAIN_HAVE_HDF5)
    dtrain_add_unit_test(NAME config_checkpoint_test IN test_config
      SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_checkpoint_test.cpp LINK dtrain::hdf5 TIMEOUT 60)
  endif()
  set(_fuzz_dir "${CMAKE_CURRENT_LIST_DIR}/../fuzz")
  add_executable(fuzz_config_replay ${_fuzz_dir}/fuzz_config.cpp ${_fuzz_dir}/replay_main.cpp)
  target_link_libraries(fuzz_config_replay PRIVATE dtrain::config dtrain_project_flags)
  _dtrain_protocol_test_flags(fuzz_config_replay)
  add_test(NAME fuzz_config_replay
    COMMAND fuzz_config_replay ${_fuzz_dir}/corpus/config ${_fuzz_dir}/regressions/config)
  set_tests_properties(fuzz_config_replay PROPERTIES TIMEOUT 60 LABELS "unit;fuzz")
endif()
