// The comm layer: the single-process communicator, Gloo collectives over
// ranks-as-threads (exact bytes and tensors), communicator construction, and
// the launch environment.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/comm/process_group.h"
#include "distckpt/core/errors.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr auto kTimeout = std::chrono::seconds(30);

// Bytes that differ by rank and position, including zero bytes.
std::string pattern(int rank, size_t length) {
  std::string bytes(length, '\0');
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<char>((i * 31 + rank * 7) % 256);
  return bytes;
}

// Rank r's payload: empty, tiny, ~1 MB, and with embedded zeros.
std::string payload_of(int rank) {
  switch (rank) {
    case 0:
      return "";
    case 1:
      return "a";
    case 2:
      return pattern(2, (1 << 20) + 3);
    default:
      return std::string("\0x\0", 3) + pattern(rank, 100);
  }
}

TEST(CommSingleProcessTest, EveryCollectiveIsTheIdentity) {
  auto comm = make_single_process_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_TRUE(comm->is_coordinator());
  EXPECT_EQ(comm->backend(), "single");
  EXPECT_EQ(comm->all_gather_bytes("abc"), std::vector<std::string>{"abc"});
  EXPECT_EQ(comm->broadcast_bytes(std::string("x\0y", 3), 0), std::string("x\0y", 3));
  EXPECT_EQ(comm->gather_bytes("", 0), std::vector<std::string>{""});
  EXPECT_EQ(comm->all_to_all_bytes({"self"}), std::vector<std::string>{"self"});
  comm->barrier();
  at::Tensor t = at::arange(6, at::kFloat);
  comm->broadcast_tensor(t, 0);
  EXPECT_TRUE(t.equal(at::arange(6, at::kFloat)));
}

TEST(CommSingleProcessTest, RejectsOtherRanks) {
  auto comm = make_single_process_communicator();
  EXPECT_THROW(comm->broadcast_bytes("x", 1), CommError);
  EXPECT_THROW(comm->gather_bytes("x", 2), CommError);
  at::Tensor t = at::zeros({2});
  try {
    comm->send_tensor(t, 1, 0);
    FAIL() << "send_tensor to a missing rank must throw";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1"));
  }
  EXPECT_THROW(comm->recv_tensor(t, 1, 0), CommError);
}

TEST(CommGlooTest, AllGatherBytesOfDifferentSizes) {
  run_ranks(4, [](Communicator& comm) {
    EXPECT_EQ(comm.size(), 4);
    EXPECT_EQ(comm.backend(), "gloo");
    const std::vector<std::string> all = comm.all_gather_bytes(payload_of(comm.rank()));
    ASSERT_EQ(all.size(), 4u);
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(all[r] == payload_of(r)) << "payload of rank " << r;
  });
}

TEST(CommGlooTest, AllGatherBytesWhenEveryRankIsEmpty) {
  run_ranks(4, [](Communicator& comm) {
    EXPECT_EQ(comm.all_gather_bytes(""), std::vector<std::string>(4));
    // The group still works after the short path.
    EXPECT_EQ(comm.all_gather_bytes(std::to_string(comm.rank())), (std::vector<std::string>{"0", "1", "2", "3"}));
  });
}

TEST(CommGlooTest, BroadcastBytesFromANonZeroRoot) {
  const std::string message = pattern(9, 70000);
  run_ranks(4, [&](Communicator& comm) {
    const std::string mine = comm.rank() == 2 ? message : "ignored on non-roots";
    EXPECT_TRUE(comm.broadcast_bytes(mine, 2) == message);
    EXPECT_EQ(comm.broadcast_bytes(comm.rank() == 1 ? "" : "not sent", 1), "");
  });
}

