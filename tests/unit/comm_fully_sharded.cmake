# Fully sharded training (FullyShardedSync) against the replicated step: bits in reproducible
# mode at 1-4 thread ranks (and 2 without it), unit layouts, working buffers, prefetch,
# accumulation and global-norm clipping to rounding, and a rank's live bytes by the model
# allocator's own count.
dtrain_add_unit_test(NAME unit_comm_fully_sharded IN test_comm
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_fully_sharded_test.cpp
  LINK dtrain::loopback
  TIMEOUT 120)
