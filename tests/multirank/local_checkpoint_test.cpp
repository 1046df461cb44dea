// LocalCheckpointManager over a real Gloo group (ranks as threads, each with
// its own rank directory standing for its node's storage): sync and async
// round trips, completeness, clique replication and recovery after a node
// loss, corrupt replicas, and cleanup only after a newer save is complete.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "distckpt/core/errors.h"
#include "distckpt/local/local_checkpoint_manager.h"
#include "distckpt/save/async.h"
#include "io/file.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// Rows of "w" over the ranks, "bias" replicated everywhere, a per-rank
// object; values depend on the iteration.
StateDict model(int rank, int world, int64_t iteration, bool with_data = true) {
  StateDict sd = Value::dict();
  const double bump = with_data ? static_cast<double>(iteration) : 0.0;
  at::Tensor w = global_tensor("w", {2 * world, 8}).narrow(0, 2 * rank, 2) + bump;
  at::Tensor bias = global_tensor("bias", {8}) + bump;
  sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w : at::zeros_like(w), {{0, rank, world}});
  sd["bias"] = ShardedTensor::from_rank_offsets("bias", with_data ? bias : at::zeros_like(bias), {}, {rank});
  sd["rng"] = ShardedObject{"rng", fmt::format("rng-{}-{}", rank, iteration), {world}, {rank}};
  sd["iteration"] = iteration;
  return sd;
}

// Loads `iteration` (default: the latest) and checks every value bitwise.
LocalRecovery load_and_check(const std::string& root, Communicator& comm, const LocalCheckpointOptions& options,
                             int64_t expected_iteration) {
  LocalCheckpointManager manager(root, comm, options);
  const std::optional<int64_t> latest = manager.find_latest();
  EXPECT_EQ(latest, std::optional<int64_t>(expected_iteration));
  const TensorAwareStateDict tasd = manager.load();
  const int rank = comm.rank(), world = comm.size();
  const LoadResult r = tasd.to_state_dict(model(rank, world, expected_iteration, false), comm);
  const StateDict expected = model(rank, world, expected_iteration);
  EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(), expected.at("w").as_sharded_tensor().data)) << rank;
  EXPECT_TRUE(at::equal(r.state_dict.at("bias").as_tensor(), expected.at("bias").as_sharded_tensor().data)) << rank;
  EXPECT_EQ(r.state_dict.at("rng").as_string(), fmt::format("rng-{}-{}", rank, expected_iteration));
  EXPECT_EQ(r.state_dict.at("iteration").as_int(), expected_iteration);
  return manager.last_recovery();
}

// This rank's state at `iteration`, as a tensor-aware state dict.
TensorAwareStateDict state_at(Communicator& comm, int64_t iteration) {
  return TensorAwareStateDict::from_state_dict(model(comm.rank(), comm.size(), iteration), comm);
}

void save_iteration(const std::string& root, Communicator& comm, const LocalCheckpointOptions& options,
                    int64_t iteration, TensorAwareAlgo algo = TensorAwareAlgo::kFullyParallel) {
  LocalCheckpointManager manager(root, comm, options);
  manager.save(TensorAwareStateDict::from_state_dict(model(comm.rank(), comm.size(), iteration), comm, algo),
               iteration);
}

LocalCheckpointOptions clique(int ranks_per_node, int factor) {
  LocalCheckpointOptions options;
  options.replication = CliqueReplication{ranks_per_node, factor};
  options.transfer_slab_bytes = 200;  // files travel in many slabs
  return options;
}

std::string file_of(const std::string& root, int holder, int64_t iteration, int owner) {
  return fmt::format("{}/rank_{}/iter_{}_owner_{}.dcl", root, holder, iteration, owner);
}

