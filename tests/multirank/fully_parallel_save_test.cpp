// Fully parallel save over a real Gloo group: balanced writers, plan cache
// reuse and invalidation (also after a restart), and a writer failure on one
// rank reported on every rank.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <set>

#include "format/commit.h"
#include "format/metadata.h"
#include "io/file.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// Rank = dp * 2 + tp: a, b, c, d split on rows over tp and replicated over dp
// (replica id = dp); e replicated over every rank. `bump` shifts the values.
StateDict tp2_dp4(int rank, double bump = 0) {
  const int64_t tp = rank % 2, dp = rank / 2;
  StateDict sd = Value::dict();
  for (const auto& [key, rows] :
       std::vector<std::pair<std::string, int64_t>>{{"a", 8}, {"b", 4}, {"c", 2}, {"d", 16}}) {
    const at::Tensor g = global_tensor(key, {rows, 4}) + bump;
    sd[key] = ShardedTensor::from_rank_offsets(key, g.narrow(0, tp * rows / 2, rows / 2).clone(), {{0, tp, 2}}, {dp});
  }
  sd["e"] = ShardedTensor::from_rank_offsets("e", global_tensor("e", {4}) + bump, {}, {rank});
  sd["iteration"] = static_cast<int64_t>(bump);
  return sd;
}

// Every tensor whole, on one process.
void expect_whole_values(const std::string& dir, double bump) {
  const StateDict plain = load_plain_tensors(dir);
  for (const auto& [key, shape] : std::vector<std::pair<std::string, Shape>>{
           {"a", {8, 4}}, {"b", {4, 4}}, {"c", {2, 4}}, {"d", {16, 4}}, {"e", {4}}}) {
    EXPECT_TRUE(at::equal(plain.at(key).as_tensor(), global_tensor(key, shape) + bump)) << key;
  }
}

int writer_of(const CheckpointMetadata& m, const std::string& key, int64_t row) {
  for (const ChunkRecord& c : m.find_tensor(key)->chunks) {
    if (c.box.offset.empty() || c.box.offset[0] == row) return m.files[c.file].writer_rank;
  }
  return -1;
}

CheckpointMetadata read_metadata(const std::string& dir) {
  const std::string path = dir + "/metadata.fb";
  return decode_metadata(io::read_file(path, io::file_size(path)), path);
}

TEST(FullyParallelSave, BalancedWritersTp2Dp4) {
  TempDir tmp("fps-balanced");
  const std::string dir = tmp.path() + "/ckpt";
  std::vector<uint64_t> bytes(8);
  run_ranks(8, [&](Communicator& comm) {
    const SaveReport report = save(tp2_dp4(comm.rank()), dir, comm);
    bytes[static_cast<size_t>(comm.rank())] = report.bytes_written;
  });
  const CheckpointMetadata m = read_metadata(dir);
  // Each tp chunk's four holders (ranks of one parity) write one of its four
  // chunks each; e, which every rank holds, goes to one of them.
  const int e = writer_of(m, "e", 0);
  ASSERT_GE(e, 0);
  bytes[static_cast<size_t>(e)] -= 16;
  for (const int tp : {0, 1}) {
    std::set<int> writers;
    std::vector<uint64_t> set_bytes;
    for (const auto& [key, rows] :
         std::vector<std::pair<std::string, int64_t>>{{"a", 8}, {"b", 4}, {"c", 2}, {"d", 16}}) {
      const int w = writer_of(m, key, tp * rows / 2);
      EXPECT_EQ(w % 2, tp) << key;
      writers.insert(w);
      set_bytes.push_back(bytes[static_cast<size_t>(w)]);
    }
    EXPECT_EQ(writers.size(), 4u);
    std::sort(set_bytes.begin(), set_bytes.end());
    EXPECT_EQ(set_bytes, (std::vector<uint64_t>{16, 32, 64, 128}));
  }
  EXPECT_EQ(m.writer_policy, "balanced");
  EXPECT_EQ(m.plan_hashes.size(), 8u);
  expect_whole_values(dir, 0);
}

TEST(FullyParallelSave, MainReplicaPolicyWritesOnlyDpRankZero) {
  TempDir tmp("fps-main");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(8, [&](Communicator& comm) {
    SaveOptions options;
    options.writers = WriterPolicy::kMainReplica;
    const SaveReport report = save(tp2_dp4(comm.rank()), dir, comm, options);
    EXPECT_EQ(report.bytes_written, comm.rank() == 0 ? 256u : comm.rank() == 1 ? 240u : 0u) << comm.rank();
  });
  const CheckpointMetadata m = read_metadata(dir);
  EXPECT_EQ(m.files.size(), 2u);  // ranks that write nothing leave no file
  expect_whole_values(dir, 0);
}

