# hier and hier_leader over MPI on fake nodes (DTRAIN_RANKS_PER_NODE): 2 ranks as 2x1, 3 ranks
# as 3x1 and as 2+1 (uneven), 4 ranks as 4x1 and 2x2, against MPI_Allreduce. Only the hier test
# case of mpi_comm runs here; mpi_comm_np2..4 run it on one node.
if(TARGET test_mpi)
  foreach(_case "2;1" "3;1" "3;2" "4;1" "4;2")
    list(GET _case 0 _np)
    list(GET _case 1 _rpn)
    set(_name mpi_comm_hier_np${_np}_rpn${_rpn})
    add_test(NAME ${_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${_np} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:test_mpi> ${MPIEXEC_POSTFLAGS} --source-file=*/comm_mpi_test.cpp
              --test-case=*hier*)
    set_tests_properties(${_name} PROPERTIES TIMEOUT 120 PROCESSORS ${_np} LABELS "mpi"
      SKIP_RETURN_CODE 77
      ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=115;DTRAIN_RANKS_PER_NODE=${_rpn}")
  endforeach()
endif()

# The list form of DTRAIN_RANKS_PER_NODE (node sizes in rank order): uneven maps 3,1 and 1,3,
# 2,1 and 1,1,2 and the even 2,2, against MPI_Allreduce, also on node-shared heap buffers; a list
# that does not add up is refused on every rank.
if(DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY)
  target_sources(test_mpi PRIVATE ${CMAKE_CURRENT_LIST_DIR}/comm_hier_mpi_test.cpp)
  foreach(_case "3;2,1" "4;3,1" "4;1,3" "4;1,1,2" "4;2,2")
    list(GET _case 0 _np)
    list(GET _case 1 _list)
    string(REPLACE "," "_" _tag "${_list}")
    set(_name mpi_comm_hier_list_np${_np}_${_tag})
    add_test(NAME ${_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${_np} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:test_mpi> ${MPIEXEC_POSTFLAGS}
              --source-file=*/comm_hier_mpi_test.cpp)
    set_tests_properties(${_name} PROPERTIES TIMEOUT 120 PROCESSORS ${_np} LABELS "mpi"
      SKIP_RETURN_CODE 77
      ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=115;DTRAIN_RANKS_PER_NODE=${_list}")
  endforeach()
endif()
