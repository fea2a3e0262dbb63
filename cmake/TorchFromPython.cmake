# Torch's headers and CPU libraries, taken from the torch of Python3_EXECUTABLE the way
# torch.utils.cpp_extension takes them (cmake/torch_build_settings.py), for PyPI's wheels (CPU
# and CUDA) and Debian's torch alike. Not find_package(Torch): for a CUDA build of torch that
# loads torch's CUDA setup, which fails without a CUDA toolkit and links libtorch_cuda,
# although torch_spmd runs no CUDA code.
#
# Defines the imported targets spmd::torch (c10, torch, torch_cpu) and spmd::torch_python,
# their include directories as SPMD_TORCH_INCLUDE_DIRS and the libstdc++ ABI torch was built
# with as SPMD_TORCH_CXX11_ABI. Nothing is cached: every configure reads the current torch.

execute_process(
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/torch_build_settings.py
  OUTPUT_VARIABLE _spmd_torch_settings
  ERROR_VARIABLE _spmd_torch_errors
  RESULT_VARIABLE _spmd_torch_result)
if(NOT _spmd_torch_result EQUAL 0)
  message(FATAL_ERROR "Could not read the build settings of the torch of ${Python3_EXECUTABLE}:\n"
                      "${_spmd_torch_errors}")
endif()
cmake_language(EVAL CODE "${_spmd_torch_settings}")
message(STATUS "torch headers: ${SPMD_TORCH_INCLUDE_DIRS}")
message(STATUS "torch libraries: ${SPMD_TORCH_LIBRARIES};${SPMD_TORCH_PYTHON_LIBRARY}")

# Imported, so that torch's headers are system headers (no -Wall warnings from them), as they
# are with torch's own CMake targets.
add_library(spmd::torch INTERFACE IMPORTED)
set_target_properties(spmd::torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${SPMD_TORCH_INCLUDE_DIRS}"
  INTERFACE_LINK_LIBRARIES "${SPMD_TORCH_LIBRARIES}")
add_library(spmd::torch_python INTERFACE IMPORTED)
set_target_properties(spmd::torch_python PROPERTIES
  INTERFACE_LINK_LIBRARIES "spmd::torch;${SPMD_TORCH_PYTHON_LIBRARY}")
