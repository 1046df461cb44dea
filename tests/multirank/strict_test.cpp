// The strict-handling matrix: the checkpoint holds a, b, c; rank 0 asks for
// a and x, rank 1 for a and y. Unexpected: x (rank 0), y (rank 1).
// Missing (requested by no rank): b, c.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <mutex>

#include "multirank/checkpoint_fixtures.h"
#include "support/counting_communicator.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using Keys = std::set<std::string>;

ShardedTensor whole(const std::string& key, bool with_data = true) {
  return ShardedTensor::from_rank_offsets(key, with_data ? at::full({2}, 1.0) : at::zeros({2}), {});
}

class StrictTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("strict");
    run_ranks(1, [&](Communicator& comm) {
      StateDict sd = Value::dict();
      for (const char* k : {"a", "b", "c"}) sd[k] = whole(k);
      save(sd, path(), comm);
    });
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path() { return dir_->path() + "/ckpt"; }

  static StateDict request(int rank) {
    StateDict sd = Value::dict();
    sd["a"] = whole("a", false);
    sd[rank == 0 ? "x" : "y"] = whole(rank == 0 ? "x" : "y", false);
    return sd;
  }

  struct Outcome {
    std::string error_type;  // "" when load returned
    std::string message;
    LoadResult result;
  };
  // Runs the load on 2 ranks under `mode`; returns each rank's outcome.
  static std::vector<Outcome> run(StrictHandling mode) {
    std::vector<Outcome> out(2);
    run_ranks(2, [&](Communicator& comm) {
      Outcome& o = out[comm.rank()];
      try {
        o.result = load(request(comm.rank()), path(), comm, {mode});
      } catch (const KeyMismatchError& e) {
        o = {"KeyMismatchError", e.what(), {}};
      } catch (const CommError& e) {
        o = {"CommError", e.what(), {}};
      }
    });
    return out;
  }

  static TempDir* dir_;
};
TempDir* StrictTest::dir_ = nullptr;

TEST_F(StrictTest, AssumeOkUnexpectedFailsInTheReader) {
  for (const Outcome& o : run(StrictHandling::kAssumeOkUnexpected)) {
    EXPECT_EQ(o.error_type, "KeyMismatchError");
    EXPECT_NE(o.message.find("is not in the checkpoint"), std::string::npos) << o.message;
  }
}

TEST_F(StrictTest, LogUnexpectedWarnsAndSkips) {
  testing::LogCapture log;
  const auto out = run(StrictHandling::kLogUnexpected);
  for (const Outcome& o : out) {
    EXPECT_EQ(o.error_type, "");
    EXPECT_EQ(o.result.state_dict.as_dict().size(), 1u);  // only "a"
    EXPECT_TRUE(at::equal(o.result.state_dict.at("a").as_tensor(), at::full({2}, 1.0)));
    EXPECT_TRUE(o.result.unexpected_keys.empty());
  }
  const std::string logged = log.joined();
  EXPECT_NE(logged.find("unexpected keys (requested on rank 0 but not in the checkpoint"), std::string::npos);
  EXPECT_NE(logged.find("'x'"), std::string::npos);
  EXPECT_NE(logged.find("'y'"), std::string::npos);
  EXPECT_EQ(logged.find("missing keys"), std::string::npos);
}

TEST_F(StrictTest, LogAllWarnsAboutMissingToo) {
  testing::LogCapture log;
  for (const Outcome& o : run(StrictHandling::kLogAll)) EXPECT_EQ(o.error_type, "");
  EXPECT_NE(log.joined().find("missing keys (in the checkpoint"), std::string::npos);
  EXPECT_NE(log.joined().find("'b', 'c'"), std::string::npos) << log.joined();
}

TEST_F(StrictTest, RaiseUnexpectedRaisesBeforeReading) {
  const auto out = run(StrictHandling::kRaiseUnexpected);
  EXPECT_EQ(out[0].error_type, "KeyMismatchError");
  EXPECT_NE(out[0].message.find("'x'"), std::string::npos);
  EXPECT_EQ(out[1].error_type, "KeyMismatchError");
  EXPECT_NE(out[1].message.find("'y'"), std::string::npos);
}

TEST_F(StrictTest, RaiseAllReportsBothSets) {
  const auto out = run(StrictHandling::kRaiseAll);
  for (const Outcome& o : out) {
    EXPECT_EQ(o.error_type, "KeyMismatchError");
    EXPECT_NE(o.message.find("missing keys"), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("'b', 'c'"), std::string::npos) << o.message;
  }
}

