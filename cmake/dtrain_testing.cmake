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
if(DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY)  # for the MPI tests: none in a unit-only build
  add_library(dtrain_test_mpi_main STATIC "${DTRAIN_TEST_SUPPORT_DIR}/doctest_mpi_main.cpp")
  target_link_libraries(dtrain_test_mpi_main PUBLIC doctest::doctest dtrain::mpi dtrain_project_flags)
  target_include_directories(dtrain_test_mpi_main PUBLIC "${PROJECT_SOURCE_DIR}/tests")
endif()

set(DTRAIN_DEFAULT_TEST_TIMEOUT 300)

# The test executables of protocols, files and transports (communication, checkpoints, data,
# errors, faults, MPI tests), and the programs such tests run (the fault trainer, the checkpoint
# writers, the fuzz replays, the verbs, finalize and funneled-RMA tests with mains of their own),
# compile at DTRAIN_TEST_OPT, placed after the build type's flags so that it wins: they check
# what the code does, not how fast, and -O1 compiles them in about half of -O3's time
# (tests/unit/comm_transport_test.cpp with GCC 12: 23 s against 41 s), which is most of the
# build. The numeric tests (host kernels, model, optimizers: registered with OPTIMIZED) keep the
# build type's optimisation, since they check vectorised lanes against scalar references as users
# compile them; so do examples and benchmarks.
set(DTRAIN_TEST_OPT "-O1" CACHE STRING
    "optimisation flag of protocol test executables (empty: the build type's own)")

# DTRAIN_TEST_OPT_<target> (e.g. -DDTRAIN_TEST_OPT_test_comm=-O1), where set, replaces that flag
# for one test executable, numeric or not: the sanitizer builds of .ci/run compile most tests at
# -O0 and keep -O1 for the two whose tests spend their time in reductions and checksums.
function(_dtrain_protocol_test_flags target)
  if(DTRAIN_TEST_OPT AND NOT DEFINED DTRAIN_TEST_OPT_${target}
     AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE ${DTRAIN_TEST_OPT})
  endif()
endfunction()
function(_dtrain_test_opt_override target)
  if(DTRAIN_TEST_OPT_${target} AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE ${DTRAIN_TEST_OPT_${target}})
  endif()
endfunction()

# Test binaries. Test sources are grouped into one executable per component (a "test binary":
# test_core, test_comm, test_ckpt, ...), compiled as unity batches: the test files of a component
# instantiate the same templates (communicators, checkpointers, layers), and one translation unit
# per batch compiles them once instead of once per file (three comm test files: 23 s together
# against 50 s apart with GCC 12 at -O1). Each CTest still names one test file: it runs the
# binary with doctest's --source-file filter, so tests keep their names, timeouts, labels and
# environment, and run in parallel as before; a filter that selects no test case fails (see
# tests/support/case_counter.hpp).
option(DTRAIN_TEST_UNITY "Compile each test binary's sources in unity batches" ON)
set(DTRAIN_TEST_UNITY_BATCH 6 CACHE STRING "test source files per unity translation unit (0: all of a binary in one)")

# Test files the test binaries compile (names such as comm_allreduce_test.cpp), for a build that
# runs only some of them (the ThreadSanitizer stage of .ci/run runs a few files' cases under TSan
# and compiles no others); empty: all. A CTest of a left-out file fails (it selects no test case).
set(DTRAIN_TEST_SOURCES "" CACHE STRING "test files of the test binaries to compile (empty: all)")

# _dtrain_test_sources(out sources...): those of the sources that DTRAIN_TEST_SOURCES keeps.
function(_dtrain_test_sources out)
  set(_kept)
  foreach(_s IN LISTS ARGN)
    get_filename_component(_n "${_s}" NAME)
    if(NOT DTRAIN_TEST_SOURCES OR _n IN_LIST DTRAIN_TEST_SOURCES)
      list(APPEND _kept "${_s}")
    endif()
  endforeach()
  set(${out} "${_kept}" PARENT_SCOPE)
endfunction()

# _dtrain_test_binary(bin MPI|UNIT OPTIMIZED) creates the shared binary on first use; later uses
# must agree on the kind and the optimisation.
function(_dtrain_test_binary bin kind optimized)
  if(TARGET ${bin})
    get_target_property(_kind ${bin} DTRAIN_TEST_KIND)
    get_target_property(_opt ${bin} DTRAIN_TEST_OPTIMIZED)
    if(NOT _kind STREQUAL kind OR NOT _opt STREQUAL optimized)
      message(FATAL_ERROR "dtrain: test binary ${bin} is ${_kind} (optimized: ${_opt}); a test "
                          "added to it asks for ${kind} (optimized: ${optimized})")
    endif()
    return()
  endif()
  add_executable(${bin})
  if(DTRAIN_TEST_SOURCES)
    # A binary whose files are all left out still links (doctest's main alone).
    set(_empty "${PROJECT_BINARY_DIR}/dtrain_test_sources_left_out.cpp")
    file(CONFIGURE OUTPUT "${_empty}" CONTENT "// DTRAIN_TEST_SOURCES left this binary's files out.\n")
    target_sources(${bin} PRIVATE "${_empty}")
  endif()
  if(kind STREQUAL "MPI")
    target_link_libraries(${bin} PRIVATE dtrain_test_mpi_main dtrain::mpi)
  else()
    target_link_libraries(${bin} PRIVATE dtrain_test_main dtrain::core)
  endif()
  if(NOT optimized)
    _dtrain_protocol_test_flags(${bin})
  endif()
  _dtrain_test_opt_override(${bin})
  set_target_properties(${bin} PROPERTIES DTRAIN_TEST_KIND ${kind} DTRAIN_TEST_OPTIMIZED ${optimized}
    UNITY_BUILD ${DTRAIN_TEST_UNITY} UNITY_BUILD_BATCH_SIZE ${DTRAIN_TEST_UNITY_BATCH})
