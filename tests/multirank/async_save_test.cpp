// Asynchronous saves over a real Gloo group: byte-for-byte equal to a
// synchronous save, a snapshot taken at staging, finalize order and bounds,
// one directory per save in flight, bounded staging memory, clean shutdown.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "io/buffer_pool.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// Rows of a [64, 256] tensor over the ranks, an object per rank and a common value.
StateDict model(int rank, int world, double bump) {
  StateDict sd = Value::dict();
  const int64_t rows = 64 / world;
  sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", {64, 256}).narrow(0, rows * rank, rows) + bump,
                                             {{0, rank, world}});
  sd["bias"] = ShardedTensor::from_rank_offsets("bias", global_tensor("bias", {256}) + bump, {}, {rank});
  sd["rng"] = ShardedObject{"rng", "state-" + std::to_string(rank), {world}, {rank}};
  sd["iteration"] = static_cast<int64_t>(bump);
  return sd;
}

std::vector<std::string> digest_lines(const std::string& dir) {
  std::vector<std::string> lines;
  for (const TensorDigest& d : digest_checkpoint(dir)) lines.push_back(d.line());
  return lines;
}

TEST(AsyncSave, EqualsSyncSaveAndSnapshotsAtStaging) {
  TempDir tmp("async-equal");
  run_ranks(4, [&](Communicator& comm) {
    save(model(comm.rank(), 4, 1), tmp.path() + "/sync", comm);
    AsyncCallsQueue queue(comm);
    StateDict sd = model(comm.rank(), 4, 1);
    queue.save(sd, tmp.path() + "/async");
    // Staged: changing the tensors now must not reach the checkpoint.
    sd.at("w").as_sharded_tensor().data.fill_(-5);
    sd.at("bias").as_sharded_tensor().data.fill_(-5);
    EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/async"));  // not before finalize
    queue.close();
  });
  ASSERT_TRUE(is_distributed_checkpoint(tmp.path() + "/async"));
  EXPECT_EQ(digest_lines(tmp.path() + "/async"), digest_lines(tmp.path() + "/sync"));
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("w", at::empty({32, 256}), {{0, comm.rank(), 2}});
    request["rng"] = ShardedObject{"rng", "", {4}, {comm.rank() + 2}};
    const LoadResult r = load(request, tmp.path() + "/async", comm);
    EXPECT_TRUE(
        at::equal(r.state_dict.at("w").as_tensor(), global_tensor("w", {64, 256}).narrow(0, 32 * comm.rank(), 32) + 1));
    EXPECT_EQ(r.state_dict.at("rng").as_string(), "state-" + std::to_string(comm.rank() + 2));
    EXPECT_EQ(r.state_dict.at("iteration").as_int(), 1);
  });
}

// Issue 16 item 2: the call returns after planning, the copy overlaps the
// next forward/backward, and wait_staged() before the optimizer step is what
// makes changing the parameters safe.
TEST(AsyncSave, BackgroundStagingSnapshotsWhatWaitStagedCovers) {
  TempDir tmp("async-background");
  run_ranks(4, [&](Communicator& comm) {
    save(model(comm.rank(), 4, 1), tmp.path() + "/sync", comm);
    AsyncQueueOptions options;
    options.staging = AsyncStaging::kInBackground;
    AsyncCallsQueue queue(comm, options);
    StateDict sd = model(comm.rank(), 4, 1);
    queue.save(sd, tmp.path() + "/queued");
    queue.wait_staged();
    sd.at("w").as_sharded_tensor().data.fill_(-5);  // the optimizer step
    sd.at("bias").as_sharded_tensor().data.fill_(-5);
    queue.close();

    // The same without a queue; wait_staged is idempotent, finalize after it.
    StateDict direct = model(comm.rank(), 4, 1);
    auto pool = io::BufferPool::create({0, false});
    AsyncRequest request = async_save(direct, tmp.path() + "/direct", comm, {}, pool, AsyncStaging::kInBackground);
    request.wait_staged();
    request.wait_staged();
    direct.at("w").as_sharded_tensor().data.fill_(-7);
    request.finalize(comm);
    request.wait_staged();  // after finalize: nothing to wait for
  });
  EXPECT_EQ(digest_lines(tmp.path() + "/queued"), digest_lines(tmp.path() + "/sync"));
  EXPECT_EQ(digest_lines(tmp.path() + "/direct"), digest_lines(tmp.path() + "/sync"));
}

