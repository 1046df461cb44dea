// NcclCommunicator: tensors over NCCL on a stream of its own, bytes over the
// caller's CPU communicator; every wait bounded by a watchdog that aborts.
#include "distckpt/nccl/nccl_communicator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "comm/agreement.h"
#include "core/device_event.h"
#include "distckpt/core/errors.h"
#include "nccl/gpu_per_rank.h"
#include "nccl/unique_id.h"

namespace distckpt {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_text(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
}

std::string nccl_text(ncclResult_t result, ncclComm_t comm = nullptr) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') return fmt::format("{} ({})", ncclGetErrorString(result), last);
  return ncclGetErrorString(result);
}

// Polls with short sleeps: NCCL's non-blocking calls report progress only
// through ncclCommGetAsyncError, and no CUDA call waits with a timeout.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds pause_{10};
};

// The CUDA device this rank uses (NcclOptions::device). Throws CommError
// when no device is visible: without a GPU, NCCL cannot start.
int choose_device(const NcclOptions& options, int rank) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    throw CommError(fmt::format("no CUDA device is visible to rank {} ({}); NCCL needs one GPU per rank", rank,
                                counted != cudaSuccess ? cuda_text(counted) : "cudaGetDeviceCount found 0"));
  }
  int device = options.device;
  if (device < 0) {
    const char* local = std::getenv("LOCAL_RANK");
    device = local != nullptr && *local != '\0' ? std::atoi(local) % count : rank % count;
  }
  if (device >= count) {
    throw UsageError(fmt::format("rank {} was given CUDA device {}, but {} device{} visible", rank, device, count,
                                 count == 1 ? " is" : "s are"));
  }
  const cudaError_t set = cudaSetDevice(device);
  if (set != cudaSuccess) {
    throw CommError(fmt::format("rank {} cannot use CUDA device {}: {}", rank, device, cuda_text(set)));
  }
  return device;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, bool owned, int device, std::shared_ptr<Communicator> bytes,
                   std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), owned_(owned), device_(device), bytes_(std::move(bytes)), timeout_(timeout) {
    // On the communicator's device, which a wrapped one need not share with
    // the caller's current device: an event records only on its own device's streams.
    int current = device_;
    cudaGetDevice(&current);
    cudaSetDevice(device_);
    const cudaError_t made = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    cudaSetDevice(current);
    if (made != cudaSuccess) {
      release();
      throw CommError(fmt::format("rank {}: cannot create a CUDA event: {}", bytes_->rank(), cuda_text(made)));
    }
  }

  ~NcclCommunicator() override {
    if (done_ != nullptr) cudaEventDestroy(done_);
    release();
  }

  int rank() const override { return bytes_->rank(); }
  int size() const override { return bytes_->size(); }
  std::string backend() const override { return "nccl"; }
  std::optional<std::chrono::milliseconds> timeout() const override { return timeout_; }
  at::Device tensor_device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)); }

  std::vector<std::string> all_gather_bytes(std::string_view local) override { return bytes_->all_gather_bytes(local); }
  std::string broadcast_bytes(std::string_view data, int root) override { return bytes_->broadcast_bytes(data, root); }
  std::vector<std::string> gather_bytes(std::string_view local, int root) override {
    return bytes_->gather_bytes(local, root);
  }
  std::string scatter_bytes(const std::vector<std::string>& parts, int root) override {
    return bytes_->scatter_bytes(parts, root);
  }
  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) override {
    return bytes_->all_to_all_bytes(parts);
  }
  void barrier() override { bytes_->barrier(); }

  void broadcast_tensor(at::Tensor& tensor, int root) override {
    const std::string what = fmt::format("broadcast_tensor from rank {}", root);
    check_rank(root, what);
    at::Tensor dense = checked(tensor, what).contiguous();
    run(what, [&] {
      return ncclBroadcast(dense.data_ptr(), dense.data_ptr(), dense.nbytes(), ncclUint8, root, comm_, stream_);
    });
    if (!dense.is_same(tensor)) tensor.copy_(dense);
  }

  void send_tensor(const at::Tensor& tensor, int dst, int tag) override {
    exchange_tensors({PeerTensor{tensor, dst, tag}}, {});
  }

  void recv_tensor(at::Tensor& tensor, int src, int tag) override {
    std::vector<PeerTensor> recvs{PeerTensor{tensor, src, tag}};
    exchange_tensors({}, recvs);
  }

  // One NCCL group: NCCL pairs the sends and receives between two ranks in
  // the order each posted them, which is the order of the lists.
  void exchange_tensors(const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs) override {
    if (sends.empty() && recvs.empty()) return;  // every rank calls this for every window, most of them empty here
    const std::string what = fmt::format("exchange of {} send{} and {} receive{}", sends.size(),
                                         sends.size() == 1 ? "" : "s", recvs.size(), recvs.size() == 1 ? "" : "s");
    std::vector<at::Tensor> send_dense, recv_dense;
    for (const PeerTensor& s : sends) {
      check_peer(s.peer, what);
      send_dense.push_back(checked(s.tensor, what).contiguous());
    }
    for (const PeerTensor& r : recvs) {
      check_peer(r.peer, what);
      recv_dense.push_back(checked(r.tensor, what).contiguous());
    }
    run(what, [&] {
      ncclResult_t result = ncclGroupStart();
      for (size_t i = 0; i < sends.size() && result == ncclSuccess; ++i) {
        result = ncclSend(send_dense[i].data_ptr(), send_dense[i].nbytes(), ncclUint8, sends[i].peer, comm_, stream_);
      }
      for (size_t i = 0; i < recvs.size() && (result == ncclSuccess || result == ncclInProgress); ++i) {
        result = ncclRecv(recv_dense[i].data_ptr(), recv_dense[i].nbytes(), ncclUint8, recvs[i].peer, comm_, stream_);
      }
      const ncclResult_t ended = ncclGroupEnd();
      return result == ncclSuccess || result == ncclInProgress ? ended : result;
    });
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!recv_dense[i].is_same(recvs[i].tensor)) const_cast<at::Tensor&>(recvs[i].tensor).copy_(recv_dense[i]);
    }
  }

 private:
  // Enqueues NCCL work on our stream after the caller's pending work on the
  // tensors, then waits for it under the watchdog.
  template <typename Enqueue>
  void run(const std::string& what, Enqueue&& enqueue) {
    if (aborted_) {
      throw CommError(fmt::format("{} on rank {}: the NCCL communicator was aborted earlier ({}); create a new one",
                                  what, rank(), aborted_because_));
    }
    // Our stream waits for what the caller's current stream has queued (the
    // kernels that produced these tensors); the CPU does not.
    DeviceEvent produced(tensor_device());
    produced.record(current_stream(tensor_device()));
    check_cuda(what, cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(produced.native()), 0));
    const auto deadline = Clock::now() + timeout_;
    const ncclResult_t posted = enqueue();
    if (posted != ncclSuccess && posted != ncclInProgress) fail(what, nccl_text(posted, comm_));
    if (posted == ncclInProgress) settle(what, deadline);
    check_cuda(what, cudaEventRecord(done_, stream_));
    wait(what, deadline);
  }

  // A non-blocking communicator may return from a call (ncclGroupEnd above
  // all) before its work is on the stream: until its state leaves
  // ncclInProgress, an event recorded on the stream would not follow that
  // work, and no other NCCL call may be made on it.
  void settle(const std::string& what, Clock::time_point deadline) {
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
      if (asked != ncclSuccess) fail(what, nccl_text(asked, comm_));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, nccl_text(state, comm_));
      if (Clock::now() > deadline) fail(what, timed_out());
      backoff.pause();
    }
  }

  std::string timed_out() const {
    return fmt::format(
        "timed out after {} ms: another rank did not take part in time; a peer rank is "
        "probably hung or dead (raise NcclOptions::timeout if it is only slow)",
        timeout_.count());
  }

  // The watchdog: NCCL or CUDA errors and the timeout abort the communicator,
  // so this rank never hangs on a peer that is gone.
  void wait(const std::string& what, Clock::time_point deadline) {
    Backoff backoff;
    for (;;) {
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) fail(what, cuda_text(state));
      ncclResult_t async = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &async);
      if (asked != ncclSuccess) fail(what, nccl_text(asked, comm_));
      if (async != ncclSuccess && async != ncclInProgress) fail(what, nccl_text(async, comm_));
      if (Clock::now() > deadline) fail(what, timed_out());
      backoff.pause();
    }
  }

  [[noreturn]] void fail(const std::string& what, const std::string& cause) {
    aborted_ = true;
    aborted_because_ = fmt::format("{}: {}", what, cause);
    ncclCommAbort(comm_);  // unblocks our stream; the communicator is gone
    comm_ = nullptr;
    throw CommError(fmt::format("{} failed on rank {} of {} (nccl backend): {}; the NCCL communicator was aborted",
                                what, rank(), size(), cause));
  }

  void check_cuda(const std::string& what, cudaError_t error) {
    if (error != cudaSuccess) fail(what, cuda_text(error));
  }

  at::Tensor checked(const at::Tensor& tensor, const std::string& what) const {
    if (!tensor.defined()) throw CommError(fmt::format("{} on rank {}: the tensor is undefined", what, rank()));
    if (tensor.device() != tensor_device()) {
      throw CommError(
          fmt::format("{} on rank {}: the nccl backend moves tensors on {} only, got one on {}; move it "
                      "to this rank's GPU first",
                      what, rank(), tensor_device().str(), tensor.device().str()));
    }
    return tensor;
  }

  void check_rank(int peer, const std::string& what) const {
    if (peer < 0 || peer >= size()) {
      throw CommError(
          fmt::format("{} on rank {}: rank {} is outside the group of {} ranks", what, rank(), peer, size()));
    }
  }

  void check_peer(int peer, const std::string& what) const {
    check_rank(peer, what);
    if (peer == rank()) {
      throw CommError(
          fmt::format("{} on rank {}: a rank cannot exchange tensors with itself; copy locally instead", what, rank()));
    }
  }

  void release() {
    if (!owned_) return;
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    stream_ = nullptr;
    comm_ = nullptr;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  bool owned_;
  int device_;
  std::shared_ptr<Communicator> bytes_;
  std::chrono::milliseconds timeout_;
  cudaEvent_t done_ = nullptr;
  bool aborted_ = false;
  std::string aborted_because_;
};

