// Communicator over a c10d process group: Gloo on CPU; NCCL on CUDA builds
// of LibTorch 2.x. The only place that knows the LibTorch version.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "distckpt/comm/communicator.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace distckpt {

struct ProcessGroupOptions {
  std::string backend = "gloo";  // "gloo" or "nccl" (CUDA builds only)
  // How long the rendezvous and each collective may wait for the other
  // ranks; past it every waiting rank throws a TimeoutError saying which
  // operation timed out (a rank that is stopped, deadlocked or gone makes the
  // others fail instead of hang); at start-up the message names the ranks
  // that never arrived. Unset: DISTCKPT_TIMEOUT_SECONDS when that variable is
  // set (operators tune it without a rebuild), else kDefaultTimeout.
  std::optional<std::chrono::milliseconds> timeout;
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};
  // Host name or address the Gloo device binds to. Empty: the interface named
  // by GLOO_SOCKET_IFNAME if set, else MASTER_ADDR where it is local, else
  // the local address of the route to MASTER_ADDR (then this machine's host
  // name), else loopback.
  std::string gloo_hostname;
};

// Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK optional) as
// torchrun sets them, rendezvous over a TCPStore hosted by rank 0, and
// returns a communicator. Throws UsageError naming any missing or malformed
// variable. DISTCKPT_TIMEOUT_SECONDS (integer or decimal seconds, e.g. "30"
// or "2.5") is the timeout when options.timeout is unset.
std::shared_ptr<Communicator> communicator_from_env(const ProcessGroupOptions& options = {});

// Over a store the caller owns (e.g. a HashStore shared by threads in tests).
// Uses keys under "distckpt/"; give each further communicator on the same
// store its own c10d::PrefixStore. The timeout is resolved as for
// communicator_from_env.
std::shared_ptr<Communicator> communicator_from_store(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                      int world_size, const ProcessGroupOptions& options = {});

// From a process group the caller already has (both bytes and tensors go over
// it; with a NCCL-only group, bytes are staged through the current GPU).
std::shared_ptr<Communicator> communicator_from_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// Environment as torchrun provides it.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::optional<std::chrono::milliseconds> timeout;  // DISTCKPT_TIMEOUT_SECONDS, when set
};
inline constexpr const char* kTimeoutVariable = "DISTCKPT_TIMEOUT_SECONDS";
LaunchEnv read_launch_env();  // throws UsageError on missing/invalid variables
// DISTCKPT_TIMEOUT_SECONDS, when set (UsageError when it is not a timeout).
std::optional<std::chrono::milliseconds> timeout_from_env();

}  // namespace distckpt
