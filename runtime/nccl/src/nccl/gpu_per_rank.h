// NCCL needs a GPU of its own for every rank. Two ranks on one GPU do not fail
// creation at once: on a one-GPU machine they waited out the whole timeout.
// So the ranks compare their GPUs first and fail, all of them, naming the two.
#pragma once

#include <string>
#include <vector>

namespace distckpt::nccl {

// "<host> <PCI bus id>" of CUDA device `device` (its identity across ranks).
// Throws CommError when CUDA cannot say.
std::string gpu_identity(int device);

// "" when every rank's identity differs, else a message naming the first two
// ranks that share a GPU and what to change.
std::string shared_gpu_error(const std::vector<std::string>& identity_of_rank);

}  // namespace distckpt::nccl
