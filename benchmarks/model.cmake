# allreduce_model: the all-reduce cost model projected from 2 to 100,000 ranks (table, CSV, JSON,
# gnuplot heat map) and checked against allreduce_bench --json measurements.
include("${PROJECT_SOURCE_DIR}/examples/common/cli11.cmake")
if(DTRAIN_HAVE_MPI AND DTRAIN_HAVE_CLI11)
  dtrain_add_benchmark(NAME allreduce_model
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/allreduce_model.cpp
    LINK dtrain::mpi dtrain::loopback)
  dtrain_use_cli11(allreduce_model)
endif()