TEST(AsyncSave, FinalizesInOrderAndKeepsAtMostMaxInFlight) {
  TempDir tmp("async-order");
  run_ranks(2, [&](Communicator& comm) {
    AsyncCallsQueue queue(comm);  // max_in_flight = 1
    EXPECT_EQ(queue.save(model(comm.rank(), 2, 1), tmp.path() + "/it1"), 0);
    EXPECT_EQ(queue.unfinalized(), 1u);
    EXPECT_EQ(queue.save(model(comm.rank(), 2, 2), tmp.path() + "/it2"), 1);  // finalizes it1 first
    EXPECT_TRUE(is_distributed_checkpoint(tmp.path() + "/it1"));
    EXPECT_EQ(queue.unfinalized(), 1u);
    // Non-blocking finalize commits it2 once every rank's writes are done.
    std::vector<int64_t> done;
    for (int i = 0; i < 500 && done.empty(); ++i) {
      done = queue.maybe_finalize(false);
      if (done.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(done, std::vector<int64_t>{1});
    EXPECT_TRUE(is_distributed_checkpoint(tmp.path() + "/it2"));
    EXPECT_TRUE(queue.maybe_finalize(true).empty());
    queue.close();
    EXPECT_THROW(queue.save(model(comm.rank(), 2, 3), tmp.path() + "/it3"), Error);
  });
  EXPECT_EQ(load_common_state_dict(tmp.path() + "/it2").at("iteration").as_int(), 2);
}

TEST(AsyncSave, SecondPlanIsReusedAndStagingBuffersAreKept) {
  TempDir tmp("async-reuse");
  run_ranks(2, [&](Communicator& comm) {
    AsyncCallsQueue queue(comm, AsyncQueueOptions{2, 0});
    queue.save(model(comm.rank(), 2, 1), tmp.path() + "/a");
    const uint64_t allocated = queue.pool()->allocated_bytes();
    EXPECT_GT(allocated, 32u * 256 * 4);
    queue.save(model(comm.rank(), 2, 2), tmp.path() + "/b");
    queue.close();
    EXPECT_EQ(queue.plan_cache()->plans_made(), 1u);
    EXPECT_EQ(queue.plan_cache()->plans_reused(), 1u);
    EXPECT_LE(queue.pool()->allocated_bytes(), 2 * allocated);  // two saves in flight at most
  });
  EXPECT_EQ(digest_checkpoint(tmp.path() + "/b").size(), 2u);
}

TEST(AsyncSave, SameDirectoryWhileInFlightIsRejectedOnEveryRank) {
  TempDir tmp("async-same");
  run_ranks(2, [&](Communicator& comm) {
    AsyncCallsQueue queue(comm, AsyncQueueOptions{2, 0});
    queue.save(model(comm.rank(), 2, 1), tmp.path() + "/x");
    try {
      queue.save(model(comm.rank(), 2, 2), tmp.path() + "/x");
      ADD_FAILURE() << "a second save into a directory in flight must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(comm.rank() == 0 ? "is still in flight" : "failed on rank(s) 0"),
                std::string::npos)
          << e.what();
    }
    queue.close();
  });
  EXPECT_EQ(load_common_state_dict(tmp.path() + "/x").at("iteration").as_int(), 1);
}

TEST(AsyncSave, BoundedStagingStillSavesEverything) {
  TempDir tmp("async-bounded");
  run_ranks(2, [&](Communicator& comm) {
    // 1 MiB of staging for 8 MiB per rank: staging waits for writes.
    AsyncCallsQueue queue(comm, AsyncQueueOptions{1, 1 << 20});
    StateDict sd = Value::dict();
    sd["big"] = ShardedTensor::from_rank_offsets(
        "big", global_tensor("big", {4096, 1024}).narrow(0, 2048 * comm.rank(), 2048), {{0, comm.rank(), 2}});
    queue.save(sd, tmp.path() + "/ckpt");
    queue.close();
    EXPECT_LE(queue.pool()->peak_allocated_bytes(), uint64_t{1} << 20);
  });
  EXPECT_TRUE(
      at::equal(load_plain_tensors(tmp.path() + "/ckpt").at("big").as_tensor(), global_tensor("big", {4096, 1024})));
}

TEST(AsyncSave, ShutdownWhileSavingCommitsNothingAndKeepsThePreviousCheckpoint) {
  TempDir tmp("async-shutdown");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) { save(model(comm.rank(), 2, 1), dir, comm); });
  run_ranks(2, [&](Communicator& comm) {
    AsyncCallsQueue queue(comm);
    SaveOptions options;
    options.overwrite = true;
    queue.save(model(comm.rank(), 2, 2), dir, options);
    comm.barrier();  // both ranks staged; now the job "ends" without close()
  });
  EXPECT_EQ(load_common_state_dict(dir).at("iteration").as_int(), 1);
  EXPECT_TRUE(verify_checkpoint(dir).intact());
  EXPECT_FALSE(io::exists(tmp.path() + "/.ckpt.distckpt-staging"));
  // And the next job can save there again.
  run_ranks(2, [&](Communicator& comm) {
    SaveOptions options;
    options.overwrite = true;
    save(model(comm.rank(), 2, 3), dir, comm, options);
  });
  EXPECT_EQ(load_common_state_dict(dir).at("iteration").as_int(), 3);
}

}  // namespace
}  // namespace distckpt
