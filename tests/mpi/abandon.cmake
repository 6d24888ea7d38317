# Timeouts that say who (a stopped peer, a rank stopped itself) and a late peer after the others
# gave up, under mpiexec -n 2 and -n 3 with deadlines of a few seconds. The ranks stop and resume
# each other with SIGSTOP / SIGCONT.
dtrain_add_mpi_test(NAME mpi_abandon IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/abandon_test.cpp
  NP 2 3
  TIMEOUT 90)
