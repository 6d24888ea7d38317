# dtrain GPU helper (installed with the package): compiles single-source CUDA / HIP translation
# units that include dtrain's device headers. dtrain's own tests and benchmarks use it through
# cmake/dtrain_gpu.cmake; a consumer project gets it from
#   find_package(dtrain CONFIG REQUIRED COMPONENTS cuda)   # or hip
#   dtrain_add_gpu_executable(NAME my_app SOURCE my_app.cu DIALECT cuda)
# The library stays header-only; this compiles the kernels for the targets configured below:
#   CUDA: nvcc, DTRAIN_CUDA_ARCHS (default 80;90 = sm_80, sm_90), cuBLAS when found.
#   HIP:  hipcc called directly, DTRAIN_HIP_ARCHS (default gfx90a;gfx942), hipBLAS when found.
# CMake 3.25's HIP language does not work with Debian's ROCm packaging, so HIP units go through
# add_custom_command by default; -DDTRAIN_HIP_LANGUAGE=ON selects enable_language(HIP) for full
# ROCm installs instead. CUDA units also use nvcc directly, which keeps the two paths symmetric
# and avoids CMake's CUDA language needing a newer CMake for newer toolkits.
#
# dtrain_add_gpu_executable(NAME n SOURCE file DIALECT cuda|hip [DEFINES d...] [INCLUDES dir...]
#                           [FLAGS flag...] [LIBS lib...] [HOST_LIBS lib...] [OUT var]
#                           [COMPILE_CHECK | UNOPTIMISED])
#   builds ${CMAKE_CURRENT_BINARY_DIR}/gpu/<n> and a target <n> (part of ALL). COMPILE_CHECK
#   compiles for the first target of the dialect only, without optimisation (host and device):
#   for a build that checks that a program compiles and never runs it (the binary does not load
#   on the other targets). UNOPTIMISED compiles for every target without optimisation: the same
#   check for each target. DTRAIN_GPU_DIALECTS lists
#   the dialects whose compiler was found (cuda, hip); DTRAIN_GPU_INCLUDE_DIRS the include roots
#   every unit gets (set by the includer: the installed include dir, or the source tree's roots).
#   With cuBLAS / hipBLAS found, units get DTRAIN_HAVE_CUBLAS / DTRAIN_HAVE_HIPBLAS and the library.
#   FLAGS go to the compiler as they are (e.g. -Xcompiler=-march=native for nvcc's host compiler).
#   LIBS go to the compiler driver as they are. HOST_LIBS (-L/-l flags of libraries without device
#   code: MPI, HDF5, BLAS) reach only the host linker under nvcc (-Xlinker), so its device link
#   step does not search them; nvlink otherwise warns about every static archive it finds there
#   (e.g. glibc's empty libdl.a). Under hipcc they are passed like LIBS.

# Directory-scoped: the settings are variables, and each directory that compiles units needs them.
include_guard(DIRECTORY)
if(NOT DEFINED DTRAIN_GPU_INCLUDE_DIRS)
  message(FATAL_ERROR "dtrainGpu.cmake: set DTRAIN_GPU_INCLUDE_DIRS (dtrain's include roots) first")
endif()
get_property(_dtrain_gpu_quiet GLOBAL PROPERTY DTRAIN_GPU_REPORTED)
set_property(GLOBAL PROPERTY DTRAIN_GPU_REPORTED ON)
macro(_dtrain_gpu_status)
  if(NOT _dtrain_gpu_quiet)
    message(STATUS "${ARGV0}")
  endif()
endmacro()

set(DTRAIN_CUDA_ARCHS "80;90" CACHE STRING "CUDA SM architectures of dtrain GPU units")
set(DTRAIN_HIP_ARCHS "gfx90a;gfx942" CACHE STRING "AMD GPU targets of dtrain GPU units")
option(DTRAIN_HIP_LANGUAGE "Compile HIP units with CMake's HIP language (full ROCm installs only)" OFF)

set(DTRAIN_GPU_DIALECTS "")

