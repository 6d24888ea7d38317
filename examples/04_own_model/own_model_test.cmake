# Driver of example 04's test (cmake -P). Inputs: EXE, MPIEXEC, NP_FLAG, NP, WORK, STOP_AFTER.
# Three runs: uninterrupted (the example checks its held-out loss and that the replicas are
# bit-identical, exiting non-zero otherwise); stopped at STOP_AFTER, between two checkpoints;
# restarted in the same directory, which resumes from the newest checkpoint and must print the
# uninterrupted run's final-parameter checksum.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(own_run name out_var)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} ${NP} ${EXE} ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message(STATUS "[${name}] ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "own_model: run '${name}' exited with ${rc}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(final_parameters text out_var)
  string(REGEX MATCH "final parameters [0-9a-f]+" line "${text}")
  if(NOT line)
    message(FATAL_ERROR "own_model: no 'final parameters' line in the output")
  endif()
  set(${out_var} "${line}" PARENT_SCOPE)
endfunction()

own_run(full out --run-dir "${WORK}/full")
if(NOT out MATCHES "replicas bit-identical" OR NOT out MATCHES "\nOK\n")
  message(FATAL_ERROR "own_model: the uninterrupted run did not pass its own checks")
endif()
final_parameters("${out}" full_params)

own_run(stopped out --run-dir "${WORK}/resumed" --stop-after ${STOP_AFTER})
if(NOT out MATCHES "stopping at step ${STOP_AFTER} without saving")
  message(FATAL_ERROR "own_model: the stopped run did not stop at step ${STOP_AFTER}")
endif()
own_run(resumed out --run-dir "${WORK}/resumed")
if(NOT out MATCHES "resumed at step [1-9]")
  message(FATAL_ERROR "own_model: the restarted run did not resume from a checkpoint")
endif()
final_parameters("${out}" resumed_params)
if(NOT resumed_params STREQUAL full_params)
  message(FATAL_ERROR "own_model: resumed run ends with '${resumed_params}', the uninterrupted "
                      "run with '${full_params}'")
endif()
message(STATUS "own_model: the resumed run ends with the uninterrupted run's parameters")
