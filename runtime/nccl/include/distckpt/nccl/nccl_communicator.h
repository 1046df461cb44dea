// A communicator for trainers that run NCCL themselves rather than through
// c10d's ProcessGroupNCCL: tensors move over a NCCL communicator on a stream
// of its own; plans and metadata (bytes) stay on a CPU communicator (Gloo),
// so planning never touches the GPU.
//
// Every wait is bounded: communicator creation is non-blocking, and a
// watchdog polls each exchange. A peer that is dead or hung makes the
// communicator call ncclCommAbort and throw CommError within
// NcclOptions::timeout, on every rank that waits for it; it never hangs.
//
// Linked as distckpt::nccl (libdistckpt_nccl), built where the CUDA toolkit
// and NCCL are found (see docs/GPU.md).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

#include "distckpt/comm/communicator.h"

// NCCL's and CUDA's handle types, declared as their headers declare them, so
// this header needs neither.
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;

namespace c10d {
class Store;
}  // namespace c10d

namespace distckpt {

struct NcclOptions {
  // This rank's CUDA device; -1: LOCAL_RANK when set, else the rank modulo
  // the number of visible devices.
  int device = -1;
  // How long creation and each exchange may wait for the other ranks.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Collective over `bytes` (a CPU communicator over the same ranks, e.g. from
// communicator_from_store). Rank 0's ncclUniqueId reaches the others through
// `store` (keys under "distckpt/nccl/"). Throws CommError on every rank when
// any rank cannot create its part (no GPU, a NCCL error, a peer that never
// came), naming that rank and the cause.
std::shared_ptr<Communicator> nccl_communicator_from_store(const c10::intrusive_ptr<c10d::Store>& store,
                                                           std::shared_ptr<Communicator> bytes,
                                                           const NcclOptions& options = {});

// Wraps a communicator and stream the caller created and keeps owning
// (distckpt never destroys them). When an exchange fails or times out,
// distckpt calls ncclCommAbort on `comm`, which frees it: after such a
// CommError the caller must neither use, destroy nor abort `comm` again.
// Ranks must match `bytes`.
std::shared_ptr<Communicator> nccl_communicator_wrap(ncclComm_t comm, cudaStream_t stream,
                                                     std::shared_ptr<Communicator> bytes,
                                                     const NcclOptions& options = {});

// The NCCL version distckpt was compiled against and the one loaded at run
// time, as NCCL encodes them (2.28.9 is 22809).
int nccl_build_version();
int nccl_runtime_version();

}  // namespace distckpt
