// A communicator that forwards to a real one and counts what passes: the
// bytes every message carries and the collectives called (each one a round
// every rank waits in, milliseconds when ranks share cores).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/comm/communicator.h"

namespace distckpt::testing {

struct CommCounts {
  std::atomic<uint64_t> bytes{0};          // handed to the communicator, messages and tensors
  std::atomic<uint64_t> collectives{0};    // bytes collectives and barriers
  std::atomic<uint64_t> messages{0};       // point-to-point tensors sent in batches (exchange_tensors)
  std::atomic<uint64_t> message_bytes{0};  // their bytes
  // Optional: sees every message this rank hands to a bytes collective.
  std::function<void(std::string_view)> on_message;
};

class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(Communicator& inner, CommCounts& counts) : inner_(inner), counts_(counts) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<std::string> all_gather_bytes(std::string_view local) override {
    count(local);
    return inner_.all_gather_bytes(local);
  }
  std::string broadcast_bytes(std::string_view data, int root) override {
    count(data);
    return inner_.broadcast_bytes(data, root);
  }
  std::vector<std::string> gather_bytes(std::string_view local, int root) override {
    count(local);
    return inner_.gather_bytes(local, root);
  }
  std::string scatter_bytes(const std::vector<std::string>& parts, int root) override {
    count(parts);
    return inner_.scatter_bytes(parts, root);
  }
  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) override {
    count(parts);
    return inner_.all_to_all_bytes(parts);
  }
  void barrier() override {
    count(std::string_view());
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
  void exchange_tensors(const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs) override {
    for (const PeerTensor& s : sends) {
      counts_.bytes += s.tensor.nbytes();
      counts_.message_bytes += s.tensor.nbytes();
    }
    counts_.messages += sends.size();
    inner_.exchange_tensors(sends, recvs);  // batched, as the inner communicator posts them
  }
  at::Device tensor_device() const override { return inner_.tensor_device(); }
  std::string backend() const override { return inner_.backend(); }
  std::optional<std::chrono::milliseconds> timeout() const override { return inner_.timeout(); }

 private:
  void count(std::string_view message) {
    counts_.bytes += message.size();
    ++counts_.collectives;
    if (counts_.on_message) counts_.on_message(message);
  }
  void count(const std::vector<std::string>& parts) {
    uint64_t n = 0;
    for (const std::string& p : parts) {
      n += p.size();
      if (counts_.on_message) counts_.on_message(p);
    }
    counts_.bytes += n;
    ++counts_.collectives;
  }
  Communicator& inner_;
  CommCounts& counts_;
};

}  // namespace distckpt::testing