TEST(CliqueReplication, GroupsRanksWithTheSameLocalIndexOnOtherNodes) {
  const CliqueReplication c{2, 2};
  EXPECT_EQ(c.clique_of(0, 8), (std::vector<int>{0, 2}));
  EXPECT_EQ(c.clique_of(3, 8), (std::vector<int>{1, 3}));
  EXPECT_EQ(c.clique_of(5, 8), (std::vector<int>{5, 7}));
  EXPECT_EQ((CliqueReplication{2, 3}.clique_of(4, 6)), (std::vector<int>{0, 2, 4}));
  EXPECT_TRUE(throws_with<UsageError>([&] { c.clique_of(0, 6); }, "does not split into groups"));
}

TEST(LocalCheckpoint, SyncAndAsyncRoundTripsAndRestart) {
  TempDir tmp("local-roundtrip");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    EXPECT_EQ(manager.find_latest(), std::nullopt);
    manager.save(TensorAwareStateDict::from_state_dict(model(comm.rank(), 4, 10), comm), 10);
    AsyncCallsQueue queue(comm);
    StateDict sd = model(comm.rank(), 4, 20);
    manager.save_async(TensorAwareStateDict::from_state_dict(sd, comm, TensorAwareAlgo::kFullyParallel), 20, queue);
    sd.at("w").as_sharded_tensor().data.fill_(-1);  // staged: the checkpoint keeps iteration 20's values
    queue.close();
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{20}));  // 10 removed once 20 was complete
  });
  // A restart: new managers find and load what is on disk.
  run_ranks(4, [&](Communicator& comm) {
    EXPECT_TRUE(load_and_check(tmp.path(), comm, options, 20).recovered_ranks.empty());
  });
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 0, 20, 2)));   // rank 0 holds rank 2's replica
  EXPECT_FALSE(io::exists(file_of(tmp.path(), 0, 20, 1)));  // but not rank 1's (another clique)
}

TEST(LocalCheckpoint, WithoutReplicationALostFileMeansNoCompleteIteration) {
  TempDir tmp("local-noreplica");
  run_ranks(4, [&](Communicator& comm) { save_iteration(tmp.path(), comm, {}, 5); });
  std::filesystem::remove(file_of(tmp.path(), 2, 5, 2));
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm);
    EXPECT_EQ(manager.find_latest(), std::nullopt);
    EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.load(); }, "load the global checkpoint instead"));
  });
}

TEST(LocalCheckpoint, ReplicaRecoversADeletedFile) {
  TempDir tmp("local-onefile");
  const LocalCheckpointOptions options = clique(1, 2);  // one rank per node
  run_ranks(4, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 5); });
  std::filesystem::remove(file_of(tmp.path(), 2, 5, 2));
  run_ranks(4, [&](Communicator& comm) {
    EXPECT_EQ(load_and_check(tmp.path(), comm, options, 5).recovered_ranks, (std::vector<int>{2}));
  });
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 2, 5, 2)));  // its own copy is back
}

TEST(LocalCheckpoint, NodeLossIsRecoveredBitwise) {
  for (const int world : {4, 8}) {
    TempDir tmp("local-nodeloss");
    const LocalCheckpointOptions options = clique(2, 2);
    run_ranks(world, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 7); });
    // The node of ranks 2 and 3 is replaced by an empty one.
    io::remove_tree(tmp.path() + "/rank_2");
    io::remove_tree(tmp.path() + "/rank_3");
    run_ranks(world, [&](Communicator& comm) {
      EXPECT_EQ(load_and_check(tmp.path(), comm, options, 7).recovered_ranks, (std::vector<int>{2, 3})) << world;
    });
  }
}

TEST(LocalCheckpoint, CorruptOwnCopyIsDetectedAndAReplicaUsed) {
  TempDir tmp("local-corrupt-own");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 3); });
  flip_byte(file_of(tmp.path(), 1, 3, 1), 4096 + 3);  // tensor bytes of rank 1's own copy
  run_ranks(4, [&](Communicator& comm) {
    const LocalRecovery recovery = load_and_check(tmp.path(), comm, options, 3);
    EXPECT_EQ(recovery.recovered_ranks, (std::vector<int>{1}));
    ASSERT_FALSE(recovery.notes.empty());
    EXPECT_NE(recovery.notes[0].find("do not match their checksums"), std::string::npos) << recovery.notes[0];
  });
}

