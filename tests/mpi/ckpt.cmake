# Checkpoints on real MPI: every write strategy (rank 0 alone, MPI-IO with one writer, MPI-IO
# with disjoint slices), both restore strategies, fallback from damage, restore on fewer ranks,
# a run directory only rank 0 sees. On 1-3 ranks: 3 is the first count that divides unevenly and
# leaves ranks out of a restore on fewer ranks; 4 ranks took 22 s on the 2-core CI machine for
# the same paths as 2 and 3.
if(DTRAIN_HAVE_HDF5)
  dtrain_add_mpi_test(NAME ckpt_mpi_test IN test_mpi SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_mpi.cpp
    NP 1 2 3 LINK dtrain::hdf5 TIMEOUT 120)
  # A run directory only rank 0 sees (rank 1 in a mount namespace with a tmpfs over it): a
  # distributed restore says so on every rank, a rank0 restore works (tests/mpi/ckpt_private_dir.sh;
  # skipped where mount namespaces are not permitted).
  add_test(NAME ckpt_mpi_private_dir_np2
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_private_dir.sh ${MPIEXEC_EXECUTABLE}
            $<TARGET_FILE:test_mpi>)
  set_tests_properties(ckpt_mpi_private_dir_np2 PROPERTIES TIMEOUT 120 PROCESSORS 2
    LABELS "mpi" SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=115")
  dtrain_add_mpi_test(NAME ckpt_mpi_communicator_test IN test_mpi
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_mpi_communicator.cpp NP 1 2 3 LINK dtrain::hdf5
    TIMEOUT 120)
  # Multi-level checkpoints: every rank a fake node, partner copies as MPI messages; and (by
  # tests/mpi/ckpt_levels_private_dir.sh, skipped without mount namespaces) one local_dir path
  # that is a private tmpfs on every rank.
  dtrain_add_mpi_test(NAME ckpt_mpi_levels_test IN test_mpi
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_mpi_levels.cpp NP 2 3 LINK dtrain::hdf5 TIMEOUT 120)
  foreach(np 2 3)
    add_test(NAME ckpt_mpi_levels_private_dir_np${np}
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_levels_private_dir.sh ${MPIEXEC_EXECUTABLE}
              $<TARGET_FILE:test_mpi> ${np})
    set_tests_properties(ckpt_mpi_levels_private_dir_np${np} PROPERTIES TIMEOUT 120
      PROCESSORS ${np} LABELS "mpi" SKIP_RETURN_CODE 77 ENVIRONMENT "DTRAIN_TEST_WATCHDOG_S=115")
  endforeach()
endif()