TEST(CommGlooTest, GatherBytesOnlyOnTheRoot) {
  run_ranks(4, [](Communicator& comm) {
    const std::vector<std::string> gathered = comm.gather_bytes(payload_of(comm.rank()), 3);
    if (comm.rank() == 3) {
      ASSERT_EQ(gathered.size(), 4u);
      for (int r = 0; r < 4; ++r) EXPECT_TRUE(gathered[r] == payload_of(r)) << "rank " << r;
    } else {
      EXPECT_TRUE(gathered.empty());
    }
    const std::vector<std::string> empties = comm.gather_bytes("", 0);
    EXPECT_EQ(empties, comm.rank() == 0 ? std::vector<std::string>(4) : std::vector<std::string>{});
  });
}

// Rank `from`'s part for rank `to`: empty for some pairs, ~1 MB for one.
std::string part_of(int from, int to) {
  if ((from + to) % 3 == 0) return "";
  if (from == 2 && to == 1) return pattern(21, (1 << 20) + 5);
  return std::string("\0", 1) + pattern(from * 4 + to, static_cast<size_t>(from * 10 + to));
}

TEST(CommGlooTest, AllToAllBytesOfDifferentSizesIncludingEmptyParts) {
  run_ranks(4, [](Communicator& comm) {
    std::vector<std::string> parts;
    for (int to = 0; to < 4; ++to) parts.push_back(part_of(comm.rank(), to));
    const std::vector<std::string> got = comm.all_to_all_bytes(parts);
    ASSERT_EQ(got.size(), 4u);
    for (int from = 0; from < 4; ++from) EXPECT_TRUE(got[from] == part_of(from, comm.rank())) << "from " << from;
    // Nothing at all to send, then the group still works.
    EXPECT_EQ(comm.all_to_all_bytes(std::vector<std::string>(4)), std::vector<std::string>(4));
    EXPECT_THROW(comm.all_to_all_bytes({"too", "few"}), CommError);
    const std::vector<std::string> ids =
        comm.all_to_all_bytes(std::vector<std::string>(4, std::to_string(comm.rank())));
    EXPECT_EQ(ids, (std::vector<std::string>{"0", "1", "2", "3"}));
  });
}

TEST(CommGlooTest, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  run_ranks(4, [&](Communicator& comm) {
    arrived.fetch_add(1);
    comm.barrier();
    EXPECT_EQ(arrived.load(), 4);
  });
}

TEST(CommGlooTest, BroadcastTensorInPlaceIncludingStridedViews) {
  run_ranks(4, [](Communicator& comm) {
    const at::Tensor expected = at::arange(12, at::kDouble).reshape({3, 4});
    at::Tensor tensor = comm.rank() == 1 ? expected.clone() : at::zeros({3, 4}, at::kDouble);
    comm.broadcast_tensor(tensor, 1);
    EXPECT_TRUE(tensor.equal(expected));

    // A transposed view is not contiguous: the result must land in its storage.
    at::Tensor base = comm.rank() == 0 ? expected.clone() : at::zeros({3, 4}, at::kDouble);
    at::Tensor view = base.t();
    comm.broadcast_tensor(view, 0);
    EXPECT_TRUE(base.equal(expected));
  });
}

TEST(CommGlooTest, SendRecvAroundARing) {
  run_ranks(4, [](Communicator& comm) {
    const int next = (comm.rank() + 1) % 4;
    const int prev = (comm.rank() + 3) % 4;
    const at::Tensor outgoing = at::full({5}, comm.rank() * 10, at::kInt);
    at::Tensor incoming = at::zeros({5}, at::kInt);
    // Even ranks send first, odd ranks receive first: no rank waits on itself.
    if (comm.rank() % 2 == 0) {
      comm.send_tensor(outgoing, next, 7);
      comm.recv_tensor(incoming, prev, 7);
    } else {
      comm.recv_tensor(incoming, prev, 7);
      comm.send_tensor(outgoing, next, 7);
    }
    EXPECT_TRUE(incoming.equal(at::full({5}, prev * 10, at::kInt)));
  });
}