TEST(LocalCheckpoint, CorruptReplicaIsSkippedForAnother) {
  TempDir tmp("local-corrupt-replica");
  const LocalCheckpointOptions options = clique(2, 3);  // 3 nodes of 2 ranks: cliques {0,2,4} and {1,3,5}
  run_ranks(6, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 9); });
  io::remove_tree(tmp.path() + "/rank_2");
  io::remove_tree(tmp.path() + "/rank_3");
  flip_byte(file_of(tmp.path(), 0, 9, 2), 4096 + 1);  // the first replica of rank 2
  run_ranks(6, [&](Communicator& comm) {
    const LocalRecovery recovery = load_and_check(tmp.path(), comm, options, 9);
    EXPECT_EQ(recovery.recovered_ranks, (std::vector<int>{2, 3}));
    bool noted = false;
    for (const std::string& n : recovery.notes) noted = noted || n.find("the replica on rank 0") != std::string::npos;
    EXPECT_TRUE(noted);
  });
}

TEST(LocalCheckpoint, NoIntactReplicaIsAClearErrorNamingTheRanks) {
  TempDir tmp("local-no-intact");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 4); });
  io::remove_tree(tmp.path() + "/rank_2");
  io::remove_tree(tmp.path() + "/rank_3");
  flip_byte(file_of(tmp.path(), 0, 4, 2), 4096 + 1);  // the only replica of rank 2
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    EXPECT_EQ(manager.find_latest(), std::optional<int64_t>(4));  // every file is there...
    EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.load(); },
                                             "no intact copy of the local checkpoint of rank(s) 2 at iteration 4"));
  });
}

TEST(LocalCheckpoint, OlderIterationsStayUntilANewerOneIsCompleteEverywhere) {
  TempDir tmp("local-cleanup");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    manager.save(TensorAwareStateDict::from_state_dict(model(comm.rank(), 4, 1), comm), 1);
    // Iteration 2 fails on rank 1 (its dict is hollow): nobody removes iteration 1.
    TensorAwareStateDict next = TensorAwareStateDict::from_state_dict(model(comm.rank(), 4, 2), comm);
    if (comm.rank() == 1) next.pop_tensors();
    EXPECT_THROW(manager.save(next, 2), Error);
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{1}));
    EXPECT_EQ(manager.find_latest(), std::optional<int64_t>(1));
    EXPECT_TRUE(throws_with<CheckpointError>(
        [&] { manager.save(TensorAwareStateDict::from_state_dict(model(comm.rank(), 4, 1), comm), 1); }, "not newer"));
    // Another rank's dict is refused before anything is written.
    TensorAwareStateDict foreign = TensorAwareStateDict::from_state_dict(model(comm.rank(), 4, 3), comm);
    foreign.state().owner_rank = (comm.rank() + 1) % 4;
    EXPECT_TRUE(
        throws_with<UsageError>([&] { manager.save(foreign, 3); }, "was given the tensor-aware state dict of rank"));
  });
  run_ranks(4, [&](Communicator& comm) { load_and_check(tmp.path(), comm, options, 1); });
}

// After a load the job goes on from that iteration: saving it again (which
// would replace the checkpoint resumed from) is refused, as is an iteration
// not newer than an asynchronous save that is not finalized yet.
TEST(LocalCheckpoint, SavesMustBeNewerThanTheLoadedAndThePendingIterations) {
  TempDir tmp("local-newer");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 5); });
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    manager.load();
    EXPECT_TRUE(throws_with<CheckpointError>(
        [&] { manager.save(state_at(comm, 5), 5); },
        "local checkpoint iteration 5 is not newer than the last one saved or loaded (5)"));
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{5}));  // untouched
    AsyncCallsQueue queue(comm);
    manager.save_async(state_at(comm, 8), 8, queue);
    EXPECT_TRUE(throws_with<CheckpointError>(
        [&] { manager.save(state_at(comm, 7), 7); },
        "iteration 7 is not newer than iteration 8, whose asynchronous save is not finalized yet"));
    queue.close();
    manager.save(state_at(comm, 9), 9);
  });
  run_ranks(4, [&](Communicator& comm) { load_and_check(tmp.path(), comm, options, 9); });
}

