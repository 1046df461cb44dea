// Communicator over c10d groups. Bytes (plans, metadata) travel over a group
// that can move host tensors (Gloo), so planning never touches a GPU; tensors
// travel over the "device" group (the same Gloo group on CPU, NCCL on GPU).
//
// A template over the group type because in LibTorch 2.x the concrete
// backends we build are c10d::Backend while a caller's group is a
// c10d::ProcessGroup (see c10d_compat.h). Only process_group.cpp includes it.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/c10d_compat.h"
#include "comm/peer_order.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/comm/process_group.h"
#include "distckpt/core/errors.h"

namespace distckpt::comm_detail {

template <typename Group>
class GroupCommunicator final : public Communicator {
 public:
  // `byte_device` is where byte tensors must live for `byte_group`: the CPU,
  // except for a caller's NCCL-only group, which moves CUDA tensors only.
  // `timeout` is the groups' own, for error texts (unknown for a caller's group).
  GroupCommunicator(c10::intrusive_ptr<Group> byte_group, c10::intrusive_ptr<Group> tensor_group, std::string backend,
                    at::Device byte_device = at::kCPU, std::optional<std::chrono::milliseconds> timeout = std::nullopt)
      : byte_group_(std::move(byte_group)),
        tensor_group_(std::move(tensor_group)),
        backend_(std::move(backend)),
        byte_device_(byte_device),
        timeout_(timeout),
        rank_(byte_group_->getRank()),
        size_(byte_group_->getSize()) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return backend_; }
  std::optional<std::chrono::milliseconds> timeout() const override { return timeout_; }
  at::Device tensor_device() const override { return backend_ == "nccl" ? at::Device(at::kCUDA) : at::kCPU; }

  std::vector<std::string> all_gather_bytes(std::string_view local) override {
    // Gloo's allgather needs equal shapes. One round of rows that carry each
    // length and the first `inline_bytes` of each message; only when some
    // message is longer, a second round padded to the longest. Agreement
    // statuses and plan announcements fit in the first: a collective among
    // ranks sharing cores costs milliseconds a round.
    const int64_t inline_bytes = inline_width();
    const auto length = static_cast<int64_t>(local.size());
    at::Tensor row = at::zeros({kLengthBytes + inline_bytes}, at::kByte);
    auto* out = static_cast<uint8_t*>(row.data_ptr());
    std::memcpy(out, &length, kLengthBytes);
    if (length > 0) std::memcpy(out + kLengthBytes, local.data(), static_cast<size_t>(std::min(length, inline_bytes)));
    std::vector<at::Tensor> inputs{to_byte_device(row)};
    at::Tensor first = at::empty({size_, kLengthBytes + inline_bytes}, byte_options());
    std::vector<std::vector<at::Tensor>> outputs{rows_of(first)};
    run("all_gather_bytes", [&] { return byte_group_->allgather(outputs, inputs); });
    const at::Tensor host = to_host(first).contiguous();
    const auto* rows = static_cast<const uint8_t*>(host.data_ptr());
    std::vector<int64_t> sizes(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      std::memcpy(&sizes[static_cast<size_t>(r)], rows + r * (kLengthBytes + inline_bytes), kLengthBytes);
    }
    if (*std::min_element(sizes.begin(), sizes.end()) < 0) {
      throw CommError(fmt::format("all_gather_bytes on rank {}: a rank announced a negative length", rank_));
    }
    const int64_t width = *std::max_element(sizes.begin(), sizes.end());
    if (width == 0) return std::vector<std::string>(static_cast<size_t>(size_));
    if (width <= inline_bytes) return split_rows(host.narrow(1, kLengthBytes, inline_bytes), sizes);
    inputs = {padded_bytes(local, width)};
    at::Tensor output = at::empty({size_, width}, byte_options());
    outputs = {rows_of(output)};
    run("all_gather_bytes (long)", [&] { return byte_group_->allgather(outputs, inputs); });
    return split_rows(output, sizes);
  }

  std::string broadcast_bytes(std::string_view data, int root) override {
    check_rank(root, "broadcast_bytes", "root");
    const bool is_root = rank_ == root;
    at::Tensor length =
        to_byte_device(at::full({1}, is_root ? static_cast<int64_t>(data.size()) : int64_t{0}, at::kLong));
    c10d::BroadcastOptions options;
    options.rootRank = root;
    std::vector<at::Tensor> length_list{length};
    run("broadcast_bytes (size)", [&] { return byte_group_->broadcast(length_list, options); });
    const int64_t n = to_host(length).item<int64_t>();
    if (n == 0) return {};
    std::vector<at::Tensor> payload{is_root ? padded_bytes(data, n) : at::empty({n}, byte_options())};
    run("broadcast_bytes", [&] { return byte_group_->broadcast(payload, options); });
    return split_rows(payload[0].view({1, n}), {n}).front();
  }

