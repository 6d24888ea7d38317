# dtrain_add_gpu_variants(NAME base SOURCE file USES target... [DEFINES d...])
#   The same program compiled by nvcc and hipcc (cmake/dtrain_gpu.cmake's dialects): targets
#   base_cuda, base_hip, with DTRAIN_EXAMPLE_GPU=1 (examples/common/device.hpp: --device), the
#   include directories and link libraries of the imported targets in USES, and examples/ on the
#   include path. Nothing happens without a GPU compiler or when a USES target is missing.
#   DTRAIN_GPU_PROGRAMS_COMPILE_CHECK: one target per dialect at -O0 (a compile check).
# The GPU settings are directory variables: include this file at directory scope.
if(DTRAIN_HAVE_CUDA OR DTRAIN_HAVE_HIP)
  include("${PROJECT_SOURCE_DIR}/cmake/dtrain_gpu.cmake")
endif()
function(dtrain_add_gpu_variants)
  cmake_parse_arguments(A "" "NAME;SOURCE" "USES;DEFINES" ${ARGN})
  if(NOT (DTRAIN_HAVE_CUDA OR DTRAIN_HAVE_HIP))
    return()
  endif()
  set(_inc "${PROJECT_SOURCE_DIR}/examples")
  set(_libs "")
  foreach(_t IN LISTS A_USES)
    if(NOT TARGET ${_t})
      message(STATUS "dtrain: GPU variants of ${A_NAME} off: ${_t} not found")
      return()
    endif()
    get_target_property(_i ${_t} INTERFACE_INCLUDE_DIRECTORIES)
    if(_i)
      list(APPEND _inc ${_i})
    endif()
    get_target_property(_l ${_t} INTERFACE_LINK_LIBRARIES)
    # As -L/-l: nvcc's -x cu would take a library path after the source for another source.
    foreach(_lib IN LISTS _l)
      if(_lib MATCHES "^(.*)/lib([^/]+)\\.(so|a)$")
        list(APPEND _libs "-L${CMAKE_MATCH_1}" "-l${CMAKE_MATCH_2}")
      elseif(_lib)
        list(APPEND _libs "${_lib}")
      endif()
    endforeach()
  endforeach()
  # The compiler's own system directory as -I would reorder the C++ library's include_next chain.
  list(REMOVE_ITEM _inc /usr/include /usr/local/include)
  set(_check "")
  if(DTRAIN_GPU_PROGRAMS_COMPILE_CHECK)
    set(_check COMPILE_CHECK)
  endif()
  foreach(_dialect IN LISTS DTRAIN_GPU_DIALECTS)
    dtrain_add_gpu_executable(NAME ${A_NAME}_${_dialect} SOURCE "${A_SOURCE}" DIALECT ${_dialect}
      DEFINES DTRAIN_EXAMPLE_GPU=1 ${A_DEFINES} INCLUDES ${_inc} HOST_LIBS ${_libs} ${_check})
  endforeach()
endfunction()