// A synchronous save that finishes while an asynchronous one is in flight
// leaves the latter's files alone (it finalizes, and the newer iteration
// stays the last); an asynchronous save the queue refuses leaves nothing.
TEST(LocalCheckpoint, AsynchronousSavesSurviveASynchronousOneAndARefusedQueue) {
  TempDir tmp("local-mixed");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    AsyncCallsQueue queue(comm);
    manager.save_async(state_at(comm, 20), 20, queue);
    manager.save(state_at(comm, 30), 30);
    queue.close();  // finalizes 20
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{20, 30}));
    EXPECT_EQ(manager.find_latest(), std::optional<int64_t>(30));
    EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.save(state_at(comm, 25), 25); }, "(30)"));

    AsyncCallsQueue closed(comm);
    closed.close();
    EXPECT_TRUE(
        throws_with<UsageError>([&] { manager.save_async(state_at(comm, 40), 40, closed); }, "the queue is closed"));
    EXPECT_FALSE(io::exists(manager.file_path(comm.rank(), 40, comm.rank())));
    manager.save(state_at(comm, 40), 40);  // not held back as in flight
  });
  run_ranks(4, [&](Communicator& comm) { load_and_check(tmp.path(), comm, options, 40); });
}

// A job that resumed from its global checkpoint at iteration 15 while local
// storage holds iterations 10 and 30 of the run it abandoned: discard_after
// leaves 10 (older than its state) and removes 30 on every rank; it is
// refused while an asynchronous save is in flight.
TEST(LocalCheckpoint, DiscardAfterRemovesTheLaterIterationsOfAnAbandonedRun) {
  TempDir tmp("local-discard");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    manager.save(state_at(comm, 10), 10);
    // Keep 10 beside 30 (a save removes the older ones): copy it aside, put it back.
    const std::string own = manager.file_path(comm.rank(), 10, comm.rank());
    std::filesystem::copy_file(own, own + ".keep");
    manager.save(state_at(comm, 30), 30);
    std::filesystem::rename(own + ".keep", own);
  });
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    EXPECT_EQ(manager.find_latest(), std::optional<int64_t>(30));
    manager.discard_after(15);
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{10}));
    EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.save(state_at(comm, 15), 15); },
                                             "not newer than the last one saved or loaded (15)"));
  });
  // Every rank put its own copy of 10 back: 10 is complete, and the latest.
  run_ranks(4, [&](Communicator& comm) { load_and_check(tmp.path(), comm, options, 10); });
  // Not while an asynchronous save is in flight.
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    AsyncCallsQueue queue(comm);
    manager.save_async(state_at(comm, 16), 16, queue);
    EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.discard_after(15); },
                                             "the asynchronous save of iteration 16 is not finalized"));
    queue.close();
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{16}));
    manager.discard_after(15);
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{}));
  });
}

// A queue destroyed without close() drops its save unfinalized: the write
// is waited for, its iteration no longer counts as in flight (discard_after
// and older iterations are no longer refused), and its file, never
// replicated, stays until something removes it.
TEST(LocalCheckpoint, ADroppedAsynchronousSaveNoLongerHoldsItsIteration) {
  TempDir tmp("local-dropped");
  const LocalCheckpointOptions options = clique(2, 2);
  run_ranks(4, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    manager.save(state_at(comm, 10), 10);
    {
      AsyncCallsQueue queue(comm);
      manager.save_async(state_at(comm, 20), 20, queue);
    }
    EXPECT_TRUE(io::exists(manager.file_path(comm.rank(), 20, comm.rank())));
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{10, 20}));
    manager.discard_after(15);
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{10}));
    {
      AsyncCallsQueue queue(comm);
      manager.save_async(state_at(comm, 40), 40, queue);
    }
    manager.save(state_at(comm, 30), 30);  // removes the dropped 40, as left by an abandoned run
    EXPECT_EQ(manager.local_iterations(), (std::vector<int64_t>{30}));
  });
  run_ranks(4, [&](Communicator& comm) { load_and_check(tmp.path(), comm, options, 30); });
}

