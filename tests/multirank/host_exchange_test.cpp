// Ranks on one host read each stored byte they need once between them and
// hand it over through shared memory: a row-split checkpoint loaded as
// columns (every rank needs a strip of every chunk) reads exactly the stored
// bytes on the host, not once per rank, and the bytes do not travel as
// messages.
#include <ATen/ATen.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "multirank/checkpoint_fixtures.h"
#include "support/counting_communicator.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::CommCounts;
using testing::CountingCommunicator;
using testing::global_tensor;

constexpr int kRanks = 4;
const Shape kShape{256, 1024};  // float32: four 256 KiB row chunks, each one checksum block
constexpr uint64_t kStoredBytes = 256 * 1024 * 4;

std::string save_rows(const TempDir& tmp) {
  const std::string dir = tmp.file("ckpt");
  run_ranks(kRanks, [&](Communicator& comm) {
    const int64_t rows = kShape[0] / kRanks;
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", kShape).narrow(0, comm.rank() * rows, rows),
                                               {{0, comm.rank(), kRanks}});
    save(sd, dir, comm);
  });
  return dir;
}

// Columns of rows [0, rows): rank r gets column strip r.
StateDict column_request(int rank, int64_t rows) {
  const int64_t cols = kShape[1] / kRanks;
  StateDict sd = Value::dict();
  sd["w"] = ShardedTensor::from_global_offset("w", at::zeros({rows, cols}), kShape, {0, rank * cols}, {rank});
  return sd;
}

struct HostLoad {
  uint64_t read = 0;      // from storage, all ranks
  uint64_t messages = 0;  // bytes handed to the communicator, all ranks
};

HostLoad load_columns(const std::string& dir, int64_t rows, LoadExchange exchange) {
  std::atomic<uint64_t> read{0};
  CommCounts counts;
  run_ranks(kRanks, [&](Communicator& comm) {
    CountingCommunicator counting(comm, counts);
    LoadOptions options;
    options.exchange = exchange;
    options.exchange_batch_bytes = 16 << 10;  // slabs of 4 rows: more rounds than slots, so slots are reused
    const LoadResult r = load(column_request(comm.rank(), rows), dir, counting, options);
    const int64_t cols = kShape[1] / kRanks;
    EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(),
                          global_tensor("w", kShape).narrow(0, 0, rows).narrow(1, comm.rank() * cols, cols)))
        << "rank " << comm.rank();
    read += r.bytes_read;
  });
  return HostLoad{read.load(), counts.bytes.load()};
}

// This process's shared-memory names left in /dev/shm.
int leftover_regions() {
  const std::string mine = "distckpt-" + std::to_string(getpid()) + "-";
  int found = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (const dirent* e = readdir(d)) found += std::string(e->d_name).rfind(mine, 0) == 0 ? 1 : 0;
    closedir(d);
  }
  return found;
}

TEST(HostExchange, EachStoredByteIsReadAndVerifiedOnceOnTheHostAndNotSentAsAMessage) {
  TempDir tmp("host-exchange");
  const std::string dir = save_rows(tmp);
  const HostLoad own = load_columns(dir, kShape[0], LoadExchange::kNone);
  EXPECT_EQ(own.read, kRanks * kStoredBytes);  // each rank reads every chunk for its strip
  const HostLoad shared = load_columns(dir, kShape[0], LoadExchange::kAuto);
  EXPECT_EQ(shared.read, kStoredBytes);  // the bytes the host needs, once
  EXPECT_LT(shared.messages, kStoredBytes / 32) << "only plans and status bytes travel as messages";
  const HostLoad sent = load_columns(dir, kShape[0], LoadExchange::kBroadcast);
  EXPECT_EQ(sent.read, kStoredBytes);
  EXPECT_GT(sent.messages, kStoredBytes * (kRanks - 1) / kRanks);  // the other ranks' strips
  EXPECT_EQ(leftover_regions(), 0);
}

TEST(HostExchange, TheHostReadsOnlyTheChunksItNeeds) {
  TempDir tmp("host-exchange-part");
  const std::string dir = save_rows(tmp);
  const HostLoad half = load_columns(dir, kShape[0] / 2, LoadExchange::kAuto);  // rows of chunks 0 and 1
  EXPECT_EQ(half.read, kStoredBytes / 2);
  const HostLoad part = load_columns(dir, 10, LoadExchange::kAuto);  // 10 rows of chunk 0, one checksum block
  EXPECT_EQ(part.read, kStoredBytes / 4);
}

// Each collective is a round every rank waits in (milliseconds when ranks
// share cores), so a load's count is part of its cost: opening with the key
// check, planning the reads (routing each need to its piece's scheduler),
// the schedulers' shares, planning the parallel load (carrying the
// shared-memory offers), then one agreement on the reads' outcome and the
// rest; sharing within the host adds one, whether every rank mapped. None
// grows with the world.
TEST(HostExchange, ALoadAgreesInFiveCollectivesAndSharingAddsOne) {
  TempDir tmp("host-exchange-collectives");
  const std::string dir = save_rows(tmp);
  auto collectives_per_rank = [&](bool columns) {
    CommCounts counts;
    run_ranks(kRanks, [&](Communicator& comm) {
      CountingCommunicator counting(comm, counts);
      const int64_t rows = kShape[0] / kRanks;
      StateDict own_rows = Value::dict();
      own_rows["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({rows, kShape[1]}), {{0, comm.rank(), kRanks}});
      load(columns ? column_request(comm.rank(), kShape[0]) : own_rows, dir, counting);
    });
    return counts.collectives.load() / kRanks;
  };
  EXPECT_EQ(collectives_per_rank(false), 5u);
  EXPECT_EQ(collectives_per_rank(true), 6u);
}

// A reader places its slabs in its region by its own batch and tells its
// needers where they lie, so ranks may pass different batch sizes.
TEST(HostExchange, RanksWithDifferentBatchSizesShareTheHost) {
  TempDir tmp("host-exchange-batches");
  const std::string dir = save_rows(tmp);
  std::atomic<uint64_t> read{0};
  run_ranks(kRanks, [&](Communicator& comm) {
    LoadOptions options;
    options.exchange_batch_bytes = comm.rank() == 2 ? 32 << 10 : 16 << 10;
    const LoadResult r = load(column_request(comm.rank(), kShape[0]), dir, comm, options);
    const int64_t cols = kShape[1] / kRanks;
    EXPECT_TRUE(
        at::equal(r.state_dict.at("w").as_tensor(), global_tensor("w", kShape).narrow(1, comm.rank() * cols, cols)))
        << "rank " << comm.rank();
    read += r.bytes_read;
  });
  EXPECT_EQ(read.load(), kStoredBytes);
  EXPECT_EQ(leftover_regions(), 0);
}

}  // namespace
}  // namespace distckpt
