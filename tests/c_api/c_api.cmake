# The C API (bindings/c) and the same bits from C++, C and Fortran. c_api: the C test on 2 ranks
# (training, prediction against a forward computed in the test, checkpoints, the in-situ store,
# error paths, device arrays on the emulated device, messages per thread). lang_bits_cpp: the same run in C++ by ConfiguredRun and by a hand-written loop.
# lang_same_bits: the parameters and the final checkpoint's datasets of the C++, C and Fortran
# programs are the same bits (the three run first, as fixtures). Each test runs in its own work
# directory; 2 ranks of a few milliseconds of training each, about a second of wall time with
# MPI start-up.
if(DTRAIN_HAVE_C AND NOT DTRAIN_UNIT_ONLY)
  set(_lang_dir "${CMAKE_CURRENT_LIST_DIR}")
  set(_lang_work "${PROJECT_BINARY_DIR}/tests/lang")
  # The C API of a test build, compiled once for the C and Fortran tests: its device policy is the
  # emulated device (emulated_policy.hpp), and the tests reach that device's memory through
  # emulated_device_c.h. The runs they compare with the other languages are host runs.
  dtrain_add_c_intree(dtrain_c_intree_emulated "${PROJECT_SOURCE_DIR}/tests/c_api/emulated_device_c.cpp")
  target_compile_definitions(dtrain_c_intree_emulated PRIVATE
    "DTRAIN_C_DEVICE_POLICY_HEADER=\"emulated_policy.hpp\"")
  target_include_directories(dtrain_c_intree_emulated PUBLIC "${PROJECT_SOURCE_DIR}/tests/c_api"
                                                             "${PROJECT_SOURCE_DIR}/tests")
  if(DTRAIN_HAVE_FORTRAN)
    dtrain_add_fortran_intree(dtrain_fortran_intree_emulated dtrain_c_intree_emulated)
  endif()
  find_package(Threads REQUIRED)
  add_executable(c_api_test "${_lang_dir}/c_api_test.c")
  target_link_libraries(c_api_test PRIVATE dtrain_c_intree_emulated Threads::Threads)
  set_target_properties(c_api_test PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(c_api_test PRIVATE
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -pedantic -Werror>
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
  add_test(NAME c_api
    COMMAND bash "${_lang_dir}/run_in.sh" "${_lang_work}/c" ${MPIEXEC_EXECUTABLE}
            ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:c_api_test> "${_lang_dir}/mlp.yaml"
            "${_lang_dir}/bad_key.yaml" params.bin)
  add_executable(lang_bits_cpp "${_lang_dir}/lang_bits_cpp.cpp")
  # The objects dtrain::c builds on, CBLAS included when found: the same kernels, the same bits.
  target_link_libraries(lang_bits_cpp PRIVATE dtrain::config dtrain::hdf5 dtrain::mpi
                                              dtrain_project_flags)
  if(DTRAIN_HAVE_BLAS)
    target_link_libraries(lang_bits_cpp PRIVATE dtrain::blas)
  endif()
  add_test(NAME c_api_lang_bits_cpp
    COMMAND bash "${_lang_dir}/run_in.sh" "${_lang_work}/cpp" ${MPIEXEC_EXECUTABLE}
            ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:lang_bits_cpp> "${_lang_dir}/mlp.yaml"
            params.bin)
  set_tests_properties(c_api PROPERTIES FIXTURES_SETUP lang_c)
  set_tests_properties(c_api_lang_bits_cpp PROPERTIES FIXTURES_SETUP lang_cpp)
  set(_langs cpp c)
  set(_fixtures lang_cpp lang_c)
  if(DTRAIN_HAVE_FORTRAN)
    list(APPEND _langs fortran)
    list(APPEND _fixtures lang_fortran)
  endif()
  add_test(NAME lang_same_bits
    COMMAND bash "${_lang_dir}/same_bits.sh" "${_lang_work}" ${_langs})
  set_tests_properties(lang_same_bits PROPERTIES FIXTURES_REQUIRED "${_fixtures}")
  set_tests_properties(c_api c_api_lang_bits_cpp lang_same_bits PROPERTIES TIMEOUT 60
    PROCESSORS 2 LABELS "mpi;lang")
  # The three languages' runs continue one run identity on purpose (DTRAIN_CKPT_RUN_ID), so that
  # their checkpoints can be the same bits: a fresh run directory otherwise draws its own.
  set_tests_properties(c_api c_api_lang_bits_cpp PROPERTIES
    ENVIRONMENT "DTRAIN_CKPT_RUN_ID=lang-same-bits")
  # docs/fortran-and-c.md's C and Fortran programs compile (its C++ one is docs_fortran_and_c).
  if(DTRAIN_HAVE_FORTRAN)
    add_test(NAME docs_fortran_and_c_languages
      COMMAND bash "${_lang_dir}/doc_snippets.sh" "${PROJECT_SOURCE_DIR}" "${_lang_work}/docs"
              "${MPI_C_COMPILER}" "${MPI_Fortran_COMPILER}" "${_lang_work}/mod")
    set_tests_properties(docs_fortran_and_c_languages PROPERTIES TIMEOUT 60 LABELS "docs;lang")
  endif()
endif()
