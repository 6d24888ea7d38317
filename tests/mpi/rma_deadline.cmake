# The MPI-RMA transport with a stopped peer (mpiexec -n 2 and -n 3, 2 s deadlines): collectives
# end within the deadline plus a margin on every live rank, naming the stopped rank, and a late
# peer resumed after the others gave up crashes nobody. The ranks stop and resume each other
# with SIGSTOP / SIGCONT.
dtrain_add_mpi_test(NAME mpi_rma_deadline
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/rma_deadline_test.cpp
  NP 2 3
  TIMEOUT 90)