TEST(CommGlooTest, ExchangeTensorsPostsEverySendAndReceiveAtOnce) {
  // Every rank sends two tensors to every other rank and receives theirs,
  // all in one batch: with blocking sends in this order every rank would
  // wait on its first peer. Receives land in place, strided ones included.
  constexpr int kWorld = 3;
  run_ranks(kWorld, [](Communicator& comm) {
    const int me = comm.rank();
    std::vector<PeerTensor> sends, recvs;
    std::vector<at::Tensor> whole;  // receivers' backing tensors (the strided landings are views of them)
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == me) continue;
      for (int k = 0; k < 2; ++k) {
        sends.push_back(PeerTensor{at::full({4}, me * 100 + peer * 10 + k, at::kLong), peer, me * 10 + k});
        whole.push_back(at::zeros({4, 2}, at::kLong));
        recvs.push_back(PeerTensor{whole.back().select(1, k), peer, peer * 10 + k});
      }
    }
    comm.exchange_tensors(sends, recvs);
    size_t i = 0;
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == me) continue;
      for (int k = 0; k < 2; ++k, ++i) {
        EXPECT_TRUE(whole[i].select(1, k).equal(at::full({4}, peer * 100 + me * 10 + k, at::kLong)))
            << "rank " << me << " from " << peer << " #" << k << ": " << whole[i];
        EXPECT_TRUE(whole[i].select(1, 1 - k).equal(at::zeros({4}, at::kLong))) << "the other column is untouched";
      }
    }
    EXPECT_NO_THROW(comm.exchange_tensors({}, {}));
  });
}

TEST(CommSingleProcessTest, ExchangeTensorsHasNoPeers) {
  auto comm = make_single_process_communicator();
  EXPECT_NO_THROW(comm->exchange_tensors({}, {}));
  EXPECT_THROW(comm->exchange_tensors({PeerTensor{at::zeros({1}), 1, 0}}, {}), CommError);
}

TEST(CommGlooTest, InvalidRanksAreCommErrorsNamingTheRank) {
  run_ranks(2, [](Communicator& comm) {
    try {
      comm.broadcast_bytes("x", 5);
      ADD_FAILURE() << "root 5 in a group of 2 must throw";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("root rank 5"));
    }
    at::Tensor t = at::zeros({1});
    EXPECT_THROW(comm.send_tensor(t, comm.rank(), 0), CommError);
  });
}

TEST(CommGlooTest, RunRanksRethrowsTheLowestFailingRank) {
  try {
    run_ranks(3, [](Communicator& comm) {
      if (comm.rank() > 0) throw std::runtime_error("boom on rank " + std::to_string(comm.rank()));
    });
    FAIL() << "run_ranks must rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on rank 1");
  }
}

TEST(CommGlooTest, APeerThatLeftIsACommErrorNotAHang) {
  // Rank 1 fails before the collective; rank 0 must get a CommError (peer
  // gone or timed out), and run_ranks rethrows rank 0's error first.
  try {
    run_ranks(
        2,
        [](Communicator& comm) {
          if (comm.rank() == 1) throw std::runtime_error("rank 1 gave up");
          comm.all_gather_bytes("never matched");
        },
        std::chrono::seconds(3));
    FAIL() << "rank 0 must fail";
  } catch (const CommError& e) {
    // Gone (connection closed) or silent until the timeout, depending on Gloo.
    EXPECT_THAT(e.what(), ContainsRegex("all_gather_bytes (failed|timed out after 3 s) on rank 0 of 2"));
  }
}

TEST(CommGlooTest, ATimeoutSaysWhichOperationAfterHowLongAndWhatToDo) {
  // Rank 1 keeps away from the collective for longer than the timeout.
  try {
    run_ranks(
        2,
        [](Communicator& comm) {
          if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          comm.broadcast_bytes("late", 0);
        },
        std::chrono::seconds(1));
    FAIL() << "rank 0 must time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("broadcast_bytes (size) timed out after 1 s on rank 0 of 2 (gloo backend)"));
    EXPECT_THAT(e.what(), HasSubstr("a peer rank is probably hung (stopped, deadlocked, stuck in I/O) or dead"));
    EXPECT_THAT(e.what(), HasSubstr("raise the timeout (DISTCKPT_TIMEOUT_SECONDS or ProcessGroupOptions::timeout)"));
    EXPECT_THAT(e.what(), HasSubstr("Cause: "));
  }
}

