# Packaging: the Spack recipe (packaging/spack) against the CMake options it maps. Python
# standard library only; Spack itself is not needed.
find_package(Python3 3.9 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME packaging_spack_variants
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/packaging/check_spack_recipe.py
            --source-dir ${PROJECT_SOURCE_DIR} --self-test)
  set_tests_properties(packaging_spack_variants PROPERTIES TIMEOUT 60 LABELS "unit")
else()
  message(STATUS "dtrain: packaging_spack_variants off: no Python 3.9 or newer found (Debian: python3)")
endif()
# The license: LICENSE is BSD-3-Clause and every header starts with its SPDX line.
if(Python3_Interpreter_FOUND)
  add_test(NAME packaging_spdx
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/packaging/check_spdx.py
            ${PROJECT_SOURCE_DIR})
  set_tests_properties(packaging_spdx PROPERTIES TIMEOUT 60 LABELS "unit")
endif()
