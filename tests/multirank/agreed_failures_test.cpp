// Failures every rank agrees on, in a real Gloo job of ranks as threads: a
// fault only one rank meets (a corrupt block only it reads, a data file
// missing, options that differ) is raised on every rank as the same class,
// with the failed rank, its class and its file as data (Error::failures()).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "io/file.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;
using ::testing::HasSubstr;

// Rank r saves and loads rows [4r, 4r + 4) of an [8, 2] tensor: each data
// file is read by the rank that wrote it, and by no other.
StateDict rows(int rank, bool with_data) {
  StateDict sd = Value::dict();
  const at::Tensor data = with_data ? global_tensor("t", {8, 2}).narrow(0, 4 * rank, 4).clone() : at::zeros({4, 2});
  sd["t"] = ShardedTensor::from_rank_offsets("t", data, {{0, rank, 2}});
  return sd;
}

std::string save_rows(const TempDir& tmp) {
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) { save(rows(comm.rank(), true), dir, comm); });
  return dir;
}

// What each rank raised: class, message, and the reports it carries.
struct Raised {
  std::string class_name, message;
  std::vector<RankFailure> failures;
};

std::vector<Raised> load_on_two_ranks(const std::string& dir, LoadOptions options = {}) {
  std::vector<Raised> raised(2);
  run_ranks(2, [&](Communicator& comm) {
    try {
      load(rows(comm.rank(), false), dir, comm, options);
      raised[static_cast<size_t>(comm.rank())].class_name = "(none)";
    } catch (const Error& e) {
      raised[static_cast<size_t>(comm.rank())] = {e.class_name(), e.what(), e.failures()};
    }
  });
  return raised;
}

TEST(AgreedFailures, ACorruptBlockOnlyOneRankReadsIsCorruptionOnEveryRank) {
  TempDir tmp("agreed-corrupt");
  const std::string dir = save_rows(tmp);
  const std::string file = dir + "/data/rank_00001.bin";
  std::string bytes = io::read_file(file, 1 << 20);
  bytes[5] = static_cast<char>(bytes[5] ^ 0x01);
  io::write_file_atomic(file, bytes);
  for (const LoadExchange exchange : {LoadExchange::kNone, LoadExchange::kAuto}) {
    LoadOptions options;
    options.exchange = exchange;
    const std::vector<Raised> raised = load_on_two_ranks(dir, options);
    for (const Raised& r : raised) {
      EXPECT_EQ(r.class_name, "CorruptionError") << r.message;
      EXPECT_EQ(r.message, raised[0].message);  // one text on every rank
      ASSERT_EQ(r.failures.size(), 1u) << r.message;
      EXPECT_EQ(r.failures[0].rank, 1);  // the rank that read it
      EXPECT_EQ(r.failures[0].kind, ErrorKind::kCorruption);
      EXPECT_EQ(r.failures[0].path, file);
      EXPECT_THAT(r.failures[0].message, HasSubstr("checksum mismatch in 't' chunk 1 (file 'data/rank_00001.bin'"));
    }
  }
}

TEST(AgreedFailures, AMissingDataFileIsCorruptionOnEveryRankNamingIt) {
  TempDir tmp("agreed-missing");
  const std::string dir = save_rows(tmp);
  const std::string file = dir + "/data/rank_00001.bin";
  ASSERT_EQ(std::remove(file.c_str()), 0);
  const std::vector<Raised> raised = load_on_two_ranks(dir);
  for (const Raised& r : raised) {
    EXPECT_EQ(r.class_name, "CorruptionError") << r.message;
    EXPECT_EQ(r.message, raised[0].message);
    ASSERT_EQ(r.failures.size(), 1u) << r.message;
    EXPECT_EQ(r.failures[0].rank, 0);  // the coordinator checks every file before any rank reads
    EXPECT_EQ(r.failures[0].path, file);
    EXPECT_THAT(r.failures[0].message, HasSubstr(file + " listed in the metadata is missing"));
  }
}

TEST(AgreedFailures, RanksNamingDifferentCoordinatorsGetOneClearMessage) {
  TempDir tmp("agreed-coordinator");
  run_ranks(2, [&](Communicator& comm) {
    SaveOptions options;
    options.coordinator_rank = comm.rank();  // each names itself
    EXPECT_TRUE(throws_with<UsageError>([&] { save(rows(comm.rank(), true), tmp.path() + "/ckpt", comm, options); },
                                        "SaveOptions::coordinator_rank is 0 on rank 0 but 1 on rank 1; pass the "
                                        "same on every rank"));
  });
  EXPECT_FALSE(io::exists(tmp.path() + "/ckpt"));
  EXPECT_FALSE(io::exists(tmp.path() + "/.ckpt.distckpt-staging"));
}

}  // namespace
}  // namespace distckpt
