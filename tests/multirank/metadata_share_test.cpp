// A rank's load decodes the metadata records of its own keys, plus those of
// the pieces it schedules for others (a 1/world share of the needed pieces)
// and, in the *_ALL strict modes, of the unrequested keys it owns: never the
// whole checkpoint's.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "distckpt/api/checkpoint.h"
#include "distckpt/storage/storage_reader.h"
#include "load/read_planning.h"
#include "multirank/checkpoint_fixtures.h"
#include "storage/distckpt_storage.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

constexpr int kWorld = 4;
constexpr int kTensors = 64;

std::string key_of(int t) { return fmt::format("layer.{:02d}.weight", t); }

at::Tensor values_of(int t) { return at::arange(t * 32, t * 32 + 32, at::kFloat).view({8, 4}); }

// Tensor t saved whole by rank t % kWorld.
void save_tensors(const std::string& dir) {
  run_ranks(kWorld, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    for (int t = comm.rank(); t < kTensors; t += kWorld) {
      sd[key_of(t)] = ShardedTensor::from_rank_offsets(key_of(t), values_of(t), {});
    }
    save(sd, dir, comm);
  });
}

// The tensors `rank` requests: a quarter of `count`, contiguous.
std::vector<int> requested_by(int rank, int count) {
  std::vector<int> out;
  for (int t = rank * count / kWorld; t < (rank + 1) * count / kWorld; ++t) out.push_back(t);
  return out;
}

class MetadataShare : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("metadata-share");
    save_tensors(path());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path() { return dir_->path() + "/ckpt"; }

  // Every rank loads its share of the first `count` tensors; returns what
  // each rank decoded and checks the values.
  static std::vector<size_t> load_shares(int count, StrictHandling strict, std::vector<uint64_t>* read = nullptr) {
    std::vector<size_t> decoded(kWorld);
    run_ranks(kWorld, [&](Communicator& comm) {
      std::unique_ptr<StorageReader> storage = open_storage(path());
      EXPECT_EQ(storage->tensor_count(), static_cast<size_t>(kTensors));
      EXPECT_EQ(storage->tensors_decoded(), 0u);  // opening decodes no tensor record
      StateDict sd = Value::dict();
      for (const int t : requested_by(comm.rank(), count)) {
        sd[key_of(t)] = ShardedTensor::from_rank_offsets(key_of(t), at::zeros({8, 4}), {});
      }
      LoadOptions options;
      options.strict = strict;
      LoadResult result = load(sd, *storage, comm, options);
      for (const int t : requested_by(comm.rank(), count)) {
        EXPECT_TRUE(at::equal(result.state_dict[key_of(t)].as_tensor(), values_of(t))) << key_of(t);
      }
      decoded[static_cast<size_t>(comm.rank())] = storage->tensors_decoded();
      if (read != nullptr) {
        (*read)[static_cast<size_t>(comm.rank())] =
            dynamic_cast<const storage::DistckptStorage&>(*storage).metadata_bytes_read();
      }
    });
    return decoded;
  }

  // What rank `r` must decode: its keys, the tensors it schedules (each is
  // one stored piece), and the unrequested ones it owns (by place) when
  // `owners` is set.
  static size_t expected(int r, int count, bool owners) {
    std::set<int> keys;
    for (const int t : requested_by(r, count)) keys.insert(t);
    for (int t = 0; t < count; ++t) {
      if (loading::scheduler_of(static_cast<uint32_t>(t), 0, kWorld) == r) keys.insert(t);
    }
    for (int t = count; owners && t < kTensors; ++t) {
      if (t % kWorld == r) keys.insert(t);
    }
    return keys.size();
  }

  static TempDir* dir_;
};
TempDir* MetadataShare::dir_ = nullptr;

TEST_F(MetadataShare, ALoadDecodesItsKeysAndThePiecesItSchedules) {
  const std::vector<size_t> decoded = load_shares(kTensors, StrictHandling::kAssumeOkUnexpected);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(decoded[static_cast<size_t>(r)], expected(r, kTensors, false)) << "rank " << r;
    EXPECT_LT(decoded[static_cast<size_t>(r)], static_cast<size_t>(kTensors) / 2) << "rank " << r;
  }
}

