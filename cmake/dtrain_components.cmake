# dtrain component discovery, shared by the source tree and by the installed package config.
# Defines IMPORTED INTERFACE targets dtrain::core, dtrain::loopback and, when their dependencies are
# found, dtrain::mpi, dtrain::hdf5, dtrain::ibverbs, dtrain::blas, dtrain::cuda, dtrain::hip,
# dtrain::config, plus
# dtrain::dtrain (everything found). Sets DTRAIN_HAVE_<COMP> in the caller's scope.

include_guard(GLOBAL)

set(_dtrain_pkg_MPI "mpich libmpich-dev")
set(_dtrain_pkg_HDF5 "libhdf5-mpich-dev")
set(_dtrain_pkg_IBVERBS "libibverbs-dev")
set(_dtrain_pkg_BLAS "libopenblas-dev")
set(_dtrain_pkg_CUDA "nvidia-cuda-toolkit (or NVIDIA's CUDA toolkit)")
set(_dtrain_pkg_HIP "hipcc libamdhip64-dev")
set(_dtrain_pkg_CONFIG "libyaml-cpp-dev")

# _dtrain_component_missing(COMP MODE WHY): AUTO -> one status line; ON -> fatal error.
macro(_dtrain_component_missing comp mode why)
  set(_msg "dtrain: component ${comp} is off: ${why} (Debian: apt-get install ${_dtrain_pkg_${comp}})")
  if("${mode}" STREQUAL "ON")
    message(FATAL_ERROR "${_msg}")
  else()
    message(STATUS "${_msg}")
  endif()
endmacro()

macro(_dtrain_find_mpi)
  if(NOT MPI_CXX_COMPILER)
    # Name MPICH explicitly so a second MPI installed alongside cannot take over the generic names.
    find_program(DTRAIN_MPICH_CXX mpicxx.mpich)
    find_program(DTRAIN_MPICH_CC mpicc.mpich)
    if(DTRAIN_MPICH_CXX)
      set(MPI_CXX_COMPILER "${DTRAIN_MPICH_CXX}" CACHE FILEPATH "MPI C++ wrapper")
    endif()
    if(DTRAIN_MPICH_CC)
      set(MPI_C_COMPILER "${DTRAIN_MPICH_CC}" CACHE FILEPATH "MPI C wrapper")
    endif()
  endif()
  if(NOT MPIEXEC_EXECUTABLE)
    find_program(DTRAIN_MPICH_EXEC mpiexec.mpich)
    if(DTRAIN_MPICH_EXEC)
      set(MPIEXEC_EXECUTABLE "${DTRAIN_MPICH_EXEC}" CACHE FILEPATH "MPI launcher")
    endif()
  endif()
  if(CMAKE_C_COMPILER_LOADED)
    find_package(MPI QUIET COMPONENTS C CXX)
  else()
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
endmacro()

