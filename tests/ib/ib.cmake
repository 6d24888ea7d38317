# The verbs transport on RDMA hardware: built wherever libibverbs and MPI are found (so the
# verbs backend compiles and links in CI), run under mpiexec -n 2 and 4, skipped (exit 77) when
# no RDMA device exists. tests/ib/run_on_rdma.sh runs these and the benchmark on a NIC machine.
if(DTRAIN_HAVE_IBVERBS AND DTRAIN_HAVE_MPI)
  add_executable(ib_transport_test ${CMAKE_CURRENT_LIST_DIR}/ib_test.cpp)
  target_link_libraries(ib_transport_test PRIVATE doctest::doctest dtrain::ibverbs dtrain::mpi
    dtrain_project_flags)
  target_include_directories(ib_transport_test PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  _dtrain_protocol_test_flags(ib_transport_test)
  foreach(np 2 4)
    add_test(NAME ib_transport_test_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:ib_transport_test> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(ib_transport_test_np${np} PROPERTIES TIMEOUT 300 PROCESSORS ${np}
      LABELS "ib" SKIP_RETURN_CODE 77)
  endforeach()
else()
  message(STATUS "dtrain: ib tests off: needs libibverbs (Debian: libibverbs-dev) and MPI")
endif()