TEST_F(MetadataShare, ALoadReadsTheMetadataHeadAndItsOwnRecords) {
  const std::optional<CheckpointConfig> config = maybe_load_config(path());
  ASSERT_TRUE(config && config->metadata);
  const uint64_t head = config->metadata->head_bytes, total = config->metadata->bytes;
  ASSERT_GT(head, 0u);
  ASSERT_LT(head, total / 3);
  std::vector<uint64_t> read(kWorld);
  const std::vector<size_t> decoded = load_shares(kTensors, StrictHandling::kAssumeOkUnexpected, &read);
  // The records are alike in size: a rank reads the head, its records and
  // the file records they name, in proportion to what it decoded.
  const double per_record = static_cast<double>(total - head) / kTensors;
  for (int r = 0; r < kWorld; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_GT(read[i], head) << "rank " << r;
    EXPECT_LT(static_cast<double>(read[i] - head), per_record * (1.5 * static_cast<double>(decoded[i]) + 8))
        << "rank " << r;
    EXPECT_LT(read[i], total) << "rank " << r;
  }
}

TEST_F(MetadataShare, StrictAllModesDecodeTheUnrequestedKeysOnTheirOwnersOnly) {
  const std::vector<size_t> decoded = load_shares(32, StrictHandling::kReturnAll);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(decoded[static_cast<size_t>(r)], expected(r, 32, true)) << "rank " << r;
  }
}

TEST_F(MetadataShare, StrictAllModesReportTheUnrequestedKeysAsBefore) {
  run_ranks(kWorld, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    for (const int t : requested_by(comm.rank(), 60)) {
      sd[key_of(t)] = ShardedTensor::from_rank_offsets(key_of(t), at::zeros({8, 4}), {});
    }
    sd["not.stored"] = ShardedTensor::from_rank_offsets("not.stored", at::zeros({2}), {});
    LoadOptions options;
    options.strict = StrictHandling::kReturnAll;
    const LoadResult result = load(sd, path(), comm, options);
    EXPECT_EQ(result.missing_keys, (std::set<std::string>{key_of(60), key_of(61), key_of(62), key_of(63)}));
    EXPECT_EQ(result.unexpected_keys, std::set<std::string>{"not.stored"});
  });
}

TEST_F(MetadataShare, SelectedTensorsMetadataDecodesOnlyTheSelection) {
  const StateDict all = load_tensors_metadata(path());
  EXPECT_EQ(all.as_dict().size(), static_cast<size_t>(kTensors));
  const StateDict some = load_tensors_metadata(path(), TensorSelection{{key_of(3)}, {"layer.1"}});
  std::set<std::string> keys;
  for (const auto& [key, value] : some.as_dict()) {
    keys.insert(key);
    EXPECT_EQ(value.as_sharded_tensor().global_shape, (Shape{8, 4}));
  }
  std::set<std::string> want{key_of(3)};
  for (int t = 10; t < 20; ++t) want.insert(key_of(t));
  EXPECT_EQ(keys, want);
  EXPECT_THROW(load_tensors_metadata(path(), TensorSelection{{}, {"nothing."}}), CheckpointError);
  EXPECT_THROW(load_tensors_metadata(path(), TensorSelection{{"layer.99.weight"}, {}}), CheckpointError);

  // The lookups behind it decode only the records they return.
  std::unique_ptr<StorageReader> storage = open_storage(path());
  const size_t first = storage->lower_bound_tensor("layer.1");
  EXPECT_EQ(storage->tensor_at(first).key, key_of(10));
  EXPECT_EQ(storage->find_tensor(key_of(3)), std::optional<size_t>(3));
  EXPECT_EQ(storage->find_tensor("layer.3"), std::nullopt);
  EXPECT_EQ(storage->lower_bound_tensor("zzz"), static_cast<size_t>(kTensors));
  EXPECT_EQ(storage->tensors_decoded(), 1u);
  EXPECT_EQ(storage->index().tensors.size(), static_cast<size_t>(kTensors));  // index() still lists every one
}

}  // namespace
}  // namespace distckpt
