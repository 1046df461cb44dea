// The NCCL communicator where no GPU is needed (the build and link, the
// unique-id exchange through a real TCPStore, every failure path of
// creation), and a NCCL world of one saving and loading CUDA tensors where
// a GPU is visible.
#include "distckpt/nccl/nccl_communicator.h"

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "distckpt/distckpt.h"
#include "nccl/gpu_per_rank.h"
#include "nccl/unique_id.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using std::chrono::milliseconds;

bool gpu_visible() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A TCPStore server on a free loopback port and `clients` clients of it.
struct TcpStores {
  c10::intrusive_ptr<c10d::TCPStore> server;
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> clients;

  explicit TcpStores(int clients_count, milliseconds timeout = milliseconds(20000)) {
    c10d::TCPStoreOptions options;
    options.port = 0;  // the kernel picks a free one
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = timeout;
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    options.isServer = false;
    options.port = server->getPort();
    for (int i = 0; i < clients_count; ++i)
      clients.push_back(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options));
  }
  c10::intrusive_ptr<c10d::Store> of_rank(int rank) const {
    return rank == 0 ? c10::intrusive_ptr<c10d::Store>(server)
                     : c10::intrusive_ptr<c10d::Store>(clients[static_cast<size_t>(rank - 1)]);
  }
};

