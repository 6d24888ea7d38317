# The Fortran module (bindings/fortran/dtrain.f90) compiled with -std=f2018 -Wall -Werror beside
# the test that uses it, on 2 ranks: training, prediction, a strided section, labels, checkpoints,
# a restore through an integer communicator, errors through stat/errmsg, the device procedures'
# C-address form on the emulated device (tests/c_api/c_api.cmake's test build of the C API). It
# also writes the parameters the same-bits test (tests/c_api/c_api.cmake) compares. About a
# second of wall time.
if(DTRAIN_HAVE_FORTRAN AND NOT DTRAIN_UNIT_ONLY)
  add_executable(fortran_test "${CMAKE_CURRENT_LIST_DIR}/fortran_test.f90")
  target_link_libraries(fortran_test PRIVATE dtrain_fortran_intree_emulated)
  target_compile_options(fortran_test PRIVATE
    $<$<COMPILE_LANGUAGE:Fortran>:-std=f2018 -Wall -Wextra -Werror>)
  # The module where docs_fortran_and_c_languages finds it (tests/c_api/doc_snippets.sh).
  set_target_properties(fortran_test PROPERTIES LINKER_LANGUAGE Fortran
    Fortran_MODULE_DIRECTORY "${PROJECT_BINARY_DIR}/tests/lang/mod")
  add_test(NAME fortran
    COMMAND bash "${PROJECT_SOURCE_DIR}/tests/c_api/run_in.sh" "${PROJECT_BINARY_DIR}/tests/lang/fortran"
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:fortran_test>
            "${PROJECT_SOURCE_DIR}/tests/c_api/mlp.yaml" "${PROJECT_SOURCE_DIR}/tests/c_api/bad_key.yaml"
            params.bin)
  set_tests_properties(fortran PROPERTIES FIXTURES_SETUP lang_fortran TIMEOUT 60 PROCESSORS 2
    LABELS "mpi;lang")
  set_tests_properties(fortran PROPERTIES ENVIRONMENT "DTRAIN_CKPT_RUN_ID=lang-same-bits")
endif()
