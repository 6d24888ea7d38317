# Example 10 through a real single-node Slurm (tests/slurm/run_slurm.sh): sbatch of
# examples/slurm/train_fashion_mnist.sbatch with srun --mpi=pmi2 and with mpiexec. Label slurm;
# skipped (77) with the reason where the daemons cannot start (not root, packages missing).
# Registered once the examples are known (they are configured after the tests).
if(DTRAIN_HAVE_HDF5 AND DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY AND DTRAIN_BUILD_EXAMPLES)
  function(dtrain_add_slurm_test)
    if(NOT TARGET train_fashion_mnist)
      message(STATUS "dtrain: slurm_sbatch off: example 10 is not built")
      return()
    endif()
    add_test(NAME slurm_sbatch
      COMMAND bash ${PROJECT_SOURCE_DIR}/tests/slurm/run_slurm.sh
              ${PROJECT_SOURCE_DIR}/examples/slurm/train_fashion_mnist.sbatch
              $<TARGET_FILE:train_fashion_mnist>
              ${PROJECT_BINARY_DIR}/examples/01_convert_idx_to_hdf5/fashion_mnist.h5)
    # Mostly waiting for the daemons and the jobs (3.5 s of CPU in 24 s, measured): one
    # processor's slot, so that another test can run beside it; no other test starts daemons.
    set_tests_properties(slurm_sbatch PROPERTIES LABELS "slurm" TIMEOUT 600 SKIP_RETURN_CODE 77
      PROCESSORS 1 RESOURCE_LOCK slurm_daemons FIXTURES_REQUIRED data_fashion_h5)
  endfunction()
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL dtrain_add_slurm_test)
endif()