TEST(CommGlooTest, UnavailableBackendsAreRejected) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ProcessGroupOptions options;
  options.backend = "mpi";
  EXPECT_THROW(communicator_from_store(store, 0, 1, options), UsageError);
#ifndef DISTCKPT_C10D_NCCL
  options.backend = "nccl";
  try {
    communicator_from_store(store, 0, 1, options);
    FAIL() << "nccl must be rejected on a build without NCCL";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("without NCCL"));
  }
#endif
  options.backend = "gloo";
  EXPECT_THROW(communicator_from_store(store, 3, 2, options), UsageError);
}

#if TORCH_VERSION_MAJOR < 2
// In LibTorch 1.x a Gloo group is itself a c10d::ProcessGroup, so the test can
// build the caller's group directly (2.x wraps backends in a ProcessGroup).
TEST(CommGlooTest, WrapsACallersProcessGroup) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::vector<std::string>> gathered(2);
  // Kept until both threads are done, so neither closes its connections early.
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> groups(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto options = c10d::ProcessGroupGloo::Options::create(kTimeout);
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        groups[rank] = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, options);
        auto comm = communicator_from_process_group(groups[rank]);
        EXPECT_EQ(comm->backend(), "gloo");
        gathered[rank] = comm->all_gather_bytes(std::string(rank + 1, 'r'));
        const std::vector<std::string> back = comm->all_to_all_bytes({"to0-" + std::to_string(rank), "to1"});
        EXPECT_EQ(back[0], rank == 0 ? "to0-0" : "to1");
        EXPECT_EQ(back[1], rank == 0 ? "to0-1" : "to1");
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(gathered[rank], (std::vector<std::string>{"r", "rr"})) << "on rank " << rank;
  }
}
#endif

// --- launch environment ------------------------------------------------------

// Variable name -> value, or nullopt to unset it.
using EnvValues = std::map<std::string, std::optional<std::string>>;

// Sets (or unsets) variables for one test and restores them.
class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvValues& values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  EnvValues saved_;
};

EnvValues launch_vars(std::optional<std::string> rank, std::optional<std::string> world,
                      std::optional<std::string> port) {
  return {{"RANK", rank},
          {"WORLD_SIZE", world},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", port},
          {"LOCAL_RANK", std::nullopt}};
}

