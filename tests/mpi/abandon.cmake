# Timeouts that say who (a stopped peer, a rank stopped itself) and a late peer after the others
# gave up, under mpiexec -n 2 and -n 3 with deadlines of 1 to 2 s. The ranks stop and resume
# each other with SIGSTOP / SIGCONT. Mostly asleep or stopped (0.15 of a core on 2 ranks, 0.3 on
# 3, measured): one processor slot, so that another test runs beside them.
dtrain_add_mpi_test(NAME mpi_abandon IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/abandon_test.cpp
  NP 2 3
  SLOTS 1
  TIMEOUT 90)