# ---- CUDA ----
if(DTRAIN_HAVE_CUDA)
  find_program(DTRAIN_NVCC nvcc HINTS "${CUDAToolkit_BIN_DIR}" /usr/local/cuda/bin)
  mark_as_advanced(DTRAIN_NVCC)
  if(DTRAIN_NVCC)
    list(APPEND DTRAIN_GPU_DIALECTS cuda)
    set(_dtrain_cuda_flags -std=c++17 -x cu -ccbin "${CMAKE_CXX_COMPILER}")
    set(_dtrain_cuda_targets "")
    foreach(_a IN LISTS DTRAIN_CUDA_ARCHS)
      list(APPEND _dtrain_cuda_targets --generate-code "arch=compute_${_a},code=sm_${_a}")
    endforeach()
    set(_dtrain_cuda_full -O2 ${_dtrain_cuda_targets})
    list(SUBLIST _dtrain_cuda_targets 0 2 _first)  # the first target's --generate-code pair
    set(_dtrain_cuda_check -O0 -Xptxas -O0 ${_first})
    set(_dtrain_cuda_unoptimised -O0 -Xptxas -O0 ${_dtrain_cuda_targets})
    set(_dtrain_cuda_libs -Xcompiler=-pthread)
    if(TARGET CUDA::cublas)
      list(APPEND _dtrain_cuda_flags -DDTRAIN_HAVE_CUBLAS=1)
      list(APPEND _dtrain_cuda_libs -lcublas)
      set(DTRAIN_GPU_CUBLAS ON)
    else()
      set(DTRAIN_GPU_CUBLAS OFF)
    endif()
    _dtrain_gpu_status("dtrain: GPU units compile with nvcc for sm ${DTRAIN_CUDA_ARCHS} (cuBLAS ${DTRAIN_GPU_CUBLAS})")
  else()
    _dtrain_gpu_status("dtrain: CUDA toolkit found but no nvcc; CUDA units are not built")
  endif()
endif()

