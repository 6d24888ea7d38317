# dtrain::finalize_mpi (its own main): a failing process, or one with operations given up
# unfinished, returns at once without MPI_Finalize while a peer is stopped for good; a healthy one
# finalises. A hang (MPI_Finalize waiting for the stopped rank) fails by the timeout.
if(DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY)
  add_executable(mpi_finalize ${CMAKE_CURRENT_LIST_DIR}/finalize_test.cpp)
  target_link_libraries(mpi_finalize PRIVATE dtrain::mpi dtrain_project_flags)
  _dtrain_protocol_test_flags(mpi_finalize)
  foreach(mode healthy failing unfinished)
    add_test(NAME mpi_finalize_${mode}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:mpi_finalize> ${MPIEXEC_POSTFLAGS} ${mode})
    set_tests_properties(mpi_finalize_${mode} PROPERTIES TIMEOUT 30 PROCESSORS 2 LABELS "mpi")
  endforeach()
  set_tests_properties(mpi_finalize_failing PROPERTIES
    PASS_REGULAR_EXPRESSION "rank 0 skipped MPI_Finalize \\(failing\\)")
  set_tests_properties(mpi_finalize_unfinished PROPERTIES
    PASS_REGULAR_EXPRESSION
    "finalize_mpi: not finalising MPI: 1 communication operation.*rank 0 skipped MPI_Finalize \\(unfinished\\)")
  set_tests_properties(mpi_finalize_failing mpi_finalize_unfinished PROPERTIES
    FAIL_REGULAR_EXPRESSION "FAIL:")
endif()