void check_bytes(const std::shared_ptr<Communicator>& bytes, const char* function) {
  if (!bytes) throw UsageError(fmt::format("{}: the CPU communicator for bytes is null", function));
  if (bytes->backend() == "nccl") {
    throw UsageError(
        fmt::format("{}: bytes need a CPU communicator (e.g. Gloo from communicator_from_store), not a "
                    "NCCL one",
                    function));
  }
}

// Non-blocking creation under the watchdog: a rank that never joins makes
// the others abort at the timeout instead of waiting inside NCCL forever.
ncclComm_t init_rank(const ncclUniqueId& id, int rank, int size, std::chrono::milliseconds timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = Clock::now() + timeout;
  Backoff backoff;
  while (result == ncclInProgress && comm != nullptr) {
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
    if (result != ncclInProgress) break;
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      throw CommError(
          fmt::format("NCCL communicator creation timed out after {} ms on rank {} of {}: another rank "
                      "did not join; check that every rank started",
                      timeout.count(), rank, size));
    }
    backoff.pause();
  }
  if (result != ncclSuccess) {
    const std::string cause = nccl_text(result, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    throw CommError(fmt::format("ncclCommInitRankConfig failed on rank {} of {}: {}", rank, size, cause));
  }
  return comm;
}

}  // namespace

