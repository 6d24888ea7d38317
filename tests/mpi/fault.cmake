# Fault injection under mpiexec: a small trainer (MPI transport, Communicator, Hdf5Dataset on the
# MPI-IO driver, Checkpointer) in which one rank is killed, stopped, throws, calls a different
# collective or runs out of disk. Each case checks that the job ends within the (short)
# communicator deadline plus a margin, what the first error line says, and that the newest
# checkpoint is intact. Label: mpi;fault.
if(DTRAIN_HAVE_HDF5 AND DTRAIN_HAVE_MPI AND NOT DTRAIN_UNIT_ONLY)
  add_executable(fault_trainer ${CMAKE_CURRENT_LIST_DIR}/../fault/fault_trainer.cpp)
  target_link_libraries(fault_trainer PRIVATE dtrain::core dtrain::mpi dtrain::hdf5
                        dtrain_project_flags)
  target_include_directories(fault_trainer PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  _dtrain_protocol_test_flags(fault_trainer)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    foreach(_case throw throw_propagate throw_propagate_noshm diskfull kill stop mismatch)
      add_test(NAME fault_${_case}
        COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/../fault/run_fault.py
                ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:fault_trainer> ${_case}
                ${CMAKE_CURRENT_BINARY_DIR}/fault_${_case})
      # A stopped rank's job waits out the deadline asleep (0.06 of a core on average,
      # measured): it takes one processor's slot, so that another test can run beside it.
      set(_procs 2)
      if(_case STREQUAL "stop")
        set(_procs 1)
      endif()
      set_tests_properties(fault_${_case} PROPERTIES TIMEOUT 120 LABELS "mpi;fault"
        PROCESSORS ${_procs})
    endforeach()
  endif()
endif()