std::string launch_env_error() {
  try {
    read_launch_env();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CommLaunchEnvTest, ReadsTorchrunVariables) {
  ScopedEnv env(launch_vars("3", "8", "29500"));
  const LaunchEnv launch = read_launch_env();
  EXPECT_EQ(launch.rank, 3);
  EXPECT_EQ(launch.world_size, 8);
  EXPECT_EQ(launch.local_rank, 0);  // LOCAL_RANK is optional
  EXPECT_EQ(launch.master_addr, "10.0.0.1");
  EXPECT_EQ(launch.master_port, 29500);
  ScopedEnv local(EnvValues{{"LOCAL_RANK", "1"}});
  EXPECT_EQ(read_launch_env().local_rank, 1);
}

TEST(CommLaunchEnvTest, NamesEveryMissingVariableAndHowToSetThem) {
  ScopedEnv env(EnvValues{
      {"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", std::nullopt}});
  const std::string message = launch_env_error();
  EXPECT_THAT(message, HasSubstr("RANK, WORLD_SIZE, MASTER_PORT are not set"));
  EXPECT_THAT(message, HasSubstr("distckpt-launch"));
}

TEST(CommLaunchEnvTest, RejectsMalformedValues) {
  {
    ScopedEnv env(launch_vars("abc", "4", "29500"));
    EXPECT_THAT(launch_env_error(), HasSubstr("RANK='abc'"));
  }
  {
    ScopedEnv env(launch_vars("4", "4", "29500"));
    EXPECT_THAT(launch_env_error(), HasSubstr("RANK=4 must be below WORLD_SIZE=4"));
  }
  {
    ScopedEnv env(launch_vars("0", "0", "29500"));
    EXPECT_THAT(launch_env_error(), HasSubstr("WORLD_SIZE='0'"));
  }
  {
    ScopedEnv env(launch_vars("0", "2", "70000"));
    EXPECT_THAT(launch_env_error(), HasSubstr("MASTER_PORT='70000'"));
  }
  {
    ScopedEnv env(launch_vars("1", "2", "29500x"));
    EXPECT_THAT(launch_env_error(), HasSubstr("MASTER_PORT='29500x'"));
  }
}

TEST(CommGlooTest, APointToPointTimeoutSaysSoToo) {
  // The exchange engine moves loads over send/recv: those time out the same way.
  try {
    run_ranks(
        2,
        [](Communicator& comm) {
          at::Tensor t = at::zeros({4});
          if (comm.rank() == 0) {
            comm.recv_tensor(t, 1, 7);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
            comm.send_tensor(t, 0, 7);
          }
        },
        std::chrono::seconds(1));
    FAIL() << "rank 0 must time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("recv_tensor from rank 1 (tag 7) timed out after 1 s on rank 0 of 2"));
    EXPECT_THAT(e.what(), HasSubstr("a peer rank is probably hung"));
  }
}

TEST(CommLaunchEnvTest, ReadsTheTimeoutInIntegerOrDecimalSeconds) {
  ScopedEnv env(launch_vars("0", "2", "29500"));
  {
    ScopedEnv unset(EnvValues{{"DISTCKPT_TIMEOUT_SECONDS", std::nullopt}});
    EXPECT_FALSE(read_launch_env().timeout.has_value());
  }
  for (const auto& [text, ms] : std::map<std::string, int64_t>{{"30", 30000}, {"2.5", 2500}, {"0.001", 1}}) {
    ScopedEnv timeout(EnvValues{{"DISTCKPT_TIMEOUT_SECONDS", text}});
    const std::optional<std::chrono::milliseconds> read = read_launch_env().timeout;
    ASSERT_TRUE(read.has_value()) << text;
    EXPECT_EQ(read->count(), ms) << text;
  }
}

TEST(CommLaunchEnvTest, RejectsTimeoutsThatAreNotPositiveSeconds) {
  ScopedEnv env(launch_vars("0", "2", "29500"));
  for (const char* text : {"0", "-1", "abc", "3s", "1e3", "inf", "nan", "700000"}) {
    ScopedEnv timeout(EnvValues{{"DISTCKPT_TIMEOUT_SECONDS", text}});
    const std::string message = launch_env_error();
    EXPECT_THAT(message, HasSubstr(std::string("DISTCKPT_TIMEOUT_SECONDS='") + text + "' is not a timeout in seconds"));
    EXPECT_THAT(message, HasSubstr("(e.g. 30 or 2.5)"));
  }
}

TEST(CommLaunchEnvTest, CommunicatorFromEnvFailsBeforeConnectingWhenUnset) {
  ScopedEnv env(launch_vars(std::nullopt, "2", "29500"));
  try {
    communicator_from_env();
    FAIL() << "a missing RANK must throw";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("RANK is not set"));
  }
}

// A rank that never calls communicator_from_store: the others fail within
// the timeout, which DISTCKPT_TIMEOUT_SECONDS gives when the options leave
// it unset, naming the missing rank.
TEST(CommLaunchEnvTest, ARankThatNeverArrivesIsNamed) {
  ScopedEnv timeout(EnvValues{{"DISTCKPT_TIMEOUT_SECONDS", "1"}});
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        communicator_from_store(store, rank, 3);  // rank 2 never comes
        errors[static_cast<size_t>(rank)] = "(connected)";
      } catch (const TimeoutError& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = std::string("not a TimeoutError: ") + e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(errors[static_cast<size_t>(rank)],
                HasSubstr(fmt::format("rank {} of 3: only 2 of 3 ranks started within the timeout of 1 s; rank(s) 2 "
                                      "never arrived",
                                      rank)));
  }
}

}  // namespace
}  // namespace distckpt
