# Tests of example 21 on 2 and 3 ranks through insitu_resume_test.cmake: an uninterrupted run
# (heat conserved, rollout error at most half persistence's), then a run stopped between
# checkpoints and restarted, whose final checkpoint must equal the uninterrupted run's dataset for
# dataset (h5dump) and whose final solver state must equal it byte for byte.
find_program(DTRAIN_H5DUMP NAMES h5dump h5dump.mpich)
if(NOT DTRAIN_H5DUMP)
  message(STATUS "dtrain: example 21 tests off: h5dump not found (Debian: hdf5-tools)")
  return()
endif()
foreach(np 2 3)
  add_test(NAME example_fortran_insitu_np${np}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:fortran_insitu> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
            -DNP_FLAG=${MPIEXEC_NUMPROC_FLAG} -DNP=${np} -DH5DUMP=${DTRAIN_H5DUMP}
            -DCONFIG=${PROJECT_SOURCE_DIR}/examples/configs/heat_surrogate.yaml
            -DWORK=${CMAKE_CURRENT_BINARY_DIR}/insitu-np${np} -DSTOP_AFTER=130
            -P ${CMAKE_CURRENT_LIST_DIR}/insitu_resume_test.cmake)
  set_tests_properties(example_fortran_insitu_np${np} PROPERTIES TIMEOUT 120 PROCESSORS ${np}
    LABELS "example;mpi;lang" ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
endforeach()
