# The CUDA toolkit and NCCL, for the NCCL communicator (libdistckpt_nccl).
#
# DISTCKPT_NCCL_COMMUNICATOR: AUTO (default) builds it wherever the toolkit and
# NCCL are found and says in one configure line why not where they are not;
# ON makes their absence an error; OFF skips it. The toolkit is found the way
# CMake's FindCUDAToolkit looks (nvcc on PATH, CUDAToolkit_ROOT, /usr/local/cuda);
# NCCL beside it (the CUDA 13 toolkit ships it), or under NCCL_ROOT (a pip
# install's nvidia/nccl folder holds only libnccl.so.2, also found).
#
# DISTCKPT_WITH_NCCL (c10d's ProcessGroupNCCL) needs nccl.h too, whatever
# this option says: c10d's header includes it. It must be the header of the
# NCCL that LibTorch loads, since c10d's Options embed ncclConfig_t.
set(DISTCKPT_NCCL_COMMUNICATOR AUTO CACHE STRING "Build the NCCL communicator: AUTO, ON or OFF")
set_property(CACHE DISTCKPT_NCCL_COMMUNICATOR PROPERTY STRINGS AUTO ON OFF)

set(DISTCKPT_HAS_NCCL_COMMUNICATOR OFF)
if(DISTCKPT_NCCL_COMMUNICATOR STREQUAL "OFF" AND NOT DISTCKPT_WITH_NCCL)
  message(STATUS "distckpt: NCCL communicator OFF (DISTCKPT_NCCL_COMMUNICATOR=OFF)")
  return()
endif()

set(_distckpt_cuda_missing "")
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  set(_distckpt_cuda_missing "no CUDA toolkit found (put nvcc on PATH or set CUDAToolkit_ROOT)")
endif()
find_path(DISTCKPT_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(DISTCKPT_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(DISTCKPT_WITH_NCCL AND NOT DISTCKPT_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "distckpt: DISTCKPT_WITH_NCCL=ON, but nccl.h (which c10d's ProcessGroupNCCL.hpp includes) "
    "was not found; set NCCL_ROOT to the NCCL LibTorch loads (for a pip install of PyTorch: "
    "site-packages/nvidia/nccl)")
endif()
if(NOT _distckpt_cuda_missing AND (NOT DISTCKPT_NCCL_INCLUDE_DIR OR NOT DISTCKPT_NCCL_LIBRARY))
  set(_distckpt_cuda_missing "CUDA ${CUDAToolkit_VERSION} found but not NCCL (nccl.h, libnccl; set NCCL_ROOT)")
endif()
if(DISTCKPT_NCCL_COMMUNICATOR STREQUAL "OFF")
  message(STATUS "distckpt: NCCL communicator OFF (DISTCKPT_NCCL_COMMUNICATOR=OFF)")
  return()
endif()

if(_distckpt_cuda_missing)
  if(DISTCKPT_NCCL_COMMUNICATOR STREQUAL "ON")
    message(FATAL_ERROR "distckpt: DISTCKPT_NCCL_COMMUNICATOR=ON but ${_distckpt_cuda_missing}")
  endif()
  message(STATUS "distckpt: NCCL communicator OFF: ${_distckpt_cuda_missing}")
  return()
endif()

# The version NCCL's header declares, for the configure line.
file(STRINGS ${DISTCKPT_NCCL_INCLUDE_DIR}/nccl.h _distckpt_nccl_version_lines
  REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
set(DISTCKPT_NCCL_VERSION "")
foreach(part MAJOR MINOR PATCH)
  string(REGEX MATCH "NCCL_${part}[ \t]+([0-9]+)" _ "${_distckpt_nccl_version_lines}")
  list(APPEND DISTCKPT_NCCL_VERSION ${CMAKE_MATCH_1})
endforeach()
list(JOIN DISTCKPT_NCCL_VERSION "." DISTCKPT_NCCL_VERSION)

if(NOT TARGET distckpt::nccl_library)
  add_library(distckpt::nccl_library UNKNOWN IMPORTED)
  set_target_properties(distckpt::nccl_library PROPERTIES
    IMPORTED_LOCATION ${DISTCKPT_NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${DISTCKPT_NCCL_INCLUDE_DIR})
endif()
set(DISTCKPT_HAS_NCCL_COMMUNICATOR ON)
message(STATUS "distckpt: NCCL communicator ON (CUDA ${CUDAToolkit_VERSION}, NCCL ${DISTCKPT_NCCL_VERSION}: ${DISTCKPT_NCCL_LIBRARY})")
