// Sharding validation, commit semantics, corruption and objects, across ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "multirank/checkpoint_fixtures.h"
#include "plan/partitioned_plan.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

SaveOptions overwriting() {
  SaveOptions options;
  options.overwrite = true;
  return options;
}

using testing::global_tensor;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Two ranks each holding rows [start, start+4) of a [8, 2] tensor as main replicas.
StateDict rows(int64_t start, const std::string& key = "t") {
  StateDict sd = Value::dict();
  sd["t"] = ShardedTensor::from_global_offset(key, global_tensor(key, {8, 2}).narrow(0, start, 4).clone(), {8, 2},
                                              {start, 0});
  return sd;
}

TEST(Integrity, OverlappingMainReplicasAreRejectedOnEveryRank) {
  TempDir tmp("overlap");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    const std::string msg = message_of([&] { save(rows(comm.rank() == 0 ? 0 : 2), dir, comm); });
    // The rank that plans key "t" finds the overlap; the other hears of it.
    const int planner = plan::planner_of("t", 2);
    if (comm.rank() == planner) {
      EXPECT_NE(msg.find("main replicas overlap: rank 0 holds offset [0, 0] length [4, 2] and rank 1 holds "
                         "offset [2, 0] length [4, 2]"),
                std::string::npos)
          << msg;
    } else {
      EXPECT_NE(msg.find("failed on rank(s) " + std::to_string(planner)), std::string::npos) << msg;
      EXPECT_NE(msg.find("main replicas overlap"), std::string::npos) << msg;
    }
  });
  EXPECT_FALSE(io::exists(dir));
}

TEST(Integrity, GapIsRejectedWithTheUncoveredRegion) {
  TempDir tmp("gap");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = rows(0);
    if (comm.rank() == 1) sd = Value::dict();  // nobody holds rows 4..7
    const std::string msg = message_of([&] { save(sd, dir, comm); });
    EXPECT_NE(msg.find("no rank holds a main replica of offset [4, 0] length [4, 2]"), std::string::npos) << msg;
  });
}

TEST(Integrity, DtypeAndShapeDisagreementsNameBothRanks) {
  TempDir tmp("dtype");
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = rows(comm.rank() * 4);
    if (comm.rank() == 1) {
      sd["t"] = ShardedTensor::from_global_offset("t", at::zeros({4, 2}, at::kDouble), {8, 2}, {4, 0});
    }
    const std::string msg = message_of([&] { save(sd, tmp.path() + "/a", comm); });
    EXPECT_NE(msg.find("'t' has dtype float32 on rank 0 but float64 on rank 1"), std::string::npos) << msg;
  });
}

TEST(Integrity, FailedSaveIsNeverCommittedAndLeavesNoStaging) {
  TempDir tmp("partial");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = rows(comm.rank() * 4);
    if (comm.rank() == 1) sd["t"] = Value(sd.at("t").as_sharded_tensor().without_data());  // fails while writing
    const std::string msg = message_of([&] { save(sd, dir, comm); });
    EXPECT_NE(msg.find(comm.rank() == 1 ? "has no data" : "write data files failed on rank(s) 1"), std::string::npos)
        << msg;
  });
  EXPECT_FALSE(is_distributed_checkpoint(dir));
  EXPECT_FALSE(io::exists(tmp.path() + "/.ckpt.distckpt-staging"));
  EXPECT_THROW(load_plain_tensors(dir), CheckpointError);
}

TEST(Integrity, OverwriteOnlyWhenAskedAndNeverLosesTheOldCheckpoint) {
  TempDir tmp("overwrite");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) { save(rows(comm.rank() * 4), dir, comm); });
  run_ranks(2, [&](Communicator& comm) {
    StateDict v2 = rows(comm.rank() * 4);
    v2["t"].as_sharded_tensor().data.fill_(42);
    EXPECT_THROW(save(v2, dir, comm), Error);  // CheckpointError on rank 0, CommError elsewhere
    // A failing overwrite keeps the old checkpoint.
    StateDict broken = v2;
    if (comm.rank() == 1) broken["t"] = Value(broken.at("t").as_sharded_tensor().without_data());
    EXPECT_THROW(save(broken, dir, comm, overwriting()), Error);
  });
  EXPECT_TRUE(at::equal(load_plain_tensors(dir).at("t").as_tensor(), global_tensor("t", {8, 2})));
  run_ranks(2, [&](Communicator& comm) {
    StateDict v2 = rows(comm.rank() * 4);
    v2["t"].as_sharded_tensor().data.fill_(42);
    save(v2, dir, comm, overwriting());
  });
  EXPECT_TRUE(at::equal(load_plain_tensors(dir).at("t").as_tensor(), at::full({8, 2}, 42.0)));
  EXPECT_FALSE(io::exists(tmp.path() + "/.ckpt.distckpt-old"));
}

TEST(Integrity, ChecksumMismatchIsDetectedOnLoadAndByVerify) {
  TempDir tmp("corrupt");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) { save(rows(comm.rank() * 4), dir, comm); });
  EXPECT_TRUE(verify_checkpoint(dir).intact());
  {
    std::fstream f(dir + "/data/rank_00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  const VerifyReport report = verify_checkpoint(dir);
  EXPECT_EQ(report.status, VerifyReport::Status::kCorrupt);
  const std::vector<std::string>& problems = report.problems;
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("tensor 't' chunk 1"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("data/rank_00001.bin"), std::string::npos) << problems[0];
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = rows(comm.rank() * 4);
    // Rank 1 reads the corrupt chunk; both raise what it found.
    try {
      load(request, dir, comm);
      ADD_FAILURE() << "expected an error";
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 (CorruptionError): checksum mismatch in 't' chunk 1"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(Integrity, ShardedObjectsRoundTripAndRanksWithOnlyCommonState) {
  TempDir tmp("objects");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(4, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    if (comm.rank() < 2) {  // ranks 2 and 3 hold only common state
      sd["rng"] = ShardedObject{
          "rng", std::string("state\0of\0rank ", 14) + std::to_string(comm.rank()), {2}, {comm.rank()}, {0}};
      sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", {4}).narrow(0, comm.rank() * 2, 2).clone(),
                                                 {{0, comm.rank(), 2}});
    }
    sd["meta"]["step"] = 11;
    sd["meta"]["tags"] = List{Value("a"), Value(2.5), Value(true), Value()};
    sd["handle"] = LocalNonPersistentObject(Value("dropped"));
    save(sd, dir, comm);
  });
  const StateDict common = load_common_state_dict(dir);
  EXPECT_EQ(common.at("meta").at("step").as_int(), 11);
  EXPECT_FALSE(common.contains("handle"));
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = Value::dict();
    const int other = 1 - comm.rank();  // read the other rank's object
    request["rng"] = ShardedObject{"rng", "", {2}, {other}, {0}};
    request["handle"] = LocalNonPersistentObject(Value("restored"));
    const StateDict got = load(request, dir, comm).state_dict;
    EXPECT_EQ(got.at("rng").as_string(), std::string("state\0of\0rank ", 14) + std::to_string(other));
    EXPECT_EQ(got.at("handle").as_string(), "restored");
    EXPECT_EQ(got.at("meta").at("tags")[1].as_float(), 2.5);
    const StateDict only_objects = load_sharded_objects(request, dir);
    EXPECT_EQ(only_objects.at("rng").as_string(), got.at("rng").as_string());
  });
}

}  // namespace
}  // namespace distckpt
