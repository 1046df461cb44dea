// The collectives distckpt needs, over any transport. Metadata and plans
// travel as bytes; tensors (fully parallel load, replication) travel as
// tensors so a NCCL backend can move them on the GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace distckpt {

// One side of a point-to-point transfer in a batch.
struct PeerTensor {
  at::Tensor tensor;
  int peer = 0;
  int tag = 0;  // matches a send with its receive where the backend has tags (Gloo)
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool is_coordinator() const { return rank() == 0; }

  // Every rank contributes bytes of any length; every rank gets all of them, by rank.
  virtual std::vector<std::string> all_gather_bytes(std::string_view local) = 0;
  // `root`'s bytes on every rank (other ranks' argument is ignored).
  virtual std::string broadcast_bytes(std::string_view data, int root) = 0;
  // All ranks' bytes on `root` (by rank); an empty vector elsewhere.
  virtual std::vector<std::string> gather_bytes(std::string_view local, int root) = 0;
  // `parts[r]` of `root` on rank r (`parts` has one entry per rank on root
  // and is ignored elsewhere).
  virtual std::string scatter_bytes(const std::vector<std::string>& parts, int root) = 0;
  // `parts[r]` goes to rank r (one entry per rank, any lengths, empty ones
  // cost nothing but their size); returns what each rank sent this one, by
  // rank. Memory is what is sent and received, never world x the longest.
  virtual std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) = 0;
  virtual void barrier() = 0;

  // In-place tensor broadcast from `root` (same shape/dtype on every rank).
  virtual void broadcast_tensor(at::Tensor& tensor, int root) = 0;
  // Point to point, for exchanges between subsets of ranks.
  virtual void send_tensor(const at::Tensor& tensor, int dst, int tag) = 0;
  virtual void recv_tensor(at::Tensor& tensor, int src, int tag) = 0;
  // Every send and receive of a batch, returned when all are done: one NCCL
  // group, or Gloo's asynchronous sends and receives all posted at once.
  // Sends and receives between two ranks pair up in list order (and by
  // tag); receiving tensors are written in place. The default (for
  // communicators that only forward send/recv) goes peer by peer in rank
  // order, which cannot deadlock, but one message at a time.
  virtual void exchange_tensors(const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs);

  // Where tensors passed to broadcast/send/recv must live: the CPU for Gloo,
  // the current GPU for NCCL.
  virtual at::Device tensor_device() const { return at::kCPU; }

  // Human-readable backend name ("gloo", "nccl", "single").
  virtual std::string backend() const = 0;

  // How long a collective waits for the other ranks before it fails, when
  // known; waits outside the collectives (ranks on one host signalling
  // through shared memory) give up after the same time.
  virtual std::optional<std::chrono::milliseconds> timeout() const { return std::nullopt; }
};

// A world of one: every collective is the identity. For tools that read
// checkpoints without a job (distckpt CLI, load_plain_tensors) and for tests.
std::shared_ptr<Communicator> make_single_process_communicator();

}  // namespace distckpt
