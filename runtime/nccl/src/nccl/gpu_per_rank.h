// NCCL needs a GPU of its own for every rank. Two ranks on one GPU do not fail
// creation at once: on a one-GPU machine they waited out the whole timeout.
// So the ranks compare their GPUs first and fail, all of them, naming the two.
#pragma once

#include <string>
#include <vector>

namespace distckpt::nccl {

// CUDA device `device` as "<UUID>|<host>, PCI <bus id>": the UUID tells GPUs
// apart (hosts may share names and bus ids), the rest says where it is.
// Throws CommError when CUDA cannot say.
std::string gpu_identity(int device);

// "" when every rank's GPU UUID differs, else a message naming the first two
// ranks that share a GPU and what to change.
std::string shared_gpu_error(const std::vector<std::string>& identity_of_rank);

}  // namespace distckpt::nccl
