# Tests of example 20 on 2 and 3 ranks (its short defaults). Each runs the example four times
# through insitu_test.cmake: uninterrupted (solver properties, falling error, CNN rollout error at
# most half persistence's), stopped part-way and resumed from the checkpoint (final checkpoint datasets
# compared byte for byte with h5dump), and without training (the field must be bit-identical:
# dtrain's traffic on its duplicated communicator never disturbs the application's halo
# exchange). DTRAIN_SHM=0 sends dtrain's all-reduce through MPI messages, concurrently with the
# halo exchange.
# h5dump is a required package (hdf5-tools in scripts/lib.sh): without it the tests stay
# registered and fail, saying so, instead of vanishing from the run.
find_program(DTRAIN_H5DUMP NAMES h5dump h5dump.mpich)
if(NOT DTRAIN_H5DUMP)
  message(WARNING "dtrain: h5dump not found (Debian: hdf5-tools): the insitu tests will fail")
endif()
set(_insitu_settings --steps 240 --ckpt-every 100)
foreach(np 2 3)
  add_test(NAME example_insitu_surrogate_np${np}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:insitu_surrogate> -DMPIEXEC=${MPIEXEC_EXECUTABLE}
            -DNP_FLAG=${MPIEXEC_NUMPROC_FLAG} -DNP=${np} -DH5DUMP=${DTRAIN_H5DUMP}
            -DWORK=${CMAKE_CURRENT_BINARY_DIR}/insitu-np${np} -DSTOP_AFTER=130
            "-DSETTINGS=${_insitu_settings}" -P ${CMAKE_CURRENT_LIST_DIR}/insitu_test.cmake)
  set_tests_properties(example_insitu_surrogate_np${np} PROPERTIES TIMEOUT 300 PROCESSORS ${np}
    LABELS "example;mpi" ENVIRONMENT "OPENBLAS_NUM_THREADS=1;DTRAIN_SHM=0")
endforeach()
