// A communicator that forwards to a real one and counts what passes: the
// bytes every message carries and the collectives called (each one a round
// every rank waits in, milliseconds when ranks share cores).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"

namespace distckpt::testing {

struct CommCounts {
  std::atomic<uint64_t> bytes{0};        // handed to the communicator, messages and tensors
  std::atomic<uint64_t> collectives{0};  // bytes collectives and barriers
};

class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(Communicator& inner, CommCounts& counts) : inner_(inner), counts_(counts) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<std::string> all_gather_bytes(std::string_view local) override {
    count(local.size());
    return inner_.all_gather_bytes(local);
  }
  std::string broadcast_bytes(std::string_view data, int root) override {
    count(data.size());
    return inner_.broadcast_bytes(data, root);
  }
  std::vector<std::string> gather_bytes(std::string_view local, int root) override {
    count(local.size());
    return inner_.gather_bytes(local, root);
  }
  std::string scatter_bytes(const std::vector<std::string>& parts, int root) override {
    count(total(parts));
    return inner_.scatter_bytes(parts, root);
  }
  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) override {
    count(total(parts));
    return inner_.all_to_all_bytes(parts);
  }
  void barrier() override {
    count(0);
    inner_.barrier();
  }
  void broadcast_tensor(at::Tensor& tensor, int root) override {
    counts_.bytes += tensor.nbytes();
    inner_.broadcast_tensor(tensor, root);
  }
  void send_tensor(const at::Tensor& tensor, int dst, int tag) override {
    counts_.bytes += tensor.nbytes();
    inner_.send_tensor(tensor, dst, tag);
  }
  void recv_tensor(at::Tensor& tensor, int src, int tag) override { inner_.recv_tensor(tensor, src, tag); }
  std::string backend() const override { return inner_.backend(); }
  std::optional<std::chrono::milliseconds> timeout() const override { return inner_.timeout(); }

 private:
  void count(uint64_t bytes) {
    counts_.bytes += bytes;
    ++counts_.collectives;
  }
  static uint64_t total(const std::vector<std::string>& parts) {
    uint64_t n = 0;
    for (const std::string& p : parts) n += p.size();
    return n;
  }
  Communicator& inner_;
  CommCounts& counts_;
};

}  // namespace distckpt::testing
