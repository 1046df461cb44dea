// A load whose device-bound reads exceed one staging window reads them in
// rounds (load/device_staging.h). Ranks with fewer rounds join the rounds of
// the others, pieces several ranks need are still read once and shared, and
// a failure in one rank's late round fails every rank instead of hanging.
// CPU destinations stand in for CUDA ones: a predicate stages them all.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>

#include "comm/agreement.h"
#include "load/checkpoint_reader.h"
#include "load/device_staging.h"
#include "load/load_requests.h"
#include "load/read_engine.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;

constexpr int kRanks = 4;
const Shape kShape{256, 1024};                // "w", float32: four 256 KiB row chunks, one checksum block each
const Shape kExtra{64, 1024};                 // "v", float64 (its bytes match no run of "w"): four 128 KiB row chunks
constexpr uint64_t kStagingBytes = 32 << 10;  // windows of 16 KiB: 16 rows of a strip of "w", 2 rows of "v"

std::string save_rows(const TempDir& tmp) {
  const std::string dir = tmp.file("ckpt");
  run_ranks(kRanks, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    for (const auto& [key, shape, dtype] :
         {std::tuple{"w", kShape, at::kFloat}, std::tuple{"v", kExtra, at::kDouble}}) {
      const int64_t rows = shape[0] / kRanks;
      sd[key] = ShardedTensor::from_rank_offsets(
          key, global_tensor(key, shape, dtype).narrow(0, comm.rank() * rows, rows), {{0, comm.rank(), kRanks}});
    }
    save(sd, dir, comm);
  });
  return dir;
}

struct Staged {
  at::Tensor w, v;
  size_t rounds = 0;
  uint64_t peak_bytes = 0;
};

// Rank r loads column strip r of "w" (16 rounds; every rank needs the same
// chunk in the same round, so the chunk is read once and shared), then rows
// [0, 16 r) of "v" (8 r rounds more).
Staged staged_load(const std::string& dir, Communicator& comm, LoadExchange exchange) {
  loading::CheckpointReader reader(dir);
  const int64_t cols = kShape[1] / kRanks, rows = 16 * comm.rank();
  std::vector<loading::TensorRead> reads;
  Staged out;
  out.w = loading::plan_tensor_reads(reader,
                                     ShardedTensor::from_global_offset("w", at::zeros({kShape[0], cols}), kShape,
                                                                       {0, comm.rank() * cols}, {comm.rank()}),
                                     reads);
  if (rows > 0) {
    out.v = loading::plan_tensor_reads(reader,
                                       ShardedTensor::from_global_offset("v", at::zeros({rows, kExtra[1]}, at::kDouble),
                                                                         kExtra, {0, 0}, {comm.rank()}),
                                       reads);
  }
  loading::DeviceStaging staging(kStagingBytes, [](const at::Tensor&) { return true; });
  std::vector<std::vector<loading::TensorRead>> rounds = staging.plan_rounds(std::move(reads));
  out.rounds = rounds.size();
  const loading::ReadEngineOptions engine{exchange, 2, 4 << 10};
  const std::vector<std::string> plans = loading::agree_on_read_plans(
      comm, "plan the reads", engine, [&]() -> const std::vector<std::vector<loading::TensorRead>>& { return rounds; });
  agree_on_errors(comm, "read", loading::execute_reads(reader, rounds, comm, engine, plans, staging));
  out.peak_bytes = staging.peak_bytes();
  return out;
}

class StagedLoad : public ::testing::TestWithParam<LoadExchange> {};

TEST_P(StagedLoad, RanksWithFewerRoundsJoinTheOthersAndEveryValueArrives) {
  TempDir tmp("staged-load");
  const std::string dir = save_rows(tmp);
  run_ranks(kRanks, [&](Communicator& comm) {
    const Staged s = staged_load(dir, comm, GetParam());
    const int64_t cols = kShape[1] / kRanks;
    EXPECT_EQ(s.rounds, static_cast<size_t>(16 + 8 * comm.rank()));
    EXPECT_LE(s.peak_bytes, kStagingBytes);
    EXPECT_TRUE(at::equal(s.w, global_tensor("w", kShape).narrow(1, comm.rank() * cols, cols))) << comm.rank();
    if (comm.rank() > 0) {
      EXPECT_TRUE(at::equal(s.v, global_tensor("v", kExtra, at::kDouble).narrow(0, 0, 16 * comm.rank())))
          << comm.rank();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Exchanges, StagedLoad,
                         ::testing::Values(LoadExchange::kAuto, LoadExchange::kBroadcast, LoadExchange::kAllGather,
                                           LoadExchange::kNone),
                         [](const auto& info) { return std::string(load_exchange_name(info.param)); });

// The file and offset holding element (row, 0) of "v".
std::pair<std::string, size_t> locate(const std::string& dir, int64_t row) {
  const at::Tensor values = global_tensor("v", kExtra, at::kDouble)[row].narrow(0, 0, 8).contiguous();
  const std::string pattern(static_cast<const char*>(values.data_ptr()), 8 * sizeof(double));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string bytes = io::read_file(entry.path().string(), 64 << 20);
    const size_t at = bytes.find(pattern);
    if (at != std::string::npos) return {entry.path().string(), at};
  }
  ADD_FAILURE() << "row " << row << " of v not found in " << dir;
  return {};
}

TEST(StagedLoad, ACorruptBlockInOneRanksLateRoundFailsEveryRank) {
  TempDir tmp("staged-load-corrupt");
  const std::string dir = save_rows(tmp);
  // Rows 32..47 of "v" (one checksum block) are read by rank 3 alone, in
  // rounds past 15: rank 0 has read all it needs by then.
  const auto [file, at] = locate(dir, 40);
  flip_byte(file, at);
  std::vector<std::string> errors(kRanks);
  run_ranks(kRanks, [&](Communicator& comm) {
    try {
      staged_load(dir, comm, LoadExchange::kAuto);
      errors[static_cast<size_t>(comm.rank())] = "no error";
    } catch (const CorruptionError& e) {
      errors[static_cast<size_t>(comm.rank())] = std::string("corrupt: ") + e.what();
    } catch (const CommError& e) {
      errors[static_cast<size_t>(comm.rank())] = std::string("comm: ") + e.what();
    }
  });
  // Every rank, rank 3 included, raises the same CorruptionError, in the
  // round where rank 3 found the damage.
  for (size_t r = 0; r < 4; ++r) {
    const std::string& e = errors[r];
    EXPECT_EQ(e, errors[0]);
    EXPECT_EQ(e.rfind("corrupt: ", 0), 0u) << e;
    const size_t round = e.find("read the tensors (staging round ");
    ASSERT_NE(round, std::string::npos) << e;
    EXPECT_GT(std::stoi(e.substr(round + 32)), 16) << e;
    EXPECT_NE(e.find("failed on rank(s) 3: rank 3 (CorruptionError): checksum mismatch in 'v'"), std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace distckpt
