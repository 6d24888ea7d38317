# GradientSync's sharded steps (reduce-scatter, each rank updating its part, all-gather of the
# parameters) against the unsharded step: bits on 2 ranks and in reproducible mode, the
# optimizer state's gather, and a partial state refused by the checkpoint protocol.
dtrain_add_unit_test(NAME unit_comm_sharded IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_sharded_test.cpp
  LINK dtrain::loopback
  TIMEOUT 300)
