#include "nccl/gpu_per_rank.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <unordered_map>

#include "distckpt/core/errors.h"

namespace distckpt::nccl {

std::string gpu_identity(int device) {
  std::array<char, 64> bus{};
  const cudaError_t got = cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), device);
  if (got != cudaSuccess) {
    throw CommError(
        fmt::format("cannot identify CUDA device {}: {} ({})", device, cudaGetErrorString(got), cudaGetErrorName(got)));
  }
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  return fmt::format("{} {}", host.data(), bus.data());
}

std::string shared_gpu_error(const std::vector<std::string>& identity_of_rank) {
  std::unordered_map<std::string, size_t> first_rank;
  for (size_t rank = 0; rank < identity_of_rank.size(); ++rank) {
    const auto [it, fresh] = first_rank.emplace(identity_of_rank[rank], rank);
    if (!fresh) {
      return fmt::format(
          "ranks {} and {} both use the GPU {}; NCCL needs one GPU per rank (give each rank its own with "
          "NcclOptions::device, LOCAL_RANK or CUDA_VISIBLE_DEVICES)",
          it->second, rank, identity_of_rank[rank]);
    }
  }
  return "";
}

}  // namespace distckpt::nccl
