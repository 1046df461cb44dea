// Strict handling reports keys, not shards (Megatron-Core's behaviour): 4
// ranks save tensors TenA-C, a one-shard object ObjA and a 4-shard object
// ObjB; the request leaves out TenA and ObjB and adds UnexpectedTenD and
// UnexpectedObjD, all under nested dict paths. Every mode, through load()
// and through TensorAwareStateDict (atomic and fully parallel).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using Keys = std::set<std::string>;
constexpr int kRanks = 4;

const Keys kMissing{"ObjB", "TenA"};
const Keys kUnexpected{"UnexpectedObjD", "UnexpectedTenD"};

ShardedObject object(const std::string& key, Shape grid, Shape offset, int rank) {
  return ShardedObject{key, "bytes of " + key, std::move(grid), std::move(offset), ReplicaId{rank}};
}

StateDict saved(int rank) {
  StateDict sd;
  sd["model"]["layer"]["a"] = ShardedTensor::from_rank_offsets("TenA", at::full({2}, 10.0 + rank), {{0, rank, kRanks}});
  sd["model"]["layer"]["b"] = ShardedTensor::from_rank_offsets("TenB", at::full({3}, 2.0), {}, {rank});
  sd["model"]["c"] = ShardedTensor::from_rank_offsets("TenC", at::full({2}, 30.0 + rank), {{0, rank, kRanks}});
  sd["objects"]["a"] = object("ObjA", {}, {}, rank);
  ShardedObject b = object("ObjB", {kRanks}, {rank}, 0);
  b.data = "ObjB shard " + std::to_string(rank);
  sd["objects"]["b"] = b;
  return sd;
}

// Without TenA and ObjB, plus an unexpected tensor and object; the tensors
// carry no data (allocated by the load).
StateDict request(int rank) {
  StateDict sd;
  sd["model"]["layer"]["b"] = ShardedTensor::from_rank_offsets("TenB", at::zeros({3}), {}, {rank}).without_data();
  sd["model"]["c"] = ShardedTensor::from_rank_offsets("TenC", at::zeros({2}), {{0, rank, kRanks}}).without_data();
  sd["objects"]["a"] = object("ObjA", {}, {}, rank).without_data();
  sd["new"]["deep"]["tensor"] = ShardedTensor::from_rank_offsets("UnexpectedTenD", at::zeros({2}), {}, {rank});
  sd["new"]["deep"]["obj"] = object("UnexpectedObjD", {}, {}, rank).without_data();
  return sd;
}

void expect_loaded(const LoadResult& r, int rank) {
  EXPECT_TRUE(at::equal(r.state_dict.at("model").at("layer").at("b").as_tensor(), at::full({3}, 2.0)));
  EXPECT_TRUE(at::equal(r.state_dict.at("model").at("c").as_tensor(), at::full({2}, 30.0 + rank)));
  EXPECT_EQ(r.state_dict.at("objects").at("a").as_string(), "bytes of ObjA");
  EXPECT_FALSE(r.state_dict.contains("new"));
}

class StrictObjectsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("strict-objects");
    run_ranks(kRanks, [&](Communicator& comm) { save(saved(comm.rank()), path(), comm); });
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path() { return dir_->path() + "/ckpt"; }

  struct Outcome {
    std::string error;  // what() of a KeyMismatchError, "" when load returned
    LoadResult result;
  };
  static std::vector<Outcome> run(StrictHandling mode) {
    std::vector<Outcome> out(kRanks);
    run_ranks(kRanks, [&](Communicator& comm) {
      Outcome& o = out[comm.rank()];
      try {
        o.result = load(request(comm.rank()), path(), comm, {mode});
        expect_loaded(o.result, comm.rank());
      } catch (const KeyMismatchError& e) {
        o.error = e.what();
      }
    });
    return out;
  }
  static std::string unexpected_message(int rank) {
    return "unexpected keys (requested on rank " + std::to_string(rank) + " but not in the checkpoint '" + path() +
           "'): 'UnexpectedObjD', 'UnexpectedTenD'";
  }
  static std::string missing_message() {
    return "missing keys (in the checkpoint '" + path() + "' but requested by no rank): 'ObjB', 'TenA'";
  }

  static TempDir* dir_;
};
TempDir* StrictObjectsTest::dir_ = nullptr;

TEST_F(StrictObjectsTest, AssumeOkUnexpectedFailsInTheReaderOnTheShard) {
  for (const Outcome& o : run(StrictHandling::kAssumeOkUnexpected)) {
    EXPECT_NE(o.error.find("UnexpectedObjD/shard__"), std::string::npos) << o.error;
  }
}

TEST_F(StrictObjectsTest, LogModesNameKeys) {
  testing::LogCapture unexpected_only;
  for (const Outcome& o : run(StrictHandling::kLogUnexpected)) EXPECT_EQ(o.error, "");
  std::string logged = unexpected_only.joined();
  for (int r = 0; r < kRanks; ++r) EXPECT_NE(logged.find(unexpected_message(r)), std::string::npos) << logged;
  EXPECT_EQ(logged.find("shard_"), std::string::npos) << logged;
  EXPECT_EQ(logged.find("missing keys"), std::string::npos) << logged;

  testing::LogCapture all;
  for (const Outcome& o : run(StrictHandling::kLogAll)) EXPECT_EQ(o.error, "");
  logged = all.joined();
  EXPECT_NE(logged.find(missing_message()), std::string::npos) << logged;
  EXPECT_NE(logged.find(unexpected_message(3)), std::string::npos) << logged;
  EXPECT_EQ(logged.find("shard_"), std::string::npos) << logged;
}

