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
file(GLOB full_ckpt "${WORK}/full/ckpt-*.h5")
file(GLOB resumed_ckpt "${WORK}/resumed/ckpt-*.h5")
list(SORT full_ckpt)
list(SORT resumed_ckpt)
list(GET full_ckpt -1 a)
list(GET resumed_ckpt -1 b)
get_filename_component(an "${a}" NAME)
get_filename_component(bn "${b}" NAME)
if(NOT an STREQUAL bn)
  message(FATAL_ERROR "insitu: final checkpoints differ in step: ${an} and ${bn}")
endif()
execute_process(COMMAND ${H5DUMP} -n "${a}" OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "insitu: h5dump -n ${a} failed")
endif()
string(REGEX MATCHALL "dataset +[^\n]+" lines "${listing}")
set(compared 0)
set(saw_field OFF)
set(saw_params OFF)
foreach(l IN LISTS lines)
  string(REGEX REPLACE "dataset +" "" path "${l}")
  string(STRIP "${path}" path)
  string(MAKE_C_IDENTIFIER "${path}" id)
  foreach(which a b)
    execute_process(COMMAND ${H5DUMP} -d "${path}" -b LE -o "${WORK}/${id}.${which}.bin" "${${which}}"
                    OUTPUT_QUIET RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "insitu: h5dump -d ${path} failed on ${${which}}")
    endif()
  endforeach()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${WORK}/${id}.a.bin" "${WORK}/${id}.b.bin"
                  RESULT_VARIABLE same)
  if(NOT same EQUAL 0)
    message(FATAL_ERROR "insitu: dataset ${path} differs between the uninterrupted and the resumed run")
  endif()
  math(EXPR compared "${compared} + 1")
  if(path MATCHES "/sim/u$")
    set(saw_field ON)
  endif()
  if(path MATCHES "^/cnn/")
    set(saw_params ON)
  endif()
endforeach()
if(NOT saw_field OR NOT saw_params)
  message(FATAL_ERROR "insitu: the checkpoint lacks the field or the model parameters")
endif()
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
