# Checkpoints: CRC32C, the interval model and the blocks of a flat run (core only), the HDF5 Checkpointer over thread
# ranks, the SIGKILL test (with its helper writer), and the h5py / h5dump schema checks on a
# sample file.
dtrain_add_unit_test(NAME ckpt_crc32c_test IN test_ckpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_crc32c.cpp
  TIMEOUT 60)
dtrain_add_unit_test(NAME ckpt_interval_test IN test_ckpt
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_interval.cpp TIMEOUT 60)
dtrain_add_unit_test(NAME ckpt_flat_blocks_test IN test_ckpt
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_flat_blocks.cpp TIMEOUT 60)
if(DTRAIN_HAVE_HDF5)
  dtrain_add_unit_test(NAME ckpt_checkpointer_test IN test_ckpt
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_checkpointer.cpp LINK dtrain::hdf5 TIMEOUT 120
    ARGS "--test-case-exclude=*single damaged byte*")
  # The random byte-damage case runs on its own: after HDF5 1.10 has parsed deliberately corrupted
  # metadata it cannot release some of its internal caches at exit ("infinite loop closing
  # library"), which LeakSanitizer reports as leaks inside libhdf5. Only this test suppresses them.
  add_test(NAME ckpt_checkpointer_damage_test
    COMMAND test_ckpt "--source-file=*/ckpt_checkpointer.cpp" "--test-case=*single damaged byte*")
  set_tests_properties(ckpt_checkpointer_damage_test PROPERTIES TIMEOUT 120 LABELS "unit"
    ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=115;LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/ckpt/lsan_hdf5_corrupt.supp:print_suppressions=0")

  dtrain_add_unit_test(NAME ckpt_communicator_test IN test_ckpt
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_communicator.cpp LINK dtrain::hdf5 dtrain::loopback
    TIMEOUT 120)

  # Fully sharded training's checkpoints: replicated and fully sharded runs resume from each
  # other's files, on other world sizes too.
  dtrain_add_unit_test(NAME ckpt_fully_sharded_test IN test_ckpt
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_fully_sharded.cpp LINK dtrain::hdf5 dtrain::loopback
    TIMEOUT 120)

  # The memory of a save of a tensor held in parts (its own binary: it replaces operator new).
  dtrain_add_unit_test(NAME ckpt_parts_memory_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_parts_memory.cpp LINK dtrain::hdf5 dtrain::loopback
    TIMEOUT 60)

  # A save whose file loses one write (ENOSPC) at each point of the file in turn (its own
  # binary: it replaces pwrite).
  dtrain_add_unit_test(NAME ckpt_write_faults_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_write_faults.cpp LINK dtrain::hdf5 TIMEOUT 120)

  # Multi-level checkpoints (node-local, partner, shared) with fake nodes and a directory each.
  dtrain_add_unit_test(NAME ckpt_levels_test IN test_ckpt
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_levels.cpp LINK dtrain::hdf5 dtrain::loopback
    TIMEOUT 120)

  set(_ckpt_helpers "${CMAKE_CURRENT_LIST_DIR}/../ckpt")
  add_executable(ckpt_kill_writer ${_ckpt_helpers}/kill_writer.cpp)
  target_link_libraries(ckpt_kill_writer PRIVATE dtrain::core dtrain::hdf5 dtrain_project_flags)
  target_include_directories(ckpt_kill_writer PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  _dtrain_protocol_test_flags(ckpt_kill_writer)
  dtrain_add_unit_test(NAME ckpt_kill_test IN test_ckpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_kill.cpp
    LINK dtrain::hdf5 TIMEOUT 180)
  target_compile_definitions(test_ckpt PRIVATE
    DTRAIN_CKPT_KILL_WRITER="$<TARGET_FILE:ckpt_kill_writer>")
  add_dependencies(test_ckpt ckpt_kill_writer)

  add_executable(ckpt_make_sample ${_ckpt_helpers}/make_sample.cpp)
  target_link_libraries(ckpt_make_sample PRIVATE dtrain::core dtrain::hdf5 dtrain_project_flags)
  target_include_directories(ckpt_make_sample PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  _dtrain_protocol_test_flags(ckpt_make_sample)
  # h5dump is a required package (hdf5-tools in scripts/lib.sh): without it the test fails,
  # saying so, instead of vanishing from the run.
  find_program(DTRAIN_H5DUMP h5dump)
  if(NOT DTRAIN_H5DUMP)
    message(WARNING "dtrain: h5dump not found (Debian: hdf5-tools): ckpt_schema_h5dump will fail")
  endif()
  add_test(NAME ckpt_schema_h5dump
    COMMAND sh ${_ckpt_helpers}/check_h5dump.sh $<TARGET_FILE:ckpt_make_sample>
            ${CMAKE_CURRENT_BINARY_DIR}/ckpt_schema_h5dump)
  set_tests_properties(ckpt_schema_h5dump PROPERTIES TIMEOUT 60 LABELS "unit")
  # h5py check: /usr/bin/python3 (the system one carries python3-h5py).
  set(_ckpt_py /usr/bin/python3)
  if(EXISTS ${_ckpt_py})
    execute_process(COMMAND ${_ckpt_py} -c "import h5py, numpy" RESULT_VARIABLE _ckpt_h5py
                    OUTPUT_QUIET ERROR_QUIET)
  else()
    set(_ckpt_h5py 1)
  endif()
  if(_ckpt_h5py EQUAL 0)
    add_test(NAME ckpt_schema_h5py
      COMMAND ${_ckpt_py} ${_ckpt_helpers}/check_schema.py $<TARGET_FILE:ckpt_make_sample>
              ${CMAKE_CURRENT_BINARY_DIR}/ckpt_schema_h5py)
    set_tests_properties(ckpt_schema_h5py PROPERTIES TIMEOUT 60 LABELS "unit")
  else()
    message(STATUS "dtrain: ckpt_schema_h5py off: /usr/bin/python3 with h5py not found "
                   "(Debian: python3-h5py)")
  endif()
endif()
