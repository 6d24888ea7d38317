# Example 10's own binary (train_fashion_mnist) under mpiexec:
# - fault_ex10_<case> (tests/fault/run_fault_ex10.py): a bad label in one rank's shard; the data
#   file truncated while the ranks train (they throw mid-step); a SIGKILLed rank (also under
#   mpiexec -disable-auto-cleanup); a SIGSTOPped rank (also with DTRAIN_SHM=0 and resumed after
#   the others timed out); a full file system (a 2 MiB tmpfs mounted by the test: skipped unless
#   root) and a file size limit, each failing a save. Each checks that the job ends within the
#   short communicator deadline plus a margin, what the first error line says and that the newest
#   checkpoint is intact (h5py, every CRC32C). About 2-9 s each.
# - ex10_bitident (tests/fault/ex10_bitident.py), 3 ranks: 3 runs with a shared tuning file and 3
#   in reproducible mode each give one parameter set; one run of each derived mode gives the set
#   of its reference: interrupted/resumed (tuning file), --step fused, --step sharded and sharded
#   runs interrupted/resumed (their checkpoints assemble the AdamW moments' parts on rank 0, or
#   with --ckpt-strategy parallel_rank0 every rank writes its own parts) give the reproducible
#   mode's set; resumed without either keeps the run directory's calibration (about 20 s).
# Label mpi;fault; skipped (77) without h5py. Registered once the examples are known (they are
# configured after the tests).
if(DTRAIN_HAVE_HDF5 AND DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY AND DTRAIN_BUILD_EXAMPLES)
  function(dtrain_add_fault_ex10_tests)
    find_program(DTRAIN_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
    if(NOT TARGET train_fashion_mnist OR NOT DTRAIN_SYSTEM_PYTHON3)
      message(STATUS "dtrain: fault_ex10 tests off: needs example 10 and /usr/bin/python3")
      return()
    endif()
    set(_dir ${PROJECT_SOURCE_DIR}/tests/fault)
    foreach(_case bad_label truncated kill kill_nocleanup stop stop_cont_noshm enospc diskfull)
      add_test(NAME fault_ex10_${_case}
        COMMAND ${DTRAIN_SYSTEM_PYTHON3} ${_dir}/run_fault_ex10.py ${MPIEXEC_EXECUTABLE}
                $<TARGET_FILE:train_fashion_mnist> ${_case}
                ${PROJECT_BINARY_DIR}/tests/fault_ex10_${_case})
      # The stopped-rank cases wait out the deadline asleep (0.07 of a core on average,
      # measured): one processor's slot, so that another test can run beside them.
      set(_procs 2)
      if(_case MATCHES "^stop")
        set(_procs 1)
      endif()
      set_tests_properties(fault_ex10_${_case} PROPERTIES TIMEOUT 120 LABELS "mpi;fault"
        PROCESSORS ${_procs} SKIP_RETURN_CODE 77)
    endforeach()
    set(_modes "tuning,reproducible,resume,resume_auto,fused,sharded,resume_sharded")
    string(APPEND _modes ",resume_sharded_parallel")
    add_test(NAME ex10_bitident
      COMMAND ${DTRAIN_SYSTEM_PYTHON3} ${_dir}/ex10_bitident.py ${MPIEXEC_EXECUTABLE}
              $<TARGET_FILE:train_fashion_mnist> ${PROJECT_BINARY_DIR}/tests/ex10_bitident
              --runs 3 --np 3 --steps 24
              --modes ${_modes})
    set_tests_properties(ex10_bitident PROPERTIES TIMEOUT 240 LABELS "mpi;fault" PROCESSORS 2
      SKIP_RETURN_CODE 77)
  endfunction()
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL dtrain_add_fault_ex10_tests)
endif()