TEST_F(StrictTest, RaiseOnOneRankIsAnErrorOnEveryRank) {
  std::vector<std::string> types(2);
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["a"] = whole("a", false);
    if (comm.rank() == 0) sd["x"] = whole("x", false);
    try {
      load(sd, path(), comm, {StrictHandling::kRaiseUnexpected});
    } catch (const KeyMismatchError&) {
      types[comm.rank()] = "KeyMismatchError";
    } catch (const CommError&) {
      types[comm.rank()] = "CommError";
    }
  });
  EXPECT_EQ(types, (std::vector<std::string>{"KeyMismatchError", "KeyMismatchError"}));
}

TEST_F(StrictTest, ReturnUnexpectedReturnsOnlyUnexpected) {
  const auto out = run(StrictHandling::kReturnUnexpected);
  EXPECT_EQ(out[0].result.unexpected_keys, (Keys{"x"}));
  EXPECT_EQ(out[1].result.unexpected_keys, (Keys{"y"}));
  for (const Outcome& o : out) EXPECT_TRUE(o.result.missing_keys.empty());
}

TEST_F(StrictTest, ReturnAllReturnsBothSets) {
  const auto out = run(StrictHandling::kReturnAll);
  EXPECT_EQ(out[0].result.unexpected_keys, (Keys{"x"}));
  EXPECT_EQ(out[1].result.unexpected_keys, (Keys{"y"}));
  for (const Outcome& o : out) {
    EXPECT_EQ(o.result.missing_keys, (Keys{"b", "c"}));
    EXPECT_TRUE(at::equal(o.result.state_dict.at("a").as_tensor(), at::full({2}, 1.0)));
  }
}

TEST_F(StrictTest, IgnoreAllSkipsSilently) {
  testing::LogCapture log;
  for (const Outcome& o : run(StrictHandling::kIgnoreAll)) {
    EXPECT_EQ(o.error_type, "");
    EXPECT_TRUE(o.result.unexpected_keys.empty());
    EXPECT_TRUE(o.result.missing_keys.empty());
    EXPECT_FALSE(o.result.state_dict.contains("x"));
  }
  EXPECT_EQ(log.joined(), "");
}

// The *_ALL modes find missing keys through the keys' owners: a requested
// key's name never leaves its rank (only digests travel), the names of the
// missing keys are the only ones sent, and the reports are those above.
TEST(StrictOwners, RequestedKeyNamesNeverLeaveTheirRank) {
  constexpr int kRanks = 4;
  TempDir dir("strict_owners");
  const std::string path = dir.path() + "/ckpt";
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    for (const char* k : {"stored.alpha", "stored.beta", "stored.gamma", "stored.delta"}) sd[k] = whole(k);
    save(sd, path, comm);
  });
  std::mutex mutex;
  std::vector<std::string> leaked;
  std::vector<uint64_t> extra_collectives(kRanks);
  run_ranks(kRanks, [&](Communicator& inner) {
    const int rank = inner.rank();
    testing::CommCounts counts;
    counts.on_message = [&](std::string_view message) {
      for (const char* name : {"stored.alpha", "stored.gamma", "wanted.by.rank"}) {
        if (message.find(name) != std::string_view::npos) {
          std::lock_guard<std::mutex> lock(mutex);
          leaked.push_back(fmt::format("rank {} sent '{}'", rank, name));
        }
      }
    };
    testing::CountingCommunicator comm(inner, counts);
    StateDict sd = Value::dict();
    sd["alpha"] = whole("stored.alpha", false);
    if (rank == 2) sd["gamma"] = whole("stored.gamma", false);
    sd["mine"] = whole(fmt::format("wanted.by.rank.{}", rank), false);
    const uint64_t before = counts.collectives;
    const LoadResult r = load(sd, path, comm, {StrictHandling::kReturnAll});
    EXPECT_EQ(r.unexpected_keys, (Keys{fmt::format("wanted.by.rank.{}", rank)}));
    EXPECT_EQ(r.missing_keys, (Keys{"stored.beta", "stored.delta"}));
    EXPECT_TRUE(at::equal(r.state_dict.at("alpha").as_tensor(), at::full({2}, 1.0)));
    const uint64_t all_mode = counts.collectives - before;
    load(sd, path, comm, {StrictHandling::kReturnUnexpected});
    extra_collectives[static_cast<size_t>(rank)] = all_mode - (counts.collectives - before - all_mode);
  });
  EXPECT_TRUE(leaked.empty()) << ::testing::PrintToString(leaked);
  // As when every rank all-gathered the keys: the owners' answers and the agreement on the outcome.
  EXPECT_EQ(extra_collectives, std::vector<uint64_t>(kRanks, 2));
}

TEST(StrictNames, ParseAndPrintMegatronSpellings) {
  EXPECT_EQ(parse_strict_handling("return_all"), StrictHandling::kReturnAll);
  EXPECT_STREQ(strict_handling_name(StrictHandling::kLogUnexpected), "log_unexpected");
  EXPECT_THROW(parse_strict_handling("strict"), Error);
}

}  // namespace
}  // namespace distckpt
