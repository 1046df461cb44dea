// The LibTorch version differences of c10d, in one place.
//
// LibTorch 1.x: ProcessGroupGloo and ProcessGroupNCCL derive from
// c10d::ProcessGroup. LibTorch 2.x: they derive from c10d::Backend, and a
// ProcessGroup is a dispatcher over backends. Both expose the collectives we
// use (broadcast, allgather, gather, send, recv, barrier) with the same
// signatures, so the communicator is a template over the group type and this
// header names the type that concrete backends share.
#pragma once

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

// DISTCKPT_WITH_NCCL defines DISTCKPT_C10D_NCCL; CUDA builds of LibTorch
// define USE_C10D_NCCL for every user, which alone must not pull in nccl.h.
#ifdef DISTCKPT_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace distckpt::c10d_compat {

#if TORCH_VERSION_MAJOR >= 2
using BackendGroup = c10d::Backend;
#else
using BackendGroup = c10d::ProcessGroup;
#endif

// Whether this build of LibTorch can make a NCCL group at all.
#ifdef DISTCKPT_C10D_NCCL
inline constexpr bool kHasNccl = true;
#else
inline constexpr bool kHasNccl = false;
#endif

}  // namespace distckpt::c10d_compat