// Explicit groups of unequal sizes, as in nvidia-resiliency-ext's tests:
// ranks 6, 3 and 4 are lost and come back from their groups' survivors; a
// rank whose whole group is gone is a clear error naming the group.
TEST(LocalCheckpoint, ExplicitReplicationGroupsOfUnequalSizes) {
  TempDir tmp("local-groups");
  LocalCheckpointOptions options;
  options.replication_groups = {{2, 6, 7}, {3, 1}, {5}, {0, 4}};
  run_ranks(8, [&](Communicator& comm) { save_iteration(tmp.path(), comm, options, 6); });
  // Each rank's file is on every member of its group, and nowhere else.
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 6, 6, 2)));
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 7, 6, 2)));
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 1, 6, 3)));
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 0, 6, 4)));
  EXPECT_FALSE(io::exists(file_of(tmp.path(), 3, 6, 2)));
  EXPECT_FALSE(io::exists(file_of(tmp.path(), 0, 6, 5)));
  for (const int lost : {6, 3, 4}) io::remove_tree(tmp.path() + "/rank_" + std::to_string(lost));
  run_ranks(8, [&](Communicator& comm) {
    EXPECT_EQ(load_and_check(tmp.path(), comm, options, 6).recovered_ranks, (std::vector<int>{3, 4, 6}));
  });
  EXPECT_TRUE(io::exists(file_of(tmp.path(), 6, 6, 6)));  // restored from rank 2 or 7

  // Rank 5 replicates only to itself: losing it loses its checkpoint.
  io::remove_tree(tmp.path() + "/rank_5");
  run_ranks(8, [&](Communicator& comm) {
    LocalCheckpointManager manager(tmp.path(), comm, options);
    EXPECT_EQ(manager.find_latest(), std::nullopt);
    EXPECT_TRUE(throws_with<CheckpointError>(
        [&] { manager.load(6); }, "no intact copy of the local checkpoint of rank(s) 5 at iteration 6 under '" +
                                      tmp.path() +
                                      "' (rank 5 replicates within [5]; rank 5's own copy: open for reading"));
  });

  // Groups that do not partition the ranks are refused, saying how.
  run_ranks(2, [&](Communicator& comm) {
    LocalCheckpointOptions bad;
    bad.replication_groups = {{0, 1}, {1}};
    EXPECT_TRUE(throws_with<UsageError>([&] { LocalCheckpointManager(tmp.path(), comm, bad); },
                                        "rank 1 is in group [0, 1] and in group [1]"));
    bad.replication_groups = {{0, 1, 0}};
    EXPECT_TRUE(throws_with<UsageError>([&] { LocalCheckpointManager(tmp.path(), comm, bad); },
                                        "group [0, 1, 0] lists rank 0 twice"));
    bad.replication_groups = {{0}};
    EXPECT_TRUE(
        throws_with<UsageError>([&] { LocalCheckpointManager(tmp.path(), comm, bad); }, "rank 1 is in no group"));
    bad.replication_groups = {{0, 2}, {1}};
    EXPECT_TRUE(throws_with<UsageError>([&] { LocalCheckpointManager(tmp.path(), comm, bad); },
                                        "group [0, 2] names rank 2, outside a world of 2 ranks"));
    bad.replication_groups = {{0}, {1}};
    bad.replication = CliqueReplication{1, 2};
    EXPECT_TRUE(throws_with<UsageError>([&] { LocalCheckpointManager(tmp.path(), comm, bad); }, "not both"));
  });
}

}  // namespace
}  // namespace distckpt
