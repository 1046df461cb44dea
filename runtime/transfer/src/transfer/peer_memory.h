// Reading another process's memory on the same host (Linux cross-memory
// attach, process_vm_readv): within a host, a transfer's destination copies
// the bytes it needs straight out of the source rank's tensor, once, with
// no buffer in between and no message. A source offers its CPU tensors'
// addresses with its plan; its host's ranks first check that they can read
// one another (containers, Yama's ptrace scope or seccomp may forbid it),
// and the transfer uses the path only where every rank of the host can.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distckpt/core/sharded_tensor.h"
#include "distckpt/storage/storage_reader.h"

namespace distckpt::transferring {

// Where a rank's sources lie in its memory, as it offers them.
struct Reach {
  std::string host;
  int64_t pid = 0;  // 0: offers nothing
  uint64_t token_address = 0, token = 0;
  std::vector<uint64_t> addresses;  // per source tensor (plan order): its first byte; 0: not offered
};

// This process's offer for `mine`: a tensor is offered when it lies
// contiguous in CPU memory and in a storage of `owned` (sorted: those of the
// caller's own tensors, which keep their place between steps; a tensor a
// factory builds anew for each transfer would change the plan every time).
Reach reach_of(const std::vector<const ShardedTensor*>& mine, const std::vector<const void*>& owned);

// A rank's message in the gathering of sources: its plan's bytes and its reach.
std::string encode_source(const std::string& plan, const Reach& reach);
// ProtocolError, naming `origin`, when malformed.
std::pair<std::string, Reach> decode_source(std::string_view bytes, const std::string& origin);

// Whether this process can read every other offering rank of its host in
// `reaches` (each one's token).
bool can_read_host_peers(const std::vector<Reach>& reaches, int me);

// Ranks that may read one another's memory: per rank, a group number (one
// per host) or -1. `can_read`: each rank's answer of can_read_host_peers.
std::vector<int> direct_groups(const std::vector<Reach>& reaches, const std::vector<bool>& can_read);

// While alive, processes of this user may ptrace this one, which reading
// its memory needs (with Yama's ptrace scope 1 only ancestors could
// otherwise): prctl(PR_SET_PTRACER, ANY), set by the first of the process's
// transfers running at once and cleared by the last (a ptracer the process
// set itself before is not restored: Linux cannot report it).
class PeerReadsAllowed {
 public:
  explicit PeerReadsAllowed(bool allow);
  ~PeerReadsAllowed();
  PeerReadsAllowed(const PeerReadsAllowed&) = delete;
  PeerReadsAllowed& operator=(const PeerReadsAllowed&) = delete;

 private:
  bool allowed_ = false;
};

// `runs` (offsets from `address`) out of process `pid`'s memory. CommError
// when the process is gone, UsageError when its memory there is gone (a
// source freed or moved during the transfer), IoError otherwise; `what`
// names the source.
void read_peer(int64_t pid, uint64_t address, const std::vector<ByteRun>& runs,
               const std::function<std::string()>& what);

}  // namespace distckpt::transferring
