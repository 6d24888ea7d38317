# Finds rdma-core's libibverbs. Defines ibverbs_FOUND and the imported target ibverbs::ibverbs.
find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
find_library(IBVERBS_LIBRARY NAMES ibverbs)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ibverbs REQUIRED_VARS IBVERBS_LIBRARY IBVERBS_INCLUDE_DIR)
if(ibverbs_FOUND AND NOT TARGET ibverbs::ibverbs)
  add_library(ibverbs::ibverbs UNKNOWN IMPORTED)
  set_target_properties(ibverbs::ibverbs PROPERTIES
    IMPORTED_LOCATION "${IBVERBS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${IBVERBS_INCLUDE_DIR}")
endif()
mark_as_advanced(IBVERBS_INCLUDE_DIR IBVERBS_LIBRARY)
