# The C++ runtime ahead of LibTorch on the link line, where LibTorch needs it.
#
# PyTorch's Linux wheels (2.5 on; seen with 2.11 + CUDA 13) export from
# libtorch.so parts of the libstdc++ they link statically: std::filesystem,
# std::chrono's time zones (pytorch/pytorch#133437). A program that links
# libtorch.so before the C++ runtime binds its own calls of those functions to
# libtorch.so's copies, whose calls into the rest of libstdc++ can resolve to
# nothing: std::filesystem::remove_all jumped to address 0 on a GPU machine
# (docs/GPU.md). Naming the shared libstdc++ first makes it the first library
# the program looks symbols up in, as in a program without LibTorch.
#
# distckpt_cxx_runtime_first(<library> <out-var>) sets <out-var> to the link
# option that does this, or to "" where <library> exports no part of libstdc++
# (Debian's LibTorch, LibTorch built from source).
function(distckpt_cxx_runtime_first library out)
  set(${out} "" PARENT_SCOPE)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_NM OR NOT EXISTS "${library}")
    return()
  endif()
  execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${library}"
    OUTPUT_VARIABLE symbols ERROR_QUIET RESULT_VARIABLE failed)
  # Only libstdc++ itself defines these (no header template instantiates them).
  if(failed OR NOT symbols MATCHES " [TW] _ZNK?St(10filesystem|6chrono4tzdb)")
    return()
  endif()
  # The compiler's own shared libstdc++; a compiler that links it statically
  # names none, and the system's (the one LibTorch loads) is taken.
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
    OUTPUT_VARIABLE runtime OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT IS_ABSOLUTE "${runtime}" OR NOT EXISTS "${runtime}")
    find_library(DISTCKPT_LIBSTDCXX NAMES libstdc++.so.6)
    set(runtime "${DISTCKPT_LIBSTDCXX}")
  endif()
  if(NOT EXISTS "${runtime}")
    message(WARNING "distckpt: ${library} exports parts of libstdc++ (pytorch/pytorch#133437), and no shared "
      "libstdc++.so.6 was found to link ahead of it; programs may crash in std::filesystem. Set "
      "DISTCKPT_LIBSTDCXX to the libstdc++.so.6 that LibTorch loads.")
    return()
  endif()
  get_filename_component(runtime "${runtime}" REALPATH)
  message(STATUS "distckpt: ${library} exports parts of libstdc++ (pytorch/pytorch#133437); "
    "linking ${runtime} ahead of it")
  set(${out} "-Wl,--push-state,--no-as-needed,${runtime},--pop-state" PARENT_SCOPE)
endfunction()