  std::vector<std::string> gather_bytes(std::string_view local, int root) override {
    check_rank(root, "gather_bytes", "root");
    // An all-to-all in which only the root's parts are not empty: the root
    // holds exactly the bytes sent, where a gather of rows padded to the
    // longest would hold world x the longest (write results at commit: one
    // rank writing many chunks would cost gigabytes on a large job).
    std::vector<std::string> parts(static_cast<size_t>(size_));
    parts[static_cast<size_t>(root)] = std::string(local);
    std::vector<std::string> received = all_to_all_bytes(parts);
    if (rank_ != root) return {};
    return received;
  }

  std::string scatter_bytes(const std::vector<std::string>& parts, int root) override {
    check_rank(root, "scatter_bytes", "root");
    const bool is_root = rank_ == root;
    if (is_root && parts.size() != static_cast<size_t>(size_)) {
      throw CommError(fmt::format("scatter_bytes on rank {}: {} parts given for {} ranks", rank_, parts.size(), size_));
    }
    // Every rank needs the common width; the root tells everyone every size.
    at::Tensor sizes = at::zeros({size_}, at::kLong);
    if (is_root) {
      for (int r = 0; r < size_; ++r) sizes[r] = static_cast<int64_t>(parts[static_cast<size_t>(r)].size());
    }
    sizes = to_byte_device(sizes);
    c10d::BroadcastOptions broadcast;
    broadcast.rootRank = root;
    std::vector<at::Tensor> size_list{sizes};
    run("scatter_bytes (sizes)", [&] { return byte_group_->broadcast(size_list, broadcast); });
    const at::Tensor host_sizes = to_host(sizes).contiguous();
    const int64_t* all = host_sizes.data_ptr<int64_t>();
    const int64_t width = *std::max_element(all, all + size_);
    if (width == 0) return {};
    std::vector<at::Tensor> outputs{at::empty({width}, byte_options())};
    std::vector<std::vector<at::Tensor>> inputs;  // c10d wants none on non-roots
    if (is_root) {
      inputs.emplace_back();
      for (const std::string& part : parts) inputs.back().push_back(padded_bytes(part, width));
    }
    c10d::ScatterOptions options;
    options.rootRank = root;
    run("scatter_bytes", [&] { return byte_group_->scatter(outputs, inputs, options); });
    return split_rows(outputs[0].view({1, width}), {all[rank_]}).front();
  }

  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) override {
    if (parts.size() != static_cast<size_t>(size_)) {
      throw CommError(
          fmt::format("all_to_all_bytes on rank {}: {} parts given for {} ranks", rank_, parts.size(), size_));
    }
    std::vector<int64_t> send_sizes(parts.size());
    for (size_t r = 0; r < parts.size(); ++r) send_sizes[r] = static_cast<int64_t>(parts[r].size());
    // First each rank tells each other how much it sends, one int64 each.
    at::Tensor sizes_in = to_byte_device(at::from_blob(send_sizes.data(), {size_}, at::kLong).clone());
    at::Tensor sizes_out = at::empty({size_}, byte_options().dtype(at::kLong));
    std::vector<int64_t> equal_split;  // empty: one element per rank
    run("all_to_all_bytes (sizes)",
        [&] { return byte_group_->alltoall_base(sizes_out, sizes_in, equal_split, equal_split); });
    const at::Tensor host_sizes = to_host(sizes_out).contiguous();
    std::vector<int64_t> recv_sizes(host_sizes.data_ptr<int64_t>(), host_sizes.data_ptr<int64_t>() + size_);
    int64_t send_total = 0, recv_total = 0;
    for (int r = 0; r < size_; ++r) {
      if (recv_sizes[static_cast<size_t>(r)] < 0) {
        throw CommError(fmt::format("all_to_all_bytes on rank {}: rank {} announced {} bytes", rank_, r,
                                    recv_sizes[static_cast<size_t>(r)]));
      }
      send_total += send_sizes[static_cast<size_t>(r)];
      recv_total += recv_sizes[static_cast<size_t>(r)];
    }
    at::Tensor input = at::empty({send_total}, at::kByte);
    auto* out = static_cast<char*>(input.data_ptr());
    for (const std::string& part : parts) {
      if (!part.empty()) std::memcpy(out, part.data(), part.size());
      out += part.size();
    }
    input = to_byte_device(input);
    at::Tensor output = at::empty({recv_total}, byte_options());
    // c10d's Gloo backend moves from the split vectors it is given: pass copies.
    std::vector<int64_t> output_splits = recv_sizes, input_splits = send_sizes;
    run("all_to_all_bytes", [&] { return byte_group_->alltoall_base(output, input, output_splits, input_splits); });
    const at::Tensor host = to_host(output).contiguous();
    const auto* base = static_cast<const char*>(host.data_ptr());
    std::vector<std::string> received;
    received.reserve(parts.size());
    for (const int64_t n : recv_sizes) {
      received.push_back(n == 0 ? std::string() : std::string(base, static_cast<size_t>(n)));
      base += n;
    }
    return received;
  }

  void barrier() override {
    run("barrier", [&] { return byte_group_->barrier(); });
  }

  void broadcast_tensor(at::Tensor& tensor, int root) override {
    check_rank(root, "broadcast_tensor", "root");
    check_tensor(tensor, "broadcast_tensor");
    c10d::BroadcastOptions options;
    options.rootRank = root;
    // c10d needs dense tensors; a strided view goes through a contiguous copy.
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    run("broadcast_tensor", [&] { return tensor_group_->broadcast(tensors, options); });
    if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
  }

  void send_tensor(const at::Tensor& tensor, int dst, int tag) override {
    const std::string what = fmt::format("send_tensor to rank {} (tag {})", dst, tag);
    check_peer(dst, what);
    check_tensor(tensor, what);
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    run(what, [&] { return tensor_group_->send(tensors, dst, tag); });
  }

  void exchange_tensors(const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs) override {
    const std::string what = fmt::format("exchange of {} sends and {} receives", sends.size(), recvs.size());
    // Everything is posted before anything is waited for, in pairwise order
    // (comm/peer_order.h): c10d's NCCL runs a pair's sends and receives on
    // one stream, where two ranks that both send first could wait forever.
    std::vector<std::vector<at::Tensor>> send_lists, recv_lists;
    for (const PeerTensor& s : sends) {
      check_peer(s.peer, what);
      check_tensor(s.tensor, what);
      send_lists.push_back({s.tensor.contiguous()});
    }
    for (const PeerTensor& r : recvs) {
      check_peer(r.peer, what);
      check_tensor(r.tensor, what);
      recv_lists.push_back({r.tensor.contiguous()});
    }
    run(what, [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> posted;
      for (const comm::PeerOp& o : comm::pairwise_order(rank_, sends, recvs)) {
        if (o.send) {
          posted.push_back(
              tensor_group_->send(send_lists[static_cast<size_t>(o.op - sends.data())], o.op->peer, o.op->tag));
        } else {
          posted.push_back(
              tensor_group_->recv(recv_lists[static_cast<size_t>(o.op - recvs.data())], o.op->peer, o.op->tag));
        }
      }
      return AllWork{std::move(posted)};
    });
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!recv_lists[i][0].is_same(recvs[i].tensor)) const_cast<at::Tensor&>(recvs[i].tensor).copy_(recv_lists[i][0]);
    }
  }

  void recv_tensor(at::Tensor& tensor, int src, int tag) override {
    const std::string what = fmt::format("recv_tensor from rank {} (tag {})", src, tag);
    check_peer(src, what);
    check_tensor(tensor, what);
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    run(what, [&] { return tensor_group_->recv(tensors, src, tag); });
    if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
  }

 private:
  static constexpr int64_t kLengthBytes = sizeof(int64_t);

  // Several posted operations waited for as one (run() calls ->wait()).
  struct AllWork {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    const AllWork* operator->() const { return this; }
    void wait() const {
      for (const auto& work : works) work->wait();
    }
  };

  // What all_gather_bytes carries in its first round: up to 120 bytes a
  // message, less in large worlds, so that round stays within 4 MiB a rank.
  int64_t inline_width() const {
    constexpr int64_t kMostInline = 120, kRoundBytes = int64_t{4} << 20;
    return std::max<int64_t>(0, std::min(kMostInline, kRoundBytes / size_ - kLengthBytes));
  }

  // Starts a c10d operation, waits for it, and turns whatever c10d throws
  // (c10::Error, gloo exceptions, timeouts) into a CommError (TimeoutError
  // for a timeout) naming the rank.
  template <typename StartWork>
  void run(const std::string& what, StartWork&& start) const {
    try {
      auto work = start();
      work->wait();
    } catch (const c10::Error& e) {
      raise(what, e.what_without_backtrace());
    } catch (const std::exception& e) {
      raise(what, e.what());
    }
  }

  [[noreturn]] void raise(const std::string& what, const char* cause) const {
    if (is_timeout(cause)) throw TimeoutError(failure(what, cause));
    throw CommError(failure(what, cause));
  }

  std::string failure(const std::string& what, const char* cause) const {
    if (is_timeout(cause)) {
      // A timeout is nearly always another rank's problem: say so, and how to tell hung from slow.
      const std::string after =
          timeout_ ? fmt::format(" after {:g} s", static_cast<double>(timeout_->count()) / 1000.0) : "";
      return fmt::format(
          "{} timed out{} on rank {} of {} ({} backend): another rank did not take part in time; a peer rank is "
          "probably hung (stopped, deadlocked, stuck in I/O) or dead. Check the other ranks' output; if they are only "
          "slow, raise the timeout ({} or ProcessGroupOptions::timeout). Cause: {}",
          what, after, rank_, size_, backend_, kTimeoutVariable, cause);
    }
    return fmt::format("{} failed on rank {} of {} ({} backend): {}", what, rank_, size_, backend_, cause);
  }

  // Gloo says "Timed out waiting ...", c10d "... timed out" or "Timeout".
  static bool is_timeout(std::string_view cause) {
    std::string lower(cause);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
  }

  at::TensorOptions byte_options() const { return at::TensorOptions().dtype(at::kByte).device(byte_device_); }

  // `bytes` copied into a zero-padded uint8 tensor of `width` elements.
  at::Tensor padded_bytes(std::string_view bytes, int64_t width) const {
    at::Tensor host = at::zeros({width}, at::kByte);
    if (!bytes.empty()) std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
    return to_byte_device(host);
  }

  at::Tensor to_byte_device(at::Tensor host) const { return byte_device_.is_cpu() ? host : host.to(byte_device_); }

  static at::Tensor to_host(const at::Tensor& tensor) { return tensor.is_cpu() ? tensor : tensor.cpu(); }

  // Views of each row: c10d's list-of-tensors collectives write into them.
  std::vector<at::Tensor> rows_of(const at::Tensor& matrix) const {
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<size_t>(size_));
    for (int64_t r = 0; r < matrix.size(0); ++r) rows.push_back(matrix[r]);
    return rows;
  }

  // Row r of a [n, width] byte matrix, trimmed to lengths[r] bytes.
  static std::vector<std::string> split_rows(const at::Tensor& matrix, const std::vector<int64_t>& lengths) {
    at::Tensor host = to_host(matrix).contiguous();
    const auto* base = reinterpret_cast<const char*>(host.data_ptr());
    const int64_t width = host.size(1);
    std::vector<std::string> rows;
    rows.reserve(lengths.size());
    for (size_t r = 0; r < lengths.size(); ++r) {
      rows.emplace_back(base + static_cast<int64_t>(r) * width, static_cast<size_t>(lengths[r]));
    }
    return rows;
  }

  void check_rank(int rank, const std::string& what, const char* role) const {
    if (rank < 0 || rank >= size_) {
      throw CommError(
          fmt::format("{} on rank {}: {} rank {} is outside the group of {} ranks", what, rank_, role, rank, size_));
    }
  }

  void check_peer(int peer, const std::string& what) const {
    check_rank(peer, what, "peer");
    if (peer == rank_) {
      throw CommError(
          fmt::format("{} on rank {}: a rank cannot exchange tensors with itself; copy "
                      "locally instead",
                      what, rank_));
    }
  }

  void check_tensor(const at::Tensor& tensor, const std::string& what) const {
    if (!tensor.defined()) {
      throw CommError(fmt::format("{} on rank {}: the tensor is undefined", what, rank_));
    }
    if (backend_ == "nccl" && !tensor.is_cuda()) {
      throw CommError(
          fmt::format("{} on rank {}: the nccl backend moves CUDA tensors only, got a {} tensor; move it to "
                      "this rank's GPU first",
                      what, rank_, tensor.device().str()));
    }
  }

  c10::intrusive_ptr<Group> byte_group_;
  c10::intrusive_ptr<Group> tensor_group_;
  std::string backend_;
  at::Device byte_device_;
  std::optional<std::chrono::milliseconds> timeout_;
  int rank_;
  int size_;
};

}  // namespace distckpt::comm_detail