TEST(FullyParallelSave, PlanCacheIsReusedThenInvalidatedByAnyStructureChange) {
  TempDir tmp("fps-cache");
  std::vector<std::shared_ptr<SavePlanCache>> caches(4);
  for (auto& c : caches) c = SavePlanCache::create();
  auto save_all = [&](const std::string& name, double bump, bool extra_key, WriterPolicy policy) {
    std::vector<bool> reused(4);
    run_ranks(4, [&](Communicator& comm) {
      SaveOptions options;
      options.plan_cache = caches[static_cast<size_t>(comm.rank())];
      options.writers = policy;
      StateDict sd = tp2_dp4(comm.rank(), bump);
      if (extra_key) sd["f"] = ShardedTensor::from_rank_offsets("f", at::ones({3}), {}, {comm.rank()});
      reused[static_cast<size_t>(comm.rank())] = save(sd, tmp.path() + "/" + name, comm, options).plan_reused;
    });
    EXPECT_TRUE(std::all_of(reused.begin(), reused.end(), [&](bool r) { return r == reused[0]; }));
    return static_cast<bool>(reused[0]);
  };
  EXPECT_FALSE(save_all("s1", 1, false, WriterPolicy::kBalanced));
  EXPECT_TRUE(save_all("s2", 2, false, WriterPolicy::kBalanced));  // new values, same structure
  expect_whole_values(tmp.path() + "/s2", 2);
  EXPECT_FALSE(save_all("s3", 3, true, WriterPolicy::kBalanced));  // a new key
  EXPECT_TRUE(save_all("s4", 4, true, WriterPolicy::kBalanced));
  EXPECT_FALSE(save_all("s5", 5, true, WriterPolicy::kLowestRank));  // another policy
  EXPECT_EQ(caches[0]->plans_made(), 3u);
  EXPECT_EQ(caches[3]->plans_reused(), 2u);
  expect_whole_values(tmp.path() + "/s5", 5);
  EXPECT_TRUE(at::equal(load_plain_tensors(tmp.path() + "/s4").at("f").as_tensor(), at::ones({3})));

  // One rank without its cache: nobody reuses (the decision is the same everywhere).
  caches[2]->invalidate();
  EXPECT_FALSE(save_all("s6", 6, true, WriterPolicy::kLowestRank));
}

TEST(FullyParallelSave, CachedPlanFollowsAMeshChange) {
  TempDir tmp("fps-mesh");
  std::vector<std::shared_ptr<SavePlanCache>> caches{SavePlanCache::create(), SavePlanCache::create(),
                                                     SavePlanCache::create(), SavePlanCache::create()};
  auto model = [](int rank, int64_t tp) {
    StateDict sd = Value::dict();
    const int64_t tp_rank = rank % tp;
    sd["w"] = ShardedTensor::from_rank_offsets(
        "w", global_tensor("w", {8, 4}).narrow(0, tp_rank * 8 / tp, 8 / tp).clone(), {{0, tp_rank, tp}}, {rank / tp});
    return sd;
  };
  for (const auto& [name, tp, expect_reuse] : std::vector<std::tuple<std::string, int64_t, bool>>{
           {"tp2", 2, false}, {"tp2b", 2, true}, {"tp4", 4, false}, {"tp4b", 4, true}}) {
    run_ranks(4, [&, tp = tp, expect_reuse = expect_reuse, name = name](Communicator& comm) {
      SaveOptions options;
      options.plan_cache = caches[static_cast<size_t>(comm.rank())];
      EXPECT_EQ(save(model(comm.rank(), tp), tmp.path() + "/" + name, comm, options).plan_reused, expect_reuse) << name;
    });
    EXPECT_TRUE(at::equal(load_plain_tensors(tmp.path() + "/" + name).at("w").as_tensor(), global_tensor("w", {8, 4})));
  }
}

TEST(FullyParallelSave, PlanReusedAfterRestartFromTheCheckpointItRecorded) {
  TempDir tmp("fps-restart");
  std::vector<uint64_t> first(8), second(8);
  run_ranks(8, [&](Communicator& comm) {
    first[static_cast<size_t>(comm.rank())] = save(tp2_dp4(comm.rank(), 1), tmp.path() + "/iter1", comm).bytes_written;
  });
  // "Restarted" job: fresh caches seeded from the last checkpoint.
  run_ranks(8, [&](Communicator& comm) {
    SaveOptions options;
    options.plan_cache = SavePlanCache::from_checkpoint(tmp.path() + "/iter1");
    const SaveReport report = save(tp2_dp4(comm.rank(), 2), tmp.path() + "/iter2", comm, options);
    EXPECT_TRUE(report.plan_reused) << "rank " << comm.rank();
    second[static_cast<size_t>(comm.rank())] = report.bytes_written;
    EXPECT_EQ(options.plan_cache->plans_reused(), 1u);
  });
  EXPECT_EQ(first, second);  // the same writers
  expect_whole_values(tmp.path() + "/iter2", 2);
  EXPECT_EQ(load_common_state_dict(tmp.path() + "/iter2").at("iteration").as_int(), 2);

  // A restart with another structure plans from scratch.
  run_ranks(8, [&](Communicator& comm) {
    SaveOptions options;
    options.plan_cache = SavePlanCache::from_checkpoint(tmp.path() + "/iter2");
    StateDict sd = tp2_dp4(comm.rank(), 3);
    sd.as_dict().erase("c");
    sd["c"] = ShardedTensor::from_rank_offsets("c", global_tensor("c", {2, 4}) + 3, {}, {comm.rank()});  // unsplit now
    EXPECT_FALSE(save(sd, tmp.path() + "/iter3", comm, options).plan_reused);
  });
  expect_whole_values(tmp.path() + "/iter3", 3);
}

