#include "nccl/gpu_per_rank.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <string_view>
#include <unordered_map>

#include "distckpt/core/errors.h"

namespace distckpt::nccl {
namespace {

void check(cudaError_t result, int device, const char* what) {
  if (result != cudaSuccess) {
    throw CommError(fmt::format("cannot identify CUDA device {} ({}): {} ({})", device, what,
                                cudaGetErrorString(result), cudaGetErrorName(result)));
  }
}

}  // namespace

std::string gpu_identity(int device) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), device, "cudaGetDeviceProperties");
  std::array<char, 64> bus{};
  check(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), device), device, "cudaDeviceGetPCIBusId");
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  // As nvidia-smi writes it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
  std::string uuid = "GPU";
  for (size_t i = 0; i < sizeof(properties.uuid.bytes); ++i) {
    const bool dash = i == 0 || i == 4 || i == 6 || i == 8 || i == 10;
    uuid += fmt::format("{}{:02x}", dash ? "-" : "", static_cast<unsigned char>(properties.uuid.bytes[i]));
  }
  return fmt::format("{}|{}, PCI {}", uuid, host.data(), bus.data());
}

std::string shared_gpu_error(const std::vector<std::string>& identity_of_rank) {
  std::unordered_map<std::string_view, size_t> first_rank;
  for (size_t rank = 0; rank < identity_of_rank.size(); ++rank) {
    const std::string_view identity = identity_of_rank[rank];
    const std::string_view uuid = identity.substr(0, identity.find('|'));
    const auto [it, fresh] = first_rank.emplace(uuid, rank);
    if (!fresh) {
      const auto where = [&](size_t r) {
        const std::string_view id = identity_of_rank[r];
        const size_t bar = id.find('|');
        return bar == std::string_view::npos ? std::string_view() : id.substr(bar + 1);
      };
      return fmt::format(
          "ranks {} and {} both use the GPU {} (rank {}: {}; rank {}: {}); NCCL needs one GPU per rank (give each "
          "rank its own with NcclOptions::device, LOCAL_RANK or CUDA_VISIBLE_DEVICES)",
          it->second, rank, uuid, it->second, where(it->second), rank, where(rank));
    }
  }
  return "";
}

}  // namespace distckpt::nccl
