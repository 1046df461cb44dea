// Fully parallel load over a real Gloo group: every exchange mode gives the
// values of direct reads, pieces several ranks need are read from storage
// once (balanced over the ranks), and a missing or corrupt piece fails every
// rank promptly instead of leaving some waiting for bytes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;

const std::vector<std::pair<std::string, Shape>> kTensors{
    {"emb", {64, 32}}, {"qkv", {96, 32}}, {"fc1", {128, 32}}, {"norm", {32}}};

// Saved with tp=2 (rows) x dp=2; `norm` replicated everywhere.
StateDict saved_model(int rank) {
  const int64_t tp = rank % 2, dp = rank / 2;
  StateDict sd = Value::dict();
  for (const auto& [key, shape] : kTensors) {
    const at::Tensor g = global_tensor(key, shape);
    if (shape.size() == 1) {
      sd[key] = ShardedTensor::from_rank_offsets(key, g.clone(), {}, {rank});
    } else {
      sd[key] = ShardedTensor::from_rank_offsets(key, g.narrow(0, tp * shape[0] / 2, shape[0] / 2).clone(),
                                                 {{0, tp, 2}}, {dp});
    }
  }
  return sd;
}

// Requested with `tp` column parts (a reshard) replicated over world / tp ranks.
StateDict column_request(int rank, int64_t tp) {
  const int64_t tp_rank = rank % tp;
  StateDict sd = Value::dict();
  for (const auto& [key, shape] : kTensors) {
    if (shape.size() == 1) {
      sd[key] = ShardedTensor::from_rank_offsets(key, at::zeros(shape), {}, {rank});
    } else {
      sd[key] =
          ShardedTensor::from_rank_offsets(key, at::zeros({shape[0], shape[1] / tp}), {{1, tp_rank, tp}}, {rank / tp});
    }
  }
  return sd;
}

void expect_columns(const LoadResult& r, int rank, int64_t tp) {
  for (const auto& [key, shape] : kTensors) {
    const at::Tensor g = global_tensor(key, shape);
    const at::Tensor expected = shape.size() == 1 ? g : g.narrow(1, (rank % tp) * shape[1] / tp, shape[1] / tp);
    EXPECT_TRUE(at::equal(r.state_dict.at(key).as_tensor(), expected)) << key << " on rank " << rank;
  }
}

std::string save_fixture(const TempDir& tmp) {
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(4, [&](Communicator& comm) { save(saved_model(comm.rank()), dir, comm); });
  return dir;
}

class ExchangeModes : public ::testing::TestWithParam<LoadExchange> {};

