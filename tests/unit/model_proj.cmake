# benchmarks/allreduce_model end to end: it runs with given parameters, its table is monotone
# where the model must be (time grows with size; the best never exceeds any algorithm), its ring
# time matches the textbook formula, and bad parameters are rejected with the reason.
# Registered only where the benchmark is built (the same conditions as benchmarks/model.cmake).
include("${PROJECT_SOURCE_DIR}/examples/common/cli11.cmake")
if(DTRAIN_BUILD_BENCHMARKS AND NOT DTRAIN_UNIT_ONLY AND DTRAIN_HAVE_MPI AND DTRAIN_HAVE_CLI11)
  dtrain_add_unit_test(NAME unit_model_proj
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_proj_test.cpp
    TIMEOUT 60)
  target_compile_definitions(unit_model_proj PRIVATE
    DTRAIN_ALLREDUCE_MODEL_BIN="$<TARGET_FILE:allreduce_model>")
  add_dependencies(unit_model_proj allreduce_model)
endif()
