# Driver of the insitu example tests (cmake -P). Inputs: EXE, MPIEXEC, NP_FLAG, NP, H5DUMP, WORK,
# STOP_AFTER, SETTINGS (the example's options, a list).
if(NOT H5DUMP OR NOT EXISTS "${H5DUMP}")
  message(FATAL_ERROR "insitu: h5dump not found when the build was configured (Debian: "
                      "hdf5-tools, a required package of scripts/lib.sh): install it and "
                      "reconfigure")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(insitu_run name out_var)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} ${NP} ${EXE} ${SETTINGS} ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  file(WRITE "${WORK}/${name}.log" "${out}\n--- stderr ---\n${err}")
  message(STATUS "[${name}] ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "insitu: run '${name}' exited with ${rc}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(final_state text out_var)
  string(REGEX MATCH "final state: step [0-9]+ field [0-9a-f]+ parameters [0-9a-f]+" line "${text}")
  if(NOT line)
    message(FATAL_ERROR "insitu: no 'final state' line in the output")
  endif()
  set(${out_var} "${line}" PARENT_SCOPE)
endfunction()

# 1. Uninterrupted: the example checks the solver, the falling error and the rollout (CNN error at
# most half persistence's; the solver's own steps through the same rollout exact) itself.
insitu_run(full out --run-dir "${WORK}/full")
final_state("${out}" full_state)
foreach(expect "Fourier mode after 50 steps, max error [^ ]+ against the exact discrete decay \\(ok\\)"
               "\\(conserved\\)" "CNN error on fresh snapshots: first [^ ]+, final [^ ]+ \\(ok\\)"
               "rollout: .*CNN [^ ]+, persistence [^ ]+, coarse step .* \\(CNN below [^ ]+ x persistence: ok\\)"
               "rollout check: the solver's own steps [^ ]+ \\(ok\\)" "replicas bit-identical")
  if(NOT out MATCHES "${expect}")
    message(FATAL_ERROR "insitu: the uninterrupted run does not report '${expect}'")
  endif()
endforeach()

# 2. Stopped part-way (between checkpoints, nothing saved at the stop), then restarted.
insitu_run(stopped out --run-dir "${WORK}/resumed" --stop-after ${STOP_AFTER})
if(NOT out MATCHES "stopping at step ${STOP_AFTER} without saving")
  message(FATAL_ERROR "insitu: the stopped run did not stop at step ${STOP_AFTER}")
endif()
insitu_run(resumed out --run-dir "${WORK}/resumed")
if(NOT out MATCHES "resumed at step [1-9]")
  message(FATAL_ERROR "insitu: the restarted run did not resume from a checkpoint")
endif()
final_state("${out}" resumed_state)
if(NOT resumed_state STREQUAL full_state)
  message(FATAL_ERROR "insitu: resumed run ends in '${resumed_state}', uninterrupted run in "
                      "'${full_state}'")
endif()

# The final checkpoints, read independently with h5dump: every dataset byte for byte.
include("${CMAKE_CURRENT_LIST_DIR}/../common/compare_checkpoints.cmake")
compare_final_checkpoints("${H5DUMP}" "${WORK}" "${WORK}/full/ckpt-*.h5" "${WORK}/resumed/ckpt-*.h5"
                          an compared "/sim/u$" "^/cnn/")
message(STATUS "insitu: ${compared} datasets of ${an} identical after resume")

# 3. The simulation alone: the same field, bit for bit, as with training running beside it.
insitu_run(alone out --run-dir "${WORK}/alone" --train-every 0)
final_state("${out}" alone_state)
string(REGEX MATCH "field [0-9a-f]+" f_full "${full_state}")
string(REGEX MATCH "field [0-9a-f]+" f_alone "${alone_state}")
if(NOT f_full STREQUAL f_alone)
  message(FATAL_ERROR "insitu: the field with training (${f_full}) differs from the field "
                      "without (${f_alone})")
endif()
message(STATUS "insitu: all checks passed on ${NP} ranks")
