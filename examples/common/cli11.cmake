# CLI11 (header-only; Debian: libcli11-dev) for the command lines of examples and benchmarks.
# Only programs that call dtrain_use_cli11() see it; the library's targets never link it.
# No include_guard: the variables and imported target are per directory, so every user includes it.
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(DTRAIN_CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(DTRAIN_CLI11_INCLUDE_DIR)
    add_library(CLI11::CLI11 INTERFACE IMPORTED)
    set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
      "${DTRAIN_CLI11_INCLUDE_DIR}")
  endif()
endif()
if(TARGET CLI11::CLI11)
  set(DTRAIN_HAVE_CLI11 ON)
else()
  set(DTRAIN_HAVE_CLI11 OFF)
  message(STATUS "dtrain: CLI11 not found (Debian: apt-get install libcli11-dev): examples and "
                 "benchmarks with command lines are not built")
endif()

# dtrain_use_cli11(target): CLI11 and examples/common/ (include as "common/cli.hpp").
function(dtrain_use_cli11 target)
  target_link_libraries(${target} PRIVATE CLI11::CLI11)
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/examples")
endfunction()
