# Driver of the tests of examples 21 (Fortran) and 22 (C) (cmake -P). Inputs: EXE, MPIEXEC,
# NP_FLAG, NP, H5DUMP, CONFIG, WORK, STOP_AFTER. Each run works in its own directory under WORK
# (the configuration's checkpoint directory is relative).
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/full" "${WORK}/resumed")

function(run_example name dir out_var)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} ${NP} ${EXE} ${CONFIG} ${ARGN}
                  WORKING_DIRECTORY "${WORK}/${dir}" OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  file(WRITE "${WORK}/${name}.log" "${out}\n--- stderr ---\n${err}")
  message(STATUS "[${name}] ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "insitu: run '${name}' exited with ${rc}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# 1. Uninterrupted: the program checks conservation and the rollout against persistence itself.
run_example(full full out)
foreach(expect "\\(conserved\\)" "rollout: .*CNN +[^ ]+, persistence +[^ ]+ .*: ok\\)")
  if(NOT out MATCHES "${expect}")
    message(FATAL_ERROR "insitu: the uninterrupted run does not report '${expect}'")
  endif()
endforeach()
string(REGEX MATCH "final state: [^\n]+" full_state "${out}")

# 2. Stopped between checkpoints (nothing saved at the stop), restarted from the last one.
run_example(stopped resumed out --stop-after ${STOP_AFTER})
if(NOT out MATCHES "stopping at step ${STOP_AFTER} without saving")
  message(FATAL_ERROR "insitu: the stopped run did not stop at step ${STOP_AFTER}")
endif()
run_example(resumed resumed out)
if(NOT out MATCHES "resumed at step [1-9]")
  message(FATAL_ERROR "insitu: the restarted run did not resume from a checkpoint")
endif()
string(REGEX MATCH "final state: [^\n]+" resumed_state "${out}")
if(NOT full_state OR NOT resumed_state STREQUAL full_state)
  message(FATAL_ERROR "insitu: resumed run ends in '${resumed_state}', uninterrupted run in "
                      "'${full_state}'")
endif()

# 3. The final checkpoints, read independently with h5dump: every dataset byte for byte (model
# parameters, optimizer state, each rank's store and the solver's own arrays: field, snapshot,
# step).
include("${CMAKE_CURRENT_LIST_DIR}/../common/compare_checkpoints.cmake")
compare_final_checkpoints("${H5DUMP}" "${WORK}" "${WORK}/full/ckpt/*.h5" "${WORK}/resumed/ckpt/*.h5"
                          an compared "^/model/" "/store/" "/arrays/u$" "/arrays/snap$"
                          "/arrays/state$")
message(STATUS "insitu: ${compared} datasets of ${an}, the solver's arrays among them, identical "
               "after resume")