TEST_P(ExchangeModes, ReshardedLoadGivesTheStoredValues) {
  TempDir tmp("pl-modes");
  const std::string dir = save_fixture(tmp);
  for (const int64_t tp : {1, 2, 4}) {
    run_ranks(4, [&](Communicator& comm) {
      LoadOptions options;
      options.exchange = GetParam();
      options.exchange_batch_bytes = 1024;  // many slabs, many rounds
      expect_columns(load(column_request(comm.rank(), tp), dir, comm, options), comm.rank(), tp);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(FullyParallelLoad, ExchangeModes,
                         ::testing::Values(LoadExchange::kAuto, LoadExchange::kNone, LoadExchange::kBroadcast,
                                           LoadExchange::kAllGather),
                         [](const auto& info) { return std::string(load_exchange_name(info.param)); });

uint64_t stored_bytes() {
  uint64_t total = 0;
  for (const auto& [key, shape] : kTensors) total += static_cast<uint64_t>(numel(shape)) * 4;
  return total;
}

TEST(FullyParallelLoad, PiecesSeveralRanksNeedAreReadOnceAndBalanced) {
  TempDir tmp("pl-once");
  const std::string dir = save_fixture(tmp);
  for (const LoadExchange mode :
       {LoadExchange::kAuto, LoadExchange::kNone, LoadExchange::kBroadcast, LoadExchange::kAllGather}) {
    std::vector<uint64_t> read(4);
    run_ranks(4, [&](Communicator& comm) {
      LoadOptions options;
      options.exchange = mode;
      options.verify_checksums = false;  // count exactly the bytes of the pieces
      const LoadResult r = load(column_request(comm.rank(), 1), dir, comm, options);  // everyone wants everything
      expect_columns(r, comm.rank(), 1);
      read[static_cast<size_t>(comm.rank())] = r.bytes_read;
    });
    uint64_t total = 0;
    for (uint64_t b : read) total += b;
    if (mode == LoadExchange::kNone) {
      EXPECT_EQ(total, 4 * stored_bytes()) << load_exchange_name(mode);
    } else {
      EXPECT_EQ(total, stored_bytes()) << load_exchange_name(mode);  // each piece read once (auto: via /dev/shm)
      for (uint64_t b : read) EXPECT_GT(b, 0u) << load_exchange_name(mode);  // spread over the ranks
    }
  }
}

TEST(FullyParallelLoad, FlatZeroRangesAcrossRanksUseTheExchange) {
  TempDir tmp("pl-flat");
  const std::string dir = save_fixture(tmp);
  run_ranks(4, [&](Communicator& comm) {
    // Every rank asks for a flat range of the whole [128, 32] fc1 (ZeRO-style), overlapping its neighbours.
    const int64_t start = comm.rank() * 800, stop = start + 1500;  // inside the 4096 elements
    StateDict request = Value::dict();
    request["fc1"] = ShardedTensor::from_rank_offsets_flat("fc1", at::zeros({stop - start}), {128, 32}, {},
                                                           FlatRange{start, stop}, {comm.rank()});
    LoadOptions options;
    options.exchange = LoadExchange::kBroadcast;  // threads of one process share a host: ask for it
    const LoadResult r = load(request, dir, comm, options);
    EXPECT_TRUE(at::equal(r.state_dict.at("fc1").as_tensor(),
                          global_tensor("fc1", {128, 32}).flatten().narrow(0, start, stop - start)));
  });
}

TEST(FullyParallelLoad, MissingShardFailsEveryRankWithinTheTimeout) {
  TempDir tmp("pl-missing");
  const std::string dir = save_fixture(tmp);
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string> messages(4);
  run_ranks(
      4,
      [&](Communicator& comm) {
        StateDict request = column_request(comm.rank(), 2);
        if (comm.rank() == 3) {  // a key the checkpoint does not have, on one rank only
          request["ghost"] = ShardedTensor::from_rank_offsets("ghost", at::zeros({4}), {}, {0});
        }
        try {
          load(request, dir, comm);
        } catch (const Error& e) {
          messages[static_cast<size_t>(comm.rank())] = e.what();
        }
      },
      std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(15));
  EXPECT_NE(messages[3].find("tensor 'ghost' is not in the checkpoint"), std::string::npos) << messages[3];
  for (int r : {0, 1, 2})
    EXPECT_NE(messages[static_cast<size_t>(r)].find("failed on rank(s) 3"), std::string::npos)
        << messages[static_cast<size_t>(r)];
}

// The batched rounds are cut alike on every rank: ranks passing different
// batches would wait for rounds that never come, so every rank refuses.
TEST(FullyParallelLoad, RoundsWithDifferentBatchesFailEveryRankAlike) {
  TempDir tmp("pl-batches");
  const std::string dir = save_fixture(tmp);
  std::vector<std::string> messages(4);
  run_ranks(4, [&](Communicator& comm) {
    LoadOptions options;
    options.exchange = LoadExchange::kAllGather;
    options.exchange_batch_bytes = comm.rank() == 1 ? 2048 : 1024;
    try {
      load(column_request(comm.rank(), 1), dir, comm, options);
    } catch (const UsageError& e) {
      messages[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("pass the same value on every rank"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 passed exchange_batch_bytes = 2048"), std::string::npos) << m;
  }
}

TEST(FullyParallelLoad, CorruptPieceFailsEveryRankAndNamesTheReader) {
  TempDir tmp("pl-corrupt");
  const std::string dir = save_fixture(tmp);
  // Flip one byte in every data file: whoever reads a piece meets a bad checksum.
  for (const std::string file : {"rank_00000.bin", "rank_00001.bin", "rank_00002.bin", "rank_00003.bin"}) {
    const std::string path = dir + "/data/" + file;
    if (!io::exists(path)) continue;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  for (const LoadExchange mode : {LoadExchange::kAuto, LoadExchange::kBroadcast, LoadExchange::kAllGather}) {
    std::vector<std::string> messages(4);
    run_ranks(
        4,
        [&](Communicator& comm) {
          LoadOptions options;
          options.exchange = mode;
          try {
            load(column_request(comm.rank(), 1), dir, comm, options);
          } catch (const Error& e) {
            messages[static_cast<size_t>(comm.rank())] = e.what();
          }
        },
        std::chrono::seconds(20));
    for (const std::string& m : messages) {
      EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << load_exchange_name(mode) << ": " << m;
    }
  }
}

}  // namespace
}  // namespace distckpt
