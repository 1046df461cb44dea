# Warnings for distckpt's own targets (LibTorch headers are included as SYSTEM).
function(distckpt_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