// A plan cache seeded from a checkpoint of the previous format (version 2)
// saves in this build's format, which loads.
TEST(FullyParallelSave, PlanSeededFromAFormatTwoCheckpointSavesInTheCurrentFormat) {
  TempDir tmp("fps-v2-seed");
  const std::string iter1 = tmp.path() + "/iter1";
  run_ranks(8, [&](Communicator& comm) { save(tp2_dp4(comm.rank(), 1), iter1, comm); });
  // Rewrite it as a version 2 checkpoint (the layout and marker that version wrote).
  CheckpointMetadata m = decode_metadata(io::read_file(iter1 + "/metadata.fb", 1 << 24), "metadata.fb");
  m.format_version = 2;
  const std::string v2 = encode_metadata(m);
  io::write_file_atomic(iter1 + "/metadata.fb", v2);
  CheckpointConfig config = *maybe_load_config(iter1);
  config.version = 2;
  config.metadata = record_file("metadata.fb", v2);
  write_commit_marker(iter1, config);
  ASSERT_EQ(maybe_load_config(iter1)->version, 2);
  expect_whole_values(iter1, 1);  // a version 2 checkpoint still loads
  run_ranks(8, [&](Communicator& comm) {
    SaveOptions options;
    options.plan_cache = SavePlanCache::from_checkpoint(iter1);
    EXPECT_TRUE(save(tp2_dp4(comm.rank(), 2), tmp.path() + "/iter2", comm, options).plan_reused);
  });
  EXPECT_EQ(maybe_load_config(tmp.path() + "/iter2")->version, static_cast<int>(kFormatVersion));
  expect_whole_values(tmp.path() + "/iter2", 2);
}

// Limits the size of any file this process writes (the kernel answers EFBIG
// instead of raising SIGXFSZ while that signal is ignored).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, previous_);
  }

 private:
  rlimit saved_{};
  sighandler_t previous_;
};

// Rank 1 holds (and writes) a 8 MiB tensor; the others 4 KiB each.
StateDict one_big_shard(int rank) {
  StateDict sd = Value::dict();
  const int64_t rows = rank == 1 ? 2048 : 1;
  sd["t"] = ShardedTensor::from_global_offset("t", at::ones({rows, 1024}), {2048 + 3, 1024},
                                              {rank == 0   ? 0
                                               : rank == 1 ? 1
                                                           : 2048 + rank - 1,
                                               0});
  return sd;
}

TEST(FullyParallelSave, WriterFailureOnOneRankIsReportedOnEveryRank) {
  TempDir tmp("fps-fail");
  const std::string dir = tmp.path() + "/ckpt";
  const FileSizeLimit limit(4 << 20);
  std::vector<std::string> messages(4);
  run_ranks(4, [&](Communicator& comm) {
    try {
      save(one_big_shard(comm.rank()), dir, comm);
    } catch (const Error& e) {
      messages[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  EXPECT_NE(messages[1].find("File too large"), std::string::npos) << messages[1];
  for (int r : {0, 2, 3}) {
    EXPECT_NE(messages[static_cast<size_t>(r)].find("write data files failed on rank(s) 1"), std::string::npos)
        << messages[static_cast<size_t>(r)];
  }
  EXPECT_FALSE(is_distributed_checkpoint(dir));
  EXPECT_FALSE(io::exists(tmp.path() + "/.ckpt.distckpt-staging"));
}

TEST(FullyParallelSave, AsyncWriterFailureSurfacesAtFinalizeOnEveryRank) {
  TempDir tmp("fps-async-fail");
  const std::string dir = tmp.path() + "/ckpt";
  const FileSizeLimit limit(4 << 20);
  std::vector<std::string> messages(4);
  run_ranks(4, [&](Communicator& comm) {
    AsyncCallsQueue queue(comm);
    queue.save(one_big_shard(comm.rank()), dir);  // staged fine: the failure comes from the disk, later
    try {
      queue.maybe_finalize(/*blocking=*/true);
    } catch (const Error& e) {
      messages[static_cast<size_t>(comm.rank())] = e.what();
    }
    EXPECT_EQ(queue.unfinalized(), 0u);
    queue.close();
  });
  EXPECT_NE(messages[1].find("File too large"), std::string::npos) << messages[1];
  for (int r : {0, 2, 3}) {
    EXPECT_NE(messages[static_cast<size_t>(r)].find("failed on rank(s) 1"), std::string::npos)
        << messages[static_cast<size_t>(r)];
  }
  EXPECT_FALSE(is_distributed_checkpoint(dir));
  EXPECT_FALSE(io::exists(tmp.path() + "/.ckpt.distckpt-staging"));
}

}  // namespace
}  // namespace distckpt
