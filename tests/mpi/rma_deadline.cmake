# The MPI-RMA transport with a stopped peer (mpiexec -n 2 and -n 3, 1 s deadlines): collectives
# end within the deadline plus a margin on every live rank, naming the stopped rank, and a late
# peer resumed after the others gave up crashes nobody. The ranks stop and resume each other
# with SIGSTOP / SIGCONT.
dtrain_add_mpi_test(NAME mpi_rma_deadline IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/rma_deadline_test.cpp
  NP 2 3
  TIMEOUT 90)
# Below MPI_THREAD_MULTIPLE (its own main initialises MPI_THREAD_FUNNELED): the writes flush on
# the caller's thread; all-reduces against MPI_Allreduce.
if(DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY)
  add_executable(mpi_rma_funneled ${CMAKE_CURRENT_LIST_DIR}/rma_funneled_test.cpp)
  target_link_libraries(mpi_rma_funneled PRIVATE dtrain::mpi dtrain_project_flags)
  _dtrain_protocol_test_flags(mpi_rma_funneled)
  add_test(NAME mpi_rma_funneled_np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:mpi_rma_funneled> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(mpi_rma_funneled_np2 PROPERTIES TIMEOUT 60 PROCESSORS 2 LABELS "mpi")
endif()
