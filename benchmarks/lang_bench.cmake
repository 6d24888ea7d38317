# lang_bench: a train step through the Fortran module against the same step called from C++
# (benchmarks/lang_bench.f90 and lang_bench_cpp.cpp in one program), 2 ranks, the in-situ
# example's configuration. Figures in benchmarks/RESULTS.md.
if(DTRAIN_HAVE_FORTRAN)
  add_executable(lang_bench "${CMAKE_CURRENT_LIST_DIR}/lang_bench.f90"
                            "${CMAKE_CURRENT_LIST_DIR}/lang_bench_cpp.cpp")
  target_link_libraries(lang_bench PRIVATE dtrain_fortran_intree)
  target_compile_options(lang_bench PRIVATE $<$<COMPILE_LANGUAGE:Fortran>:-std=f2018 -Wall>)
  set_target_properties(lang_bench PROPERTIES LINKER_LANGUAGE Fortran
    RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/benchmarks")
endif()
