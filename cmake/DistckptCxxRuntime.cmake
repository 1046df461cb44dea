# The C++ runtime ahead of LibTorch on the link line, where LibTorch needs it.
#
# PyTorch's Linux wheels (2.4 on) export parts of the libstdc++ they link
# statically: std::filesystem, std::chrono's time zones (pytorch/pytorch#133437;
# libtorch_cpu.so at first, libtorch.so in 2.11 + CUDA 13). A program that
# links those libraries before the C++ runtime binds its own calls of these
# functions to LibTorch's copies, whose calls into the rest of libstdc++ can
# resolve to nothing: std::filesystem::remove_all jumped to address 0 on a GPU
# machine (docs/GPU.md). Naming the shared libstdc++ first makes it the first
# library the program looks symbols up in, as in a program without LibTorch.
#
# distckpt_cxx_runtime_first(<library> <out-var>) looks at <library> and the
# libtorch*/libc10* libraries beside it, and sets <out-var> to the link option
# that does this, or to "" where none exports part of libstdc++ (Debian's
# LibTorch, LibTorch built from source). It says which in one configure line.
# DISTCKPT_LIBSTDCXX names the libstdc++.so.6 to link, if the found one is wrong.
function(distckpt_cxx_runtime_first library out)
  set(${out} "" PARENT_SCOPE)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_NM OR NOT EXISTS "${library}")
    return()
  endif()
  get_filename_component(dir "${library}" DIRECTORY)
  file(GLOB candidates "${dir}/libtorch*.so" "${dir}/libc10*.so")
  list(PREPEND candidates "${library}")
  list(REMOVE_DUPLICATES candidates)
  # Functions only libstdc++ defines out of line (no header emits them inline).
  set(pattern " [TW] _ZNK?St(10filesystem(7__cxx11)?(10remove_all|28recursive_directory_iterator)|6chrono4tzdb)")
  set(exporter "")
  foreach(candidate IN LISTS candidates)
    execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${candidate}" COMMAND grep -m 1 -E "${pattern}"
      OUTPUT_VARIABLE found OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(found)
      set(exporter "${candidate}")
      break()
    endif()
  endforeach()
  if(NOT exporter)
    message(STATUS "distckpt: LibTorch exports no part of libstdc++; the link order stays as it is")
    return()
  endif()
  # Asked for by name, else the compiler's own, else the system's (the one LibTorch loads).
  set(runtime "${DISTCKPT_LIBSTDCXX}")
  if(NOT runtime)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
      OUTPUT_VARIABLE runtime OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(NOT IS_ABSOLUTE "${runtime}" OR NOT EXISTS "${runtime}")
    find_library(DISTCKPT_LIBSTDCXX_FOUND NAMES libstdc++.so.6)
    set(runtime "${DISTCKPT_LIBSTDCXX_FOUND}")
  endif()
  if(NOT EXISTS "${runtime}")
    message(WARNING "distckpt: ${exporter} exports parts of libstdc++ (pytorch/pytorch#133437), and no shared "
      "libstdc++.so.6 was found to link ahead of it; programs may crash in std::filesystem. Set "
      "DISTCKPT_LIBSTDCXX to the libstdc++.so.6 that LibTorch loads.")
    return()
  endif()
  get_filename_component(runtime "${runtime}" REALPATH)
  message(STATUS "distckpt: ${exporter} exports parts of libstdc++ (pytorch/pytorch#133437); "
    "linking ${runtime} ahead of it")
  set(${out} "-Wl,--push-state,--no-as-needed,${runtime},--pop-state" PARENT_SCOPE)
endfunction()
