# Fully sharded training on real MPI: the replicated step's bits in reproducible mode, and its
# checkpoints with every write strategy resumed across modes.
dtrain_add_mpi_test(NAME mpi_comm_fully_sharded IN test_mpi
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_fully_sharded_mpi.cpp
  NP 2 3
  TIMEOUT 120)
if(DTRAIN_HAVE_HDF5)
  dtrain_add_mpi_test(NAME mpi_ckpt_fully_sharded IN test_mpi
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ckpt_fully_sharded_mpi.cpp
    NP 2 3
    LINK dtrain::hdf5
    TIMEOUT 120)
endif()
