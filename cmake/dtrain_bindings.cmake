# dtrain's C and Fortran bindings as source components, shared by the source tree and the installed
# package config. dtrain::c adds bindings/c/dtrain_c.cpp (the C API over dtrain::ConfiguredRun) to
# the consumer's target and puts dtrain.h on its include path; dtrain::fortran adds
# bindings/fortran/dtrain.f90 (`use dtrain`) on top of dtrain::c. Both are compiled by the
# consumer's own compilers and MPI: link them into ONE target of a program (its executable), the
# one that calls them. Needs dtrain::config, dtrain::mpi and dtrain::hdf5 (and uses dtrain::blas
# when found); the fortran component needs enable_language(Fortran) before find_package(dtrain)
# and MPI's mpi_f08 module. Sets DTRAIN_HAVE_C and DTRAIN_HAVE_FORTRAN in the caller's scope.

include_guard(GLOBAL)

# dtrain_define_bindings(DIR <folder holding c/ and fortran/> [REQUIRED c fortran])
function(dtrain_define_bindings)
  cmake_parse_arguments(A "" "DIR" "REQUIRED" ${ARGN})
  set(DTRAIN_HAVE_C OFF)
  set(DTRAIN_HAVE_FORTRAN OFF)
  set(_why_c "")
  if(NOT TARGET dtrain::config OR NOT TARGET dtrain::mpi OR NOT TARGET dtrain::hdf5)
    set(_why_c "the c component needs the config, mpi and hdf5 components (Debian: libyaml-cpp-dev libmpich-dev libhdf5-mpich-dev)")
  elseif(NOT CMAKE_CXX_COMPILER_LOADED)
    set(_why_c "the c component compiles C++: enable_language(CXX) (or project(... LANGUAGES C CXX)) first")
  endif()
  if(_why_c STREQUAL "")
    add_library(dtrain::c INTERFACE IMPORTED GLOBAL)
    set(_libs dtrain::config dtrain::hdf5 dtrain::mpi)
    if(TARGET MPI::MPI_C)
      list(APPEND _libs MPI::MPI_C)
    endif()
    # The layers' GEMM through CBLAS where the package found it, as a C++ program linking it gets.
    if(TARGET dtrain::blas)
      list(APPEND _libs dtrain::blas)
    endif()
    set_target_properties(dtrain::c PROPERTIES
      INTERFACE_SOURCES "${A_DIR}/c/dtrain_c.cpp"
      INTERFACE_INCLUDE_DIRECTORIES "${A_DIR}/c"
      INTERFACE_LINK_LIBRARIES "${_libs}")
    set(DTRAIN_HAVE_C ON)
  else()
    list(FIND A_REQUIRED c _req)
    if(_req GREATER -1)
      message(FATAL_ERROR "dtrain: component c is off: ${_why_c}")
    endif()
    message(STATUS "dtrain: component c is off: ${_why_c}")
  endif()

  set(_why_f "")
  if(NOT DTRAIN_HAVE_C)
    set(_why_f "the fortran component needs the c component")
  elseif(NOT CMAKE_Fortran_COMPILER_LOADED)
    set(_why_f "call enable_language(Fortran) before find_package(dtrain)")
  else()
    if(NOT MPI_Fortran_COMPILER)
      find_program(DTRAIN_MPICH_FORT mpifort.mpich)
      mark_as_advanced(DTRAIN_MPICH_FORT)
      if(DTRAIN_MPICH_FORT)
        set(MPI_Fortran_COMPILER "${DTRAIN_MPICH_FORT}" CACHE FILEPATH "MPI Fortran wrapper")
      endif()
    endif()
    find_package(MPI QUIET COMPONENTS Fortran)
    if(NOT MPI_Fortran_FOUND)
      set(_why_f "no MPI Fortran wrapper found (Debian: libmpich-dev gfortran)")
    elseif(NOT MPI_Fortran_HAVE_F08_MODULE)
      set(_why_f "MPI has no mpi_f08 module for this Fortran compiler")
    endif()
  endif()
  if(_why_f STREQUAL "")
    add_library(dtrain::fortran INTERFACE IMPORTED GLOBAL)
    # MPI's Fortran flags (MPICH's -fallow-argument-mismatch ...) for Fortran sources only: the
    # target also compiles the C API's C++ source.
    set_target_properties(dtrain::fortran PROPERTIES
      INTERFACE_SOURCES "${A_DIR}/fortran/dtrain.f90"
      INTERFACE_INCLUDE_DIRECTORIES "$<TARGET_PROPERTY:MPI::MPI_Fortran,INTERFACE_INCLUDE_DIRECTORIES>"
      INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:Fortran>:$<TARGET_PROPERTY:MPI::MPI_Fortran,INTERFACE_COMPILE_OPTIONS>>"
      INTERFACE_LINK_LIBRARIES "dtrain::c;$<LINK_ONLY:MPI::MPI_Fortran>")
    set(DTRAIN_HAVE_FORTRAN ON)
  else()
    list(FIND A_REQUIRED fortran _req)
    if(_req GREATER -1)
      message(FATAL_ERROR "dtrain: component fortran is off: ${_why_f}")
    endif()
    message(STATUS "dtrain: component fortran is off: ${_why_f}")
  endif()
  set(DTRAIN_HAVE_C ${DTRAIN_HAVE_C} PARENT_SCOPE)
  set(DTRAIN_HAVE_FORTRAN ${DTRAIN_HAVE_FORTRAN} PARENT_SCOPE)
endfunction()

# dtrain_add_c_intree(NAME [extra sources...]): a static library of the C API's source (and the
# extra sources) with dtrain::c's usage requirements, built only where a target links it.
# dtrain_add_fortran_intree(NAME C_LIBRARY): dtrain::fortran's module source over that library.
# For the source tree's own programs, which then compile the C API once, not once each.
function(dtrain_add_c_intree name)
  get_target_property(_src dtrain::c INTERFACE_SOURCES)
  get_target_property(_inc dtrain::c INTERFACE_INCLUDE_DIRECTORIES)
  get_target_property(_libs dtrain::c INTERFACE_LINK_LIBRARIES)
  add_library(${name} STATIC EXCLUDE_FROM_ALL "${_src}" ${ARGN})
  target_include_directories(${name} SYSTEM PUBLIC "${_inc}")
  target_link_libraries(${name} PUBLIC ${_libs})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Werror)
endfunction()
function(dtrain_add_fortran_intree name c_library)
  add_library(${name} INTERFACE)
  foreach(_p INTERFACE_SOURCES INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_OPTIONS)
    get_target_property(_v dtrain::fortran ${_p})
    set_property(TARGET ${name} PROPERTY ${_p} "${_v}")
  endforeach()
  target_link_libraries(${name} INTERFACE ${c_library} $<LINK_ONLY:MPI::MPI_Fortran>)
endfunction()
# dtrain_define_intree_bindings(): dtrain_c_intree and dtrain_fortran_intree, host builds.
function(dtrain_define_intree_bindings)
  if(TARGET dtrain::c)
    dtrain_add_c_intree(dtrain_c_intree)
  endif()
  if(TARGET dtrain::fortran)
    dtrain_add_fortran_intree(dtrain_fortran_intree dtrain_c_intree)
  endif()
endfunction()
