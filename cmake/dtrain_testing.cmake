# Helpers that register dtrain's tests, examples and benchmarks. Each subsystem keeps its own
# fragment (tests/unit/<area>.cmake, tests/mpi/<area>.cmake, benchmarks/<area>.cmake, ...).

include_guard(GLOBAL)

find_package(doctest QUIET CONFIG)
if(NOT TARGET doctest::doctest)
  find_path(DTRAIN_DOCTEST_INCLUDE_DIR doctest/doctest.h)
  if(NOT DTRAIN_DOCTEST_INCLUDE_DIR)
    message(FATAL_ERROR "dtrain tests need doctest (Debian: apt-get install doctest-dev), "
                        "or configure with -DDTRAIN_BUILD_TESTS=OFF")
  endif()
  add_library(doctest::doctest INTERFACE IMPORTED)
  set_target_properties(doctest::doctest PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_DOCTEST_INCLUDE_DIR}")
endif()

set(DTRAIN_TEST_SUPPORT_DIR "${PROJECT_SOURCE_DIR}/tests/support")

# Flags every project-owned target gets: warnings, and the sanitizers when asked.
add_library(dtrain_project_flags INTERFACE)
target_compile_options(dtrain_project_flags INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wno-unused-parameter>)
if(DTRAIN_SANITIZE)
  target_compile_options(dtrain_project_flags INTERFACE
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(dtrain_project_flags INTERFACE -fsanitize=address,undefined)
endif()
# Release builds keep assertions: tests assert through them.
target_compile_options(dtrain_project_flags INTERFACE $<$<CONFIG:Release>:-UNDEBUG>)

# The shared doctest mains (watchdog included).
add_library(dtrain_test_main STATIC "${DTRAIN_TEST_SUPPORT_DIR}/doctest_main.cpp")
target_link_libraries(dtrain_test_main PUBLIC doctest::doctest dtrain::core dtrain_project_flags)
target_include_directories(dtrain_test_main PUBLIC "${PROJECT_SOURCE_DIR}/tests")
if(DTRAIN_HAVE_MPI)
  add_library(dtrain_test_mpi_main STATIC "${DTRAIN_TEST_SUPPORT_DIR}/doctest_mpi_main.cpp")
  target_link_libraries(dtrain_test_mpi_main PUBLIC doctest::doctest dtrain::mpi dtrain_project_flags)
  target_include_directories(dtrain_test_mpi_main PUBLIC "${PROJECT_SOURCE_DIR}/tests")
endif()

set(DTRAIN_DEFAULT_TEST_TIMEOUT 300)

# The test executables of protocols, files and transports (communication, checkpoints, data,
# errors, faults, MPI tests) compile at DTRAIN_TEST_OPT, placed after the build type's flags so
# that it wins: they check what the code does, not how fast, and -O1 compiles them in about half
# of -O3's time (tests/unit/comm_transport_test.cpp with GCC 12: 23 s against 41 s), which is
# most of the build. The numeric tests (host kernels, model, optimizers: registered with
# OPTIMIZED) keep the build type's optimisation, since they check vectorised lanes against scalar
# references as users compile them; so do examples, benchmarks and the programs tests run.
set(DTRAIN_TEST_OPT "-O1" CACHE STRING
    "optimisation flag of protocol test executables (empty: the build type's own)")

function(_dtrain_protocol_test_flags target)
  if(DTRAIN_TEST_OPT AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE ${DTRAIN_TEST_OPT})
  endif()
endfunction()

# dtrain_add_unit_test(NAME n SOURCES ... [LINK ...] [TIMEOUT s] [LABELS ...] [ARGS ...]
#                      [OPTIMIZED])
function(dtrain_add_unit_test)
  cmake_parse_arguments(A "OPTIMIZED" "NAME;TIMEOUT" "SOURCES;LINK;LABELS;ARGS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${DTRAIN_DEFAULT_TEST_TIMEOUT})
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE dtrain_test_main dtrain::core ${A_LINK})
  if(NOT A_OPTIMIZED)
    _dtrain_protocol_test_flags(${A_NAME})
  endif()
  add_test(NAME ${A_NAME} COMMAND ${A_NAME} ${A_ARGS})
  # The in-process watchdog fires a little before CTest's timeout so the report names the test.
  math(EXPR _wd "${A_TIMEOUT} - 5")
  set_tests_properties(${A_NAME} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "unit;${A_LABELS}"
    SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=${_wd}")
endfunction()

# dtrain_add_mpi_test(NAME n SOURCES ... NP 1 2 3 4 [LINK ...] [TIMEOUT s] [LABELS ...])
function(dtrain_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;LINK;NP;LABELS" ${ARGN})
  if(NOT DTRAIN_HAVE_MPI OR DTRAIN_UNIT_ONLY)
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${DTRAIN_DEFAULT_TEST_TIMEOUT})
  endif()
  if(NOT A_NP)
    set(A_NP 1 2)
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE dtrain_test_mpi_main dtrain::mpi ${A_LINK})
  _dtrain_protocol_test_flags(${A_NAME})
  math(EXPR _wd "${A_TIMEOUT} - 5")
  foreach(np IN LISTS A_NP)
    add_test(NAME ${A_NAME}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${A_NAME}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${A_NAME}_np${np} PROPERTIES TIMEOUT ${A_TIMEOUT} PROCESSORS ${np}
      LABELS "mpi;${A_LABELS}" SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=${_wd}")
  endforeach()
endfunction()

# dtrain_add_benchmark(NAME n SOURCES ... [LINK ...])
function(dtrain_add_benchmark)
  cmake_parse_arguments(A "" "NAME" "SOURCES;LINK" ${ARGN})
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE dtrain::core dtrain_project_flags ${A_LINK})
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/benchmarks")
endfunction()

# dtrain_add_example(NAME n SOURCES ... [LINK ...] [TEST_ARGS ...] [NP n] [TIMEOUT s] [NO_TEST])
# Examples are self-checking: the CTest runs them (under mpiexec when NP is given).
function(dtrain_add_example)
  cmake_parse_arguments(A "NO_TEST" "NAME;NP;TIMEOUT" "SOURCES;LINK;TEST_ARGS" ${ARGN})
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE dtrain::core dtrain_project_flags ${A_LINK})
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/examples")
  if(A_NO_TEST OR NOT DTRAIN_BUILD_TESTS)
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${DTRAIN_DEFAULT_TEST_TIMEOUT})
  endif()
  if(A_NP)
    add_test(NAME example_${A_NAME}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${A_NAME}> ${MPIEXEC_POSTFLAGS} ${A_TEST_ARGS})
    set_tests_properties(example_${A_NAME} PROPERTIES PROCESSORS ${A_NP} LABELS "example;mpi")
  else()
    add_test(NAME example_${A_NAME} COMMAND ${A_NAME} ${A_TEST_ARGS})
    set_tests_properties(example_${A_NAME} PROPERTIES LABELS "example;unit")
  endif()
  set_tests_properties(example_${A_NAME} PROPERTIES TIMEOUT ${A_TIMEOUT} SKIP_RETURN_CODE 77
    WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
endfunction()
