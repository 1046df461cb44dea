// Links the installed NCCL communicator and calls into NCCL (no GPU needed).
#include <cstdio>

#include "distckpt/nccl/nccl_communicator.h"

int main() {
  const int built = distckpt::nccl_build_version(), loaded = distckpt::nccl_runtime_version();
  std::printf("distckpt::nccl: built against NCCL %d, loaded %d\n", built, loaded);
  return built > 0 && built == loaded ? 0 : 1;
}