function(dtrain_define_components)
  cmake_parse_arguments(A "" "MODE" "INCLUDE_DIRS;REQUIRED" ${ARGN})
  if(TARGET dtrain::core)
    return()
  endif()
  foreach(comp MPI HDF5 IBVERBS BLAS CUDA HIP CONFIG)
    if(A_MODE STREQUAL "build")
      set(_mode_${comp} "${DTRAIN_ENABLE_${comp}}")
    else()
      list(FIND A_REQUIRED ${comp} _idx)
      if(_idx GREATER -1)
        set(_mode_${comp} ON)
      else()
        set(_mode_${comp} AUTO)
      endif()
    endif()
    set(DTRAIN_HAVE_${comp} OFF)
  endforeach()

  find_package(Threads REQUIRED)
  add_library(dtrain::core INTERFACE IMPORTED GLOBAL)
  set_target_properties(dtrain::core PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${A_INCLUDE_DIRS}"
    INTERFACE_COMPILE_FEATURES cxx_std_17
    INTERFACE_LINK_LIBRARIES Threads::Threads)
  # zlib reads gzip-compressed IDX files (data/idx.hpp); every Debian system has it.
  find_package(ZLIB QUIET)
  if(ZLIB_FOUND)
    set_property(TARGET dtrain::core APPEND PROPERTY INTERFACE_LINK_LIBRARIES ZLIB::ZLIB)
    set_property(TARGET dtrain::core APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS DTRAIN_HAVE_ZLIB=1)
    set(DTRAIN_HAVE_ZLIB ON)
  else()
    set(DTRAIN_HAVE_ZLIB OFF)
    message(STATUS "dtrain: zlib not found: <dtrain/data/idx.hpp> will not build (Debian: apt-get install zlib1g-dev)")
  endif()
  add_library(dtrain::loopback INTERFACE IMPORTED GLOBAL)
  set_target_properties(dtrain::loopback PROPERTIES INTERFACE_LINK_LIBRARIES dtrain::core)
  set(_all dtrain::core dtrain::loopback)

  # MPI (MPICH).
  if(NOT _mode_MPI STREQUAL "OFF")
    _dtrain_find_mpi()
    if(MPI_CXX_FOUND)
      add_library(dtrain::mpi INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtrain::mpi PROPERTIES
        INTERFACE_LINK_LIBRARIES "dtrain::core;MPI::MPI_CXX"
        INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_MPI=1")
      set(DTRAIN_HAVE_MPI ON)
      list(APPEND _all dtrain::mpi)
    else()
      _dtrain_component_missing(MPI ${_mode_MPI} "no MPI C++ compiler wrapper found")
    endif()
  endif()

  # Parallel HDF5 (MPICH flavour); needs MPI.
  if(NOT _mode_HDF5 STREQUAL "OFF")
    if(DTRAIN_HAVE_MPI)
      set(HDF5_PREFER_PARALLEL TRUE)
      if(NOT HDF5_C_COMPILER_EXECUTABLE)
        find_program(DTRAIN_H5PCC_MPICH h5pcc.mpich)
        if(DTRAIN_H5PCC_MPICH)
          set(HDF5_C_COMPILER_EXECUTABLE "${DTRAIN_H5PCC_MPICH}" CACHE FILEPATH "HDF5 wrapper")
        endif()
      endif()
      find_package(HDF5 QUIET COMPONENTS C)
      if(HDF5_FOUND AND HDF5_IS_PARALLEL)
        add_library(dtrain::hdf5 INTERFACE IMPORTED GLOBAL)
        set(_h5_libs dtrain::mpi)
        if(TARGET HDF5::HDF5)
          list(APPEND _h5_libs HDF5::HDF5)
        else()
          list(APPEND _h5_libs ${HDF5_C_LIBRARIES})
          set_property(TARGET dtrain::hdf5 PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${HDF5_C_INCLUDE_DIRS}")
        endif()
        set_target_properties(dtrain::hdf5 PROPERTIES
          INTERFACE_LINK_LIBRARIES "${_h5_libs}"
          INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_HDF5=1")
        set(DTRAIN_HAVE_HDF5 ON)
        list(APPEND _all dtrain::hdf5)
      elseif(HDF5_FOUND)
        _dtrain_component_missing(HDF5 ${_mode_HDF5} "HDF5 found but it is the serial build")
      else()
        _dtrain_component_missing(HDF5 ${_mode_HDF5} "parallel HDF5 not found")
      endif()
    else()
      _dtrain_component_missing(HDF5 ${_mode_HDF5} "parallel HDF5 needs the mpi component")
    endif()
  endif()

  # rdma-core libibverbs.
  if(NOT _mode_IBVERBS STREQUAL "OFF")
    find_package(ibverbs QUIET)
    if(ibverbs_FOUND)
      add_library(dtrain::ibverbs INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtrain::ibverbs PROPERTIES
        INTERFACE_LINK_LIBRARIES "dtrain::core;ibverbs::ibverbs"
        INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_IBVERBS=1")
      set(DTRAIN_HAVE_IBVERBS ON)
      list(APPEND _all dtrain::ibverbs)
    else()
      _dtrain_component_missing(IBVERBS ${_mode_IBVERBS} "libibverbs not found")
    endif()
  endif()

  # CBLAS (OpenBLAS preferred).
  if(NOT _mode_BLAS STREQUAL "OFF")
    find_path(DTRAIN_CBLAS_INCLUDE_DIR cblas.h
      PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread)
    find_library(DTRAIN_CBLAS_LIBRARY NAMES openblas cblas blas)
    mark_as_advanced(DTRAIN_CBLAS_INCLUDE_DIR DTRAIN_CBLAS_LIBRARY)
    if(DTRAIN_CBLAS_INCLUDE_DIR AND DTRAIN_CBLAS_LIBRARY)
      add_library(dtrain::blas INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtrain::blas PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_CBLAS_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "dtrain::core;${DTRAIN_CBLAS_LIBRARY}"
        INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_CBLAS=1")
      set(DTRAIN_HAVE_BLAS ON)
      list(APPEND _all dtrain::blas)
    else()
      _dtrain_component_missing(BLAS ${_mode_BLAS} "cblas.h or an OpenBLAS/CBLAS library not found")
    endif()
  endif()

  # CUDA runtime (for host code that calls CUDA; device code is compiled by nvcc).
  if(NOT _mode_CUDA STREQUAL "OFF")
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      add_library(dtrain::cuda INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtrain::cuda PROPERTIES
        INTERFACE_LINK_LIBRARIES "dtrain::core;CUDA::cudart"
        INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_CUDA=1")
      set(DTRAIN_HAVE_CUDA ON)
      list(APPEND _all dtrain::cuda)
    else()
      _dtrain_component_missing(CUDA ${_mode_CUDA} "CUDA toolkit not found")
    endif()
  endif()

  # HIP runtime. A full ROCm install has hip-config.cmake; Debian's packaging does not expose it to
  # CMake 3.25, so fall back to the header, hipcc and libamdhip64 directly.
  if(NOT _mode_HIP STREQUAL "OFF")
    find_package(hip CONFIG QUIET)
    if(TARGET hip::host)
      add_library(dtrain::hip INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtrain::hip PROPERTIES
        INTERFACE_LINK_LIBRARIES "dtrain::core;hip::host"
        INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_HIP=1")
      set(DTRAIN_HAVE_HIP ON)
    else()
      find_program(DTRAIN_HIPCC hipcc)
      find_path(DTRAIN_HIP_INCLUDE_DIR hip/hip_runtime.h PATHS /opt/rocm/include)
      find_library(DTRAIN_AMDHIP64 amdhip64 PATHS /opt/rocm/lib)
      mark_as_advanced(DTRAIN_HIPCC DTRAIN_HIP_INCLUDE_DIR DTRAIN_AMDHIP64)
      if(DTRAIN_HIPCC AND DTRAIN_HIP_INCLUDE_DIR AND DTRAIN_AMDHIP64)
        add_library(dtrain::hip INTERFACE IMPORTED GLOBAL)
        set_target_properties(dtrain::hip PROPERTIES
          INTERFACE_INCLUDE_DIRECTORIES "${DTRAIN_HIP_INCLUDE_DIR}"
          INTERFACE_LINK_LIBRARIES "dtrain::core;${DTRAIN_AMDHIP64}"
          INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_HIP=1;__HIP_PLATFORM_AMD__=1")
        set(DTRAIN_HAVE_HIP ON)
      else()
        _dtrain_component_missing(HIP ${_mode_HIP} "hipcc, hip/hip_runtime.h or libamdhip64 not found")
      endif()
    endif()
    if(DTRAIN_HAVE_HIP)
      list(APPEND _all dtrain::hip)
    endif()
  endif()

  # yaml-cpp reads run descriptions (<dtrain/config/run_config.hpp>): its CMake package (the
  # target is yaml-cpp::yaml-cpp from 0.8, yaml-cpp before), else pkg-config.
  if(NOT _mode_CONFIG STREQUAL "OFF")
    find_package(yaml-cpp CONFIG QUIET)
    set(_dtrain_yaml "")
    if(TARGET yaml-cpp::yaml-cpp)
      set(_dtrain_yaml yaml-cpp::yaml-cpp)
    elseif(TARGET yaml-cpp)
      set(_dtrain_yaml yaml-cpp)
    else()
      find_package(PkgConfig QUIET)
      if(PKG_CONFIG_FOUND)
        pkg_check_modules(DTRAIN_YAML_CPP QUIET IMPORTED_TARGET GLOBAL yaml-cpp)
        if(TARGET PkgConfig::DTRAIN_YAML_CPP)
          set(_dtrain_yaml PkgConfig::DTRAIN_YAML_CPP)
        endif()
      endif()
    endif()
    if(_dtrain_yaml)
      add_library(dtrain::config INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtrain::config PROPERTIES
        INTERFACE_LINK_LIBRARIES "dtrain::core;${_dtrain_yaml}"
        INTERFACE_COMPILE_DEFINITIONS "DTRAIN_HAVE_CONFIG=1")
      set(DTRAIN_HAVE_CONFIG ON)
      list(APPEND _all dtrain::config)
    else()
      _dtrain_component_missing(CONFIG ${_mode_CONFIG} "yaml-cpp (CMake package or pkg-config) not found")
    endif()
  endif()

  add_library(dtrain::dtrain INTERFACE IMPORTED GLOBAL)
  set_target_properties(dtrain::dtrain PROPERTIES INTERFACE_LINK_LIBRARIES "${_all}")

  foreach(comp MPI HDF5 IBVERBS BLAS CUDA HIP CONFIG ZLIB)
    set(DTRAIN_HAVE_${comp} ${DTRAIN_HAVE_${comp}} PARENT_SCOPE)
  endforeach()
endfunction()