// Every rank raises the same error, naming what each rank requested in vain.
TEST_F(StrictObjectsTest, RaiseModesNameKeys) {
  const auto unexpected = run(StrictHandling::kRaiseUnexpected);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(unexpected[r].error, unexpected[0].error);
    EXPECT_NE(unexpected[0].error.find(fmt::format("rank {} (KeyMismatchError): {}", r, unexpected_message(r))),
              std::string::npos)
        << unexpected[0].error;
  }
  const auto all = run(StrictHandling::kRaiseAll);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(all[r].error, all[0].error);
    EXPECT_NE(all[0].error.find(
                  fmt::format("rank {} (KeyMismatchError): {}; {}", r, unexpected_message(r), missing_message())),
              std::string::npos)
        << all[0].error;
  }
}

TEST_F(StrictObjectsTest, ReturnModesReturnKeysTheSameOnEveryRank) {
  for (const Outcome& o : run(StrictHandling::kReturnUnexpected)) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.result.unexpected_keys, kUnexpected);
    EXPECT_TRUE(o.result.missing_keys.empty());
  }
  for (const Outcome& o : run(StrictHandling::kReturnAll)) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.result.unexpected_keys, kUnexpected);
    EXPECT_EQ(o.result.missing_keys, kMissing);
  }
}

TEST_F(StrictObjectsTest, IgnoreAllSkipsSilently) {
  testing::LogCapture log;
  for (const Outcome& o : run(StrictHandling::kIgnoreAll)) {
    EXPECT_EQ(o.error, "");
    EXPECT_TRUE(o.result.unexpected_keys.empty());
    EXPECT_TRUE(o.result.missing_keys.empty());
  }
  EXPECT_EQ(log.joined(), "");
}

// ObjB asked for on another grid (2 shards, not stored): its shards are
// skipped and ObjB reported unexpected; requested, so not missing.
TEST_F(StrictObjectsTest, AnObjectOnAnotherGridIsUnexpectedByKey) {
  run_ranks(kRanks, [&](Communicator& comm) {
    StateDict sd = request(comm.rank());
    sd.as_dict().erase("new");
    sd["objects"]["b"] = object("ObjB", {2}, {comm.rank() % 2}, comm.rank() / 2).without_data();
    sd["model"]["layer"]["a"] = ShardedTensor::from_rank_offsets("TenA", at::zeros({2}), {{0, comm.rank(), kRanks}});
    const LoadResult r = load(sd, path(), comm, {StrictHandling::kReturnAll});
    EXPECT_EQ(r.unexpected_keys, (Keys{"ObjB"}));
    EXPECT_TRUE(r.missing_keys.empty());
    EXPECT_FALSE(r.state_dict.at("objects").contains("b"));
    EXPECT_TRUE(at::equal(r.state_dict.at("model").at("layer").at("a").as_tensor(), at::full({2}, 10.0 + comm.rank())));
  });
}

// The same reports from a local checkpoint's TensorAwareStateDict.
TEST(StrictObjectsTensorAware, ReturnAndRaiseNameKeysUnderBothAlgorithms) {
  for (TensorAwareAlgo algo : {TensorAwareAlgo::kAtomic, TensorAwareAlgo::kFullyParallel}) {
    SCOPED_TRACE(tensor_aware_algo_name(algo));
    run_ranks(kRanks, [&](Communicator& comm) {
      const int rank = comm.rank();
      const TensorAwareStateDict tasd = TensorAwareStateDict::from_state_dict(saved(rank), comm, algo);
      StateDict want = request(rank);
      // A local checkpoint loads into the saved layout: the request carries data.
      want["model"]["layer"]["b"] = ShardedTensor::from_rank_offsets("TenB", at::zeros({3}), {}, {rank});
      want["model"]["c"] = ShardedTensor::from_rank_offsets("TenC", at::zeros({2}), {{0, rank, kRanks}});
      ToStateDictOptions options;
      options.strict = StrictHandling::kReturnAll;
      const LoadResult r = tasd.to_state_dict(want, comm, options);
      EXPECT_EQ(r.unexpected_keys, kUnexpected);
      EXPECT_EQ(r.missing_keys, kMissing);
      expect_loaded(r, rank);

      options.strict = StrictHandling::kRaiseAll;
      EXPECT_TRUE(throws_with<KeyMismatchError>(
          [&] { tasd.to_state_dict(want, comm, options); },
          "unexpected keys (requested on rank " + std::to_string(rank) + " but not in the local checkpoint of rank " +
              std::to_string(rank) +
              "): 'UnexpectedObjD', 'UnexpectedTenD'; missing keys (in the local checkpoint of "
              "rank " +
              std::to_string(rank) + " but requested by no rank): 'ObjB', 'TenA'"));
    });
  }
}

}  // namespace
}  // namespace distckpt