std::shared_ptr<Communicator> nccl_communicator_from_store(const c10::intrusive_ptr<c10d::Store>& store,
                                                           std::shared_ptr<Communicator> bytes,
                                                           const NcclOptions& options) {
  check_bytes(bytes, "nccl_communicator_from_store");
  if (!store) throw UsageError("nccl_communicator_from_store: the store is null");
  Communicator& cpu = *bytes;
  const int rank = cpu.rank(), size = cpu.size();
  const std::string key = nccl::next_unique_id_key();
  // Each step is agreed over the CPU communicator: a rank without a GPU fails
  // every rank at once, with its cause, instead of leaving them in NCCL.
  int device = -1;
  std::string gpu;
  run_agreed(cpu, "choose a CUDA device for NCCL", [&] {
    device = choose_device(options, rank);
    gpu = nccl::gpu_identity(device);
  });
  // Every rank sees the same identities, so every rank fails here or none does.
  const std::string shared = nccl::shared_gpu_error(cpu.all_gather_bytes(gpu));
  if (!shared.empty()) throw CommError(shared);
  ncclUniqueId id{};
  run_agreed(cpu, "share the NCCL unique id", [&] { id = nccl::share_unique_id(*store, key, rank, options.timeout); });
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  try {
    // A rank whose part was made aborts it when another rank's failed.
    run_agreed(cpu, "create the NCCL communicator", [&] { comm = init_rank(id, rank, size, options.timeout); });
    run_agreed(cpu, "create the NCCL stream", [&] {
      const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      if (made != cudaSuccess) throw CommError(fmt::format("cudaStreamCreateWithFlags: {}", cuda_text(made)));
    });
  } catch (...) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (comm != nullptr) ncclCommAbort(comm);  // not Destroy: that may wait for peers that are gone
    throw;
  }
  return std::make_shared<NcclCommunicator>(comm, stream, /*owned=*/true, device, std::move(bytes), options.timeout);
}

std::shared_ptr<Communicator> nccl_communicator_wrap(ncclComm_t comm, cudaStream_t stream,
                                                     std::shared_ptr<Communicator> bytes, const NcclOptions& options) {
  check_bytes(bytes, "nccl_communicator_wrap");
  if (comm == nullptr) throw UsageError("nccl_communicator_wrap: the NCCL communicator is null");
  int count = 0, rank = 0, device = 0;
  ncclResult_t asked = ncclCommCount(comm, &count);
  if (asked == ncclSuccess) asked = ncclCommUserRank(comm, &rank);
  if (asked == ncclSuccess) asked = ncclCommCuDevice(comm, &device);
  if (asked != ncclSuccess) {
    throw CommError(
        fmt::format("nccl_communicator_wrap: the NCCL communicator cannot be queried: {}", nccl_text(asked, comm)));
  }
  if (count != bytes->size() || rank != bytes->rank()) {
    throw UsageError(
        fmt::format("nccl_communicator_wrap: the NCCL communicator is rank {} of {}, the CPU one rank {} "
                    "of {}; both must span the same ranks in the same order",
                    rank, count, bytes->rank(), bytes->size()));
  }
  return std::make_shared<NcclCommunicator>(comm, stream, /*owned=*/false, device, std::move(bytes), options.timeout);
}

int nccl_build_version() { return NCCL_VERSION_CODE; }

int nccl_runtime_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

}  // namespace distckpt
