// A world of one rank: every collective is the identity.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }

  std::vector<std::string> all_gather_bytes(std::string_view local) override { return {std::string(local)}; }

  std::string broadcast_bytes(std::string_view data, int root) override {
    check_root(root, "broadcast_bytes");
    return std::string(data);
  }

  std::vector<std::string> gather_bytes(std::string_view local, int root) override {
    check_root(root, "gather_bytes");
    return {std::string(local)};
  }

  std::string scatter_bytes(const std::vector<std::string>& parts, int root) override {
    check_root(root, "scatter_bytes");
    if (parts.size() != 1) {
      throw CommError(fmt::format("scatter_bytes: {} parts given for a single-process world (need 1)", parts.size()));
    }
    return parts[0];
  }

  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) override {
    if (parts.size() != 1) {
      throw CommError(
          fmt::format("all_to_all_bytes: {} parts given for a single-process world (need 1)", parts.size()));
    }
    return parts;
  }

  void barrier() override {}

  void broadcast_tensor(at::Tensor& tensor, int root) override { check_root(root, "broadcast_tensor"); }

  void send_tensor(const at::Tensor& tensor, int dst, int tag) override { throw no_peer("send_tensor to", dst); }

  void recv_tensor(at::Tensor& tensor, int src, int tag) override { throw no_peer("recv_tensor from", src); }

 private:
  static void check_root(int root, const char* what) {
    if (root != 0) {
      throw CommError(
          fmt::format("{}: root rank {} does not exist in a single-process world (only rank 0)", what, root));
    }
  }

  static CommError no_peer(const char* what, int peer) {
    return CommError(
        fmt::format("{} rank {}: a single-process world has no other rank to exchange tensors with", what, peer));
  }
};

}  // namespace

std::shared_ptr<Communicator> make_single_process_communicator() {
  return std::make_shared<SingleProcessCommunicator>();
}

}  // namespace distckpt