endfunction()

# The doctest filter that selects a test's own source files inside a shared binary.
function(_dtrain_source_filter out)
  set(_names)
  foreach(_s IN LISTS ARGN)
    get_filename_component(_n "${_s}" NAME)
    list(APPEND _names "*/${_n}")
  endforeach()
  list(JOIN _names "," _joined)
  set(${out} "--source-file=${_joined}" PARENT_SCOPE)
endfunction()

# dtrain_add_unit_test(NAME n SOURCES ... [IN binary] [LINK ...] [TIMEOUT s] [LABELS ...]
#                      [ARGS ...] [OPTIMIZED])
# With IN, the sources join the shared test binary and the CTest runs only their test cases;
# without it, the test gets an executable of its own (tests that need flags of their own).
function(dtrain_add_unit_test)
  cmake_parse_arguments(A "OPTIMIZED" "NAME;TIMEOUT;IN" "SOURCES;LINK;LABELS;ARGS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${DTRAIN_DEFAULT_TEST_TIMEOUT})
  endif()
  if(A_IN)
    _dtrain_test_binary(${A_IN} UNIT ${A_OPTIMIZED})
    _dtrain_test_sources(_kept ${A_SOURCES})
    target_sources(${A_IN} PRIVATE ${_kept})
    target_link_libraries(${A_IN} PRIVATE ${A_LINK})
    _dtrain_source_filter(_filter ${A_SOURCES})
    add_test(NAME ${A_NAME} COMMAND ${A_IN} ${_filter} ${A_ARGS})
  else()
    add_executable(${A_NAME} ${A_SOURCES})
    target_link_libraries(${A_NAME} PRIVATE dtrain_test_main dtrain::core ${A_LINK})
    if(NOT A_OPTIMIZED)
      _dtrain_protocol_test_flags(${A_NAME})
    endif()
    add_test(NAME ${A_NAME} COMMAND ${A_NAME} ${A_ARGS})
  endif()
  # The in-process watchdog fires a little before CTest's timeout so the report names the test.
  math(EXPR _wd "${A_TIMEOUT} - 5")
  set_tests_properties(${A_NAME} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "unit;${A_LABELS}"
    SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=${_wd}")
endfunction()

# dtrain_add_mpi_test(NAME n SOURCES ... NP 1 2 3 4 [IN binary] [LINK ...] [TIMEOUT s]
#                     [LABELS ...] [ARGS ...] [SLOTS k])
# One CTest per rank count, n_np<k>. IN works as for unit tests. Each test reserves one CTest
# processor slot per rank, or SLOTS: for tests whose ranks mostly sleep or stand stopped, so that
# another test runs beside them.
function(dtrain_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;IN;SLOTS" "SOURCES;LINK;NP;LABELS;ARGS" ${ARGN})
  if(NOT DTRAIN_HAVE_MPI OR DTRAIN_UNIT_ONLY)
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${DTRAIN_DEFAULT_TEST_TIMEOUT})
  endif()
  if(NOT A_NP)
    set(A_NP 1 2)
  endif()
  if(A_IN)
    _dtrain_test_binary(${A_IN} MPI FALSE)
    _dtrain_test_sources(_kept ${A_SOURCES})
    target_sources(${A_IN} PRIVATE ${_kept})
    target_link_libraries(${A_IN} PRIVATE ${A_LINK})
    _dtrain_source_filter(_filter ${A_SOURCES})
    set(_bin ${A_IN})
  else()
    add_executable(${A_NAME} ${A_SOURCES})
    target_link_libraries(${A_NAME} PRIVATE dtrain_test_mpi_main dtrain::mpi ${A_LINK})
    _dtrain_protocol_test_flags(${A_NAME})
    set(_filter)
    set(_bin ${A_NAME})
  endif()
  math(EXPR _wd "${A_TIMEOUT} - 5")
  foreach(np IN LISTS A_NP)
    add_test(NAME ${A_NAME}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${_bin}> ${MPIEXEC_POSTFLAGS} ${_filter} ${A_ARGS})
    set(_slots ${np})
    if(A_SLOTS)
      set(_slots ${A_SLOTS})
    endif()
    set_tests_properties(${A_NAME}_np${np} PROPERTIES TIMEOUT ${A_TIMEOUT} PROCESSORS ${_slots}
      LABELS "mpi;${A_LABELS}" SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=${_wd}")
  endforeach()
endfunction()

# The benchmarks' optimisation flag, placed after the build type's (empty: the build type's own).
# Only for a build that checks that they compile and never measures with them: .ci/run builds
# them at -O0 (scripts/test takes it from the environment variable of the same name, so a later
# plain scripts/test builds them as users measure again).
set(DTRAIN_BENCHMARK_OPT "" CACHE STRING
    "optimisation flag of the benchmark executables (empty: the build type's own; not for measuring)")

# dtrain_add_benchmark(NAME n SOURCES ... [LINK ...])
function(dtrain_add_benchmark)
  cmake_parse_arguments(A "" "NAME" "SOURCES;LINK" ${ARGN})
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE dtrain::core dtrain_project_flags ${A_LINK})
  if(DTRAIN_BENCHMARK_OPT AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${A_NAME} PRIVATE ${DTRAIN_BENCHMARK_OPT})
  endif()
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
