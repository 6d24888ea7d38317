# Checkpoints on real MPI: every write strategy (rank 0 alone, MPI-IO with one writer, MPI-IO
# with disjoint slices), fallback from damage, restore on fewer ranks.
if(DTRAIN_HAVE_HDF5)
  dtrain_add_mpi_test(NAME ckpt_mpi_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_mpi.cpp
    NP 1 2 3 4 LINK dtrain::hdf5 TIMEOUT 120)
  dtrain_add_mpi_test(NAME ckpt_mpi_communicator_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_mpi_communicator.cpp NP 1 2 3 LINK dtrain::hdf5
    TIMEOUT 120)
endif()
