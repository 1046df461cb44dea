# DISTCKPT_FUZZ: instruments every target of ours for libFuzzer. Sources get
# coverage and sanitizer checks (fuzzer-no-link); only the fuzz binaries link
# libFuzzer's main (DISTCKPT_FUZZ_FLAGS, tests/fuzz).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR CMAKE_CXX_COMPILER_VERSION VERSION_LESS 16)
  message(FATAL_ERROR "DISTCKPT_FUZZ needs clang 16 (configure with -DCMAKE_CXX_COMPILER=clang++-16)")
endif()
set(DISTCKPT_FUZZ_SANITIZERS "address,undefined")
# UBSan findings abort, so libFuzzer counts them as crashes.
string(APPEND CMAKE_CXX_FLAGS " -fsanitize=fuzzer-no-link,${DISTCKPT_FUZZ_SANITIZERS}"
       " -fno-sanitize-recover=all -fno-omit-frame-pointer")
set(DISTCKPT_FUZZ_FLAGS -fsanitize=fuzzer,${DISTCKPT_FUZZ_SANITIZERS})
# -O1 and line tables only: a quicker build and still fast fuzzing; asserts
# stay on (no NDEBUG), each is one more check the fuzzer can trip.
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -gline-tables-only" CACHE STRING "" FORCE)