// Runs `body(rank)` on `world` threads and returns what each threw ("" if nothing).
std::vector<std::string> errors_of_ranks(int world, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const CommError& e) {
        errors[static_cast<size_t>(rank)] = std::string("CommError: ") + e.what();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = std::string("other: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(NcclBuild, LinksTheNcclItWasCompiledAgainst) {
  // The configure/link check: the library found at configure time is the one
  // loaded, and it answers without a GPU.
  EXPECT_GE(nccl_build_version(), 20000);
  EXPECT_EQ(nccl_runtime_version(), nccl_build_version());
}

TEST(NcclUniqueId, ReachesEveryRankThroughATcpStore) {
  constexpr int kWorld = 3;
  TcpStores stores(kWorld - 1);
  const std::string key = nccl::next_unique_id_key();
  std::vector<ncclUniqueId> ids(kWorld);
  const auto errors = errors_of_ranks(kWorld, [&](int rank) {
    ids[static_cast<size_t>(rank)] = nccl::share_unique_id(*stores.of_rank(rank), key, rank, milliseconds(20000));
  });
  for (int rank = 0; rank < kWorld; ++rank) ASSERT_EQ(errors[static_cast<size_t>(rank)], "") << "rank " << rank;
  const ncclUniqueId zero{};
  EXPECT_NE(std::memcmp(ids[0].internal, zero.internal, sizeof zero.internal), 0) << "rank 0 made no id";
  for (int rank = 1; rank < kWorld; ++rank) {
    EXPECT_EQ(std::memcmp(ids[static_cast<size_t>(rank)].internal, ids[0].internal, sizeof zero.internal), 0)
        << "rank " << rank << " got another id than rank 0 made";
  }
}

TEST(NcclUniqueId, KeysDifferPerCommunicator) { EXPECT_NE(nccl::next_unique_id_key(), nccl::next_unique_id_key()); }

TEST(NcclUniqueId, RankZeroThatNeverCameIsATimeoutNamingTheKey) {
  TcpStores stores(1);
  const std::string key = nccl::next_unique_id_key();
  EXPECT_TRUE(
      throws_with<CommError>([&] { nccl::share_unique_id(*stores.clients[0], key, 1, milliseconds(300)); },
                             "rank 1 did not receive the NCCL unique id from rank 0 (store key '" + key + "')"));
}

TEST(NcclUniqueId, RankZerosErrorReachesTheOthersAtOnce) {
  TcpStores stores(1);
  const std::string key = nccl::next_unique_id_key();
  const std::string error = "EncclGetUniqueId failed on rank 0: no socket interface found";  // tag 'E', then the text
  stores.server->set(key, std::vector<uint8_t>(error.begin(), error.end()));
  EXPECT_TRUE(throws_with<CommError>([&] { nccl::share_unique_id(*stores.clients[0], key, 1, milliseconds(20000)); },
                                     "rank 1: ncclGetUniqueId failed on rank 0: no socket interface found"));
}

TEST(NcclUniqueId, ForeignValueUnderTheKeyIsRejected) {
  TcpStores stores(1);
  const std::string key = nccl::next_unique_id_key();
  stores.server->set(key, std::vector<uint8_t>{'I', 1, 2, 3});
  EXPECT_TRUE(throws_with<CommError>([&] { nccl::share_unique_id(*stores.clients[0], key, 1, milliseconds(20000)); },
                                     "holds 4 bytes, not a NCCL unique id"));
}

// Creation over a real TCPStore and Gloo: without a GPU every rank fails at
// once with the cause; with one GPU (the lent machines) two ranks cannot
// share it in NCCL, and every rank fails too.
TEST(NcclCommunicator, CreationFailsOnEveryRankWithTheCause) {
  constexpr int kWorld = 2;
  TcpStores stores(kWorld - 1);
  ProcessGroupOptions gloo;
  gloo.gloo_hostname = "127.0.0.1";
  gloo.timeout = std::chrono::seconds(30);
  NcclOptions options;
  options.timeout = std::chrono::seconds(20);
  if (gpu_visible()) options.device = 0;  // both ranks on one GPU, however many there are
  const auto started = std::chrono::steady_clock::now();
  const auto errors = errors_of_ranks(kWorld, [&](int rank) {
    auto store = stores.of_rank(rank);
    auto bytes = communicator_from_store(c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, kWorld, gloo);
    nccl_communicator_from_store(store, bytes, options);
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::string& error = errors[static_cast<size_t>(rank)];
    EXPECT_EQ(error.rfind("CommError: ", 0), 0u) << "rank " << rank << ": " << error;
    // Without a GPU each rank failed itself and raises its own cause (a rank
    // that did not fail would raise a CommError naming the ranks that did);
    // with one GPU both ranks chose it and every rank names the two.
    const std::string cause =
        gpu_visible() ? "ranks 0 and 1 both use the GPU " : "no CUDA device is visible to rank " + std::to_string(rank);
    EXPECT_NE(error.find(cause), std::string::npos) << error;
    EXPECT_NE(error.find("NCCL needs one GPU per rank"), std::string::npos) << error;
  }
  // Not a timing assertion on speed: a hang would be the whole timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
}

TEST(NcclGpuPerRank, TwoRanksOnOneGpuAreNamedWithWhatToChange) {
  const std::string a = "GPU-0a1b2c3d-0000-0000-0000-000000000001", b = "GPU-0a1b2c3d-0000-0000-0000-000000000002";
  // Same host names and bus ids on two nodes are different GPUs; the UUID decides.
  EXPECT_EQ(nccl::shared_gpu_error({a + "|node, PCI 0000:18:00.0", b + "|node, PCI 0000:18:00.0"}), "");
  EXPECT_EQ(nccl::shared_gpu_error({}), "");
  const std::string error = nccl::shared_gpu_error(
      {a + "|node1, PCI 0000:18:00.0", b + "|node1, PCI 0000:2A:00.0", b + "|node1, PCI 0000:2A:00.0", a + "|x"});
  EXPECT_NE(error.find("ranks 1 and 2 both use the GPU " + b + " (rank 1: node1, PCI 0000:2A:00.0; rank 2: node1"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << error;
}

TEST(NcclCommunicator, RejectsMissingOrWrongParts) {
  auto single = make_single_process_communicator();
  EXPECT_TRUE(throws_with<UsageError>([&] { nccl_communicator_wrap(nullptr, nullptr, single); },
                                      "nccl_communicator_wrap: the NCCL communicator is null"));
  EXPECT_TRUE(throws_with<UsageError>([&] { nccl_communicator_wrap(nullptr, nullptr, nullptr); },
                                      "the CPU communicator for bytes is null"));
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_TRUE(throws_with<UsageError>([&] { nccl_communicator_from_store(c10::intrusive_ptr<c10d::Store>(), single); },
                                      "the store is null"));
  EXPECT_TRUE(throws_with<UsageError>([&] { nccl_communicator_from_store(store, nullptr); },
                                      "the CPU communicator for bytes is null"));
}

// What no machine here can run: everything past creation needs a GPU and a
// CUDA build of LibTorch (scripts/gpu-check.sh runs it on one).
TEST(NcclGpu, WorldOfOneSavesAndLoadsCudaTensors) {
  if (!gpu_visible() || !torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a visible GPU and a CUDA build of LibTorch";
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto comm = nccl_communicator_from_store(store, make_single_process_communicator());
  EXPECT_EQ(comm->backend(), "nccl");
  const at::Tensor values = at::arange(0, 1 << 20, at::kFloat).view({1024, 1024});
  StateDict sd;
  sd["w"] = Value(ShardedTensor::from_rank_offsets("w", values.cuda(), {}));
  TempDir dir("nccl-world-of-one");
  save(sd, dir.file("ckpt"), *comm);
  StateDict request;
  request["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({1024, 1024}, at::kFloat).cuda(), {}));
  LoadResult loaded = load(request, dir.file("ckpt"), *comm);
  const at::Tensor back = loaded.state_dict.at("w").as_tensor();
  EXPECT_TRUE(back.is_cuda());
  EXPECT_TRUE(at::equal(back.cpu(), values));
  at::Tensor sent = values.cuda();
  comm->broadcast_tensor(sent, 0);
  EXPECT_TRUE(at::equal(sent.cpu(), values));
}

}  // namespace
}  // namespace distckpt