# ---- HIP ----
if(DTRAIN_HAVE_HIP)
  if(NOT DTRAIN_HIPCC)
    find_program(DTRAIN_HIPCC hipcc PATHS /opt/rocm/bin)
  endif()
  if(DTRAIN_HIPCC)
    list(APPEND DTRAIN_GPU_DIALECTS hip)
    # Keep only the targets this hipcc knows. Debian's ROCm 5.2 clang predates gfx942 (MI300);
    # its nearest relative gfx940 (same wave64 CDNA3 ISA family) is compiled in its place so the
    # MI300 path is still compile-checked, and the substitution is reported.
    # hipcc (ROCm 5.2's clang driver) leaves two empty directories in TMPDIR per compilation;
    # every hipcc call here gets a TMPDIR inside the build tree, so /tmp is not littered.
    set(DTRAIN_HIPCC_TMPDIR "${CMAKE_BINARY_DIR}/hipcc-tmp")
    file(MAKE_DIRECTORY "${DTRAIN_HIPCC_TMPDIR}")
    set(_dtrain_hipcc "${CMAKE_COMMAND}" -E env "TMPDIR=${DTRAIN_HIPCC_TMPDIR}" "${DTRAIN_HIPCC}")
    set(_probe "${CMAKE_CURRENT_BINARY_DIR}/dtrain_hip_probe.cpp")
    file(WRITE "${_probe}" "#include <hip/hip_runtime.h>\n__global__ void k(float* x) { x[threadIdx.x] = warpSize; }\n")
    set(_dtrain_hip_archs "")
    foreach(_a IN LISTS DTRAIN_HIP_ARCHS)
      if(NOT DEFINED DTRAIN_HIP_ARCH_OK_${_a})
        execute_process(COMMAND ${_dtrain_hipcc} --offload-arch=${_a} -c "${_probe}" -o "${_probe}.o"
                        RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
        if(_rc EQUAL 0)
          set(DTRAIN_HIP_ARCH_OK_${_a} ON CACHE INTERNAL "")
        else()
          set(DTRAIN_HIP_ARCH_OK_${_a} OFF CACHE INTERNAL "")
        endif()
      endif()
      if(DTRAIN_HIP_ARCH_OK_${_a})
        list(APPEND _dtrain_hip_archs ${_a})
      elseif(_a STREQUAL "gfx942")
        if(NOT DEFINED DTRAIN_HIP_ARCH_OK_gfx940)
          execute_process(COMMAND ${_dtrain_hipcc} --offload-arch=gfx940 -c "${_probe}" -o "${_probe}.o"
                          RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
          if(_rc EQUAL 0)
            set(DTRAIN_HIP_ARCH_OK_gfx940 ON CACHE INTERNAL "")
          else()
            set(DTRAIN_HIP_ARCH_OK_gfx940 OFF CACHE INTERNAL "")
          endif()
        endif()
        if(DTRAIN_HIP_ARCH_OK_gfx940)
          list(APPEND _dtrain_hip_archs gfx940)
          _dtrain_gpu_status("dtrain: this hipcc does not know gfx942; compiling gfx940 in its place (compile check only: those binaries do not load on gfx942 hardware, use ROCm >= 5.7 there)")
        else()
          _dtrain_gpu_status("dtrain: this hipcc knows neither gfx942 nor gfx940; skipping that target")
        endif()
      else()
        _dtrain_gpu_status("dtrain: this hipcc does not know ${_a}; skipping that target")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES _dtrain_hip_archs)
    set(DTRAIN_HIP_ARCHS_EFFECTIVE "${_dtrain_hip_archs}")
    set(_dtrain_hip_flags -std=c++17)
    set(_dtrain_hip_full -O2)
    foreach(_a IN LISTS _dtrain_hip_archs)
      list(APPEND _dtrain_hip_full --offload-arch=${_a})
    endforeach()
    list(SUBLIST _dtrain_hip_full 1 1 _first)  # the first target's --offload-arch
    set(_dtrain_hip_check -O0 ${_first})
    set(_dtrain_hip_unoptimised ${_dtrain_hip_full})
    list(TRANSFORM _dtrain_hip_unoptimised REPLACE "^-O2$" "-O0")
    set(_dtrain_hip_libs -lpthread)
    find_path(DTRAIN_HIPBLAS_INCLUDE_DIR NAMES hipblas/hipblas.h hipblas.h PATHS /opt/rocm/include)
    find_library(DTRAIN_HIPBLAS_LIBRARY hipblas PATHS /opt/rocm/lib)
    mark_as_advanced(DTRAIN_HIPBLAS_INCLUDE_DIR DTRAIN_HIPBLAS_LIBRARY)
    if(DTRAIN_HIPBLAS_INCLUDE_DIR AND DTRAIN_HIPBLAS_LIBRARY)
      list(APPEND _dtrain_hip_flags -DDTRAIN_HAVE_HIPBLAS=1 "-I${DTRAIN_HIPBLAS_INCLUDE_DIR}")
      get_filename_component(_hb_dir "${DTRAIN_HIPBLAS_LIBRARY}" DIRECTORY)
      list(APPEND _dtrain_hip_libs "-L${_hb_dir}" -lhipblas)
      set(DTRAIN_GPU_HIPBLAS ON)
    else()
      set(DTRAIN_GPU_HIPBLAS OFF)
    endif()
    if(DTRAIN_HIP_LANGUAGE)
      # Where CMake's HIP language looks (<ROCm root>/lib/cmake/hip-lang); Debian installs it under
      # the multiarch directory instead, which CMake 3.25 does not search.
      find_file(DTRAIN_HIP_LANG_CONFIG hip-lang-config.cmake
        PATHS /opt/rocm/lib/cmake/hip-lang /usr/lib/cmake/hip-lang NO_DEFAULT_PATH)
      mark_as_advanced(DTRAIN_HIP_LANG_CONFIG)
      if(NOT DTRAIN_HIP_LANG_CONFIG)
        message(FATAL_ERROR "dtrain: DTRAIN_HIP_LANGUAGE=ON needs a full ROCm install (no "
                            "lib/cmake/hip-lang/hip-lang-config.cmake under /opt/rocm or /usr, as with "
                            "Debian's packaging); leave it OFF to compile HIP with hipcc directly")
      endif()
      enable_language(HIP)
      set(CMAKE_HIP_ARCHITECTURES "${_dtrain_hip_archs}")
    endif()
    _dtrain_gpu_status("dtrain: GPU units compile with hipcc for ${_dtrain_hip_archs} (hipBLAS ${DTRAIN_GPU_HIPBLAS})")
  endif()
endif()

if(NOT DTRAIN_GPU_DIALECTS)
  _dtrain_gpu_status("dtrain: neither nvcc nor hipcc found; no GPU units are built")
endif()
set(_dtrain_gpu_includes "")
foreach(_d IN LISTS DTRAIN_GPU_INCLUDE_DIRS)
  list(APPEND _dtrain_gpu_includes "-I${_d}")
endforeach()
if(NOT DEFINED DTRAIN_GPU_DEPENDS)
  set(DTRAIN_GPU_DEPENDS "")
endif()

function(dtrain_add_gpu_executable)
  cmake_parse_arguments(A "COMPILE_CHECK;UNOPTIMISED" "NAME;SOURCE;DIALECT;OUT" "DEFINES;INCLUDES;FLAGS;LIBS;HOST_LIBS" ${ARGN})
  # The nvcc/hipcc programs go to a gpu/ folder: a file beside the custom target of the same name
  # would be two rules for one path to Ninja.
  set(_exe "${CMAKE_CURRENT_BINARY_DIR}/gpu/${A_NAME}")
  set(_mode full)
  if(A_COMPILE_CHECK)
    set(_mode check)
  elseif(A_UNOPTIMISED)
    set(_mode unoptimised)
  endif()
  file(MAKE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/gpu")
  set(_defs "")
  foreach(_d IN LISTS A_DEFINES)
    list(APPEND _defs "-D${_d}")
  endforeach()
  foreach(_d IN LISTS A_INCLUDES)
    list(APPEND _defs "-I${_d}")
  endforeach()
  if(A_DIALECT STREQUAL "cuda")
    set(_host_libs "")
    foreach(_l IN LISTS A_HOST_LIBS)
      list(APPEND _host_libs -Xlinker "${_l}")
    endforeach()
    add_custom_command(OUTPUT "${_exe}"
      COMMAND "${DTRAIN_NVCC}" ${_dtrain_cuda_flags} ${_dtrain_cuda_${_mode}} -DDTRAIN_HAVE_CUDA=1 ${_defs} ${A_FLAGS}
              ${_dtrain_gpu_includes} "${A_SOURCE}" -o "${_exe}" ${A_LIBS} ${_host_libs}
              ${_dtrain_cuda_libs}
      DEPENDS "${A_SOURCE}" ${DTRAIN_GPU_DEPENDS}
      COMMENT "nvcc (${_dtrain_cuda_${_mode}}) ${A_NAME}" VERBATIM)
    add_custom_target(${A_NAME} ALL DEPENDS "${_exe}")
  elseif(A_DIALECT STREQUAL "hip" AND DTRAIN_HIP_LANGUAGE)
    set(_copy "${CMAKE_CURRENT_BINARY_DIR}/${A_NAME}.hip")
    configure_file("${A_SOURCE}" "${_copy}" COPYONLY)
    add_executable(${A_NAME} "${_copy}")
    set_source_files_properties("${_copy}" PROPERTIES LANGUAGE HIP)
    target_compile_definitions(${A_NAME} PRIVATE DTRAIN_HAVE_HIP=1 ${A_DEFINES})
    target_compile_options(${A_NAME} PRIVATE ${A_FLAGS})
    target_include_directories(${A_NAME} PRIVATE ${A_INCLUDES})
    target_link_libraries(${A_NAME} PRIVATE ${A_LIBS} ${A_HOST_LIBS})
    target_include_directories(${A_NAME} PRIVATE ${DTRAIN_GPU_INCLUDE_DIRS})
    target_link_libraries(${A_NAME} PRIVATE hip::host Threads::Threads)
    if(DTRAIN_GPU_HIPBLAS)
      target_compile_definitions(${A_NAME} PRIVATE DTRAIN_HAVE_HIPBLAS=1)
      target_link_libraries(${A_NAME} PRIVATE "${DTRAIN_HIPBLAS_LIBRARY}")
    endif()
    set(_archs "${DTRAIN_HIP_ARCHS_EFFECTIVE}")
    if(A_COMPILE_CHECK)
      list(SUBLIST _archs 0 1 _archs)
    endif()
    if(A_COMPILE_CHECK OR A_UNOPTIMISED)
      target_compile_options(${A_NAME} PRIVATE -O0)
    endif()
    set_target_properties(${A_NAME} PROPERTIES HIP_STANDARD 17 HIP_ARCHITECTURES "${_archs}"
      RUNTIME_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/gpu")
  elseif(A_DIALECT STREQUAL "hip")
    if(NOT DTRAIN_HIPCC_TMPDIR)
      set(DTRAIN_HIPCC_TMPDIR "${CMAKE_BINARY_DIR}/hipcc-tmp")
      file(MAKE_DIRECTORY "${DTRAIN_HIPCC_TMPDIR}")
    endif()
    add_custom_command(OUTPUT "${_exe}"
      COMMAND "${CMAKE_COMMAND}" -E env "TMPDIR=${DTRAIN_HIPCC_TMPDIR}" "${DTRAIN_HIPCC}" ${_dtrain_hip_flags} ${_dtrain_hip_${_mode}} -DDTRAIN_HAVE_HIP=1 ${_defs} ${A_FLAGS}
              ${_dtrain_gpu_includes} "${A_SOURCE}" -o "${_exe}" ${A_LIBS} ${A_HOST_LIBS} ${_dtrain_hip_libs}
      DEPENDS "${A_SOURCE}" ${DTRAIN_GPU_DEPENDS}
      COMMENT "hipcc (${_dtrain_hip_${_mode}}) ${A_NAME}" VERBATIM)
    add_custom_target(${A_NAME} ALL DEPENDS "${_exe}")
  else()
    message(FATAL_ERROR "dtrain_add_gpu_executable: DIALECT must be cuda or hip, got '${A_DIALECT}'")
  endif()
  if(A_OUT)
    set(${A_OUT} "${_exe}" PARENT_SCOPE)
  endif()
endfunction()

