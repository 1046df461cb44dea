// Format version 2: the commit marker records metadata.fb and common.fb, so
// damage to either is caught on every open; version 1 checkpoints still load;
// verify_checkpoint classifies directories as a load would.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "distckpt/distckpt.h"
#include "format/metadata.h"
#include "io/checksum.h"
#include "io/file.h"
#include "load/checkpoint_reader.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// A 2-rank checkpoint of one [8, 2] tensor and a little common state.
std::string save_small(const TempDir& tmp) {
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["t"] = ShardedTensor::from_rank_offsets("t", global_tensor("t", {8, 2}).narrow(0, 4 * comm.rank(), 4).clone(),
                                               {{0, comm.rank(), 2}});
    sd["iteration"] = Value(int64_t{1234});
    sd["lr"] = Value(0.5);
    save(sd, dir, comm);
  });
  return dir;
}

nlohmann::json marker(const std::string& dir) {
  return nlohmann::json::parse(io::read_file(dir + "/metadata.json", 1 << 20));
}

TEST(FileIntegrity, TheMarkerRecordsMetadataAndCommonState) {
  TempDir tmp("v2");
  const std::string dir = save_small(tmp);
  const nlohmann::json m = marker(dir);
  EXPECT_EQ(m.at("version"), 3);
  EXPECT_EQ(m.at("metadata").at("file"), "metadata.fb");
  EXPECT_EQ(m.at("metadata").at("bytes"), io::file_size(dir + "/metadata.fb"));
  const std::string metadata = io::read_file(dir + "/metadata.fb", 1 << 20);
  EXPECT_EQ(m.at("metadata").at("head_bytes"), metadata_head_bytes(metadata));
  EXPECT_EQ(m.at("metadata").at("head_xxh3"), io::hex64(io::xxh3(metadata.data(), metadata_head_bytes(metadata))));
  EXPECT_EQ(m.at("common").at("file"), "common.fb");
  EXPECT_EQ(m.at("common").at("bytes"), io::file_size(dir + "/common.fb"));
  const VerifyReport report = verify_checkpoint(dir);
  EXPECT_TRUE(report.intact()) << ::testing::PrintToString(report.problems);
  EXPECT_EQ(report.format_version, 3);
  EXPECT_EQ(report.files, 5u);  // marker, metadata, common, two data files
  EXPECT_EQ(report.bytes_checked, 64u);
  EXPECT_EQ(report.blocks_checked, 2u);
}

// The silent case from the bit-flip survey: a flip in common.fb that still
// decodes (here: the value of "iteration") is now rejected by load and verify.
TEST(FileIntegrity, AFlipInTheCommonStateIsRejectedByLoadAndVerify) {
  TempDir tmp("v2-common");
  const std::string dir = save_small(tmp);
  EXPECT_EQ(load_common_state_dict(dir).at("iteration").as_int(), 1234);
  const std::string bytes = io::read_file(dir + "/common.fb", 1 << 20);
  const int64_t value = 1234;
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&value), sizeof(value)));
  ASSERT_NE(at, std::string::npos);
  flip_byte(dir + "/common.fb", at);
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { load_common_state_dict(dir); }, "checksum mismatch in " + dir + "/common.fb"));
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["t"] = ShardedTensor::from_rank_offsets("t", at::zeros({4, 2}), {{0, comm.rank(), 2}});
    EXPECT_TRUE(throws_with<CorruptionError>([&] { load(request, dir, comm); }, "checksum mismatch in"));
  });
  const VerifyReport report = verify_checkpoint(dir);
  EXPECT_EQ(report.status, VerifyReport::Status::kCorrupt);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("common.fb"), std::string::npos) << report.problems[0];
}

TEST(FileIntegrity, AFlipInTheMetadataIsRejectedBeforeDecoding) {
  TempDir tmp("v2-metadata");
  const std::string dir = save_small(tmp);
  flip_byte(dir + "/metadata.fb", 40);
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { load_plain_tensors(dir); }, "checksum mismatch in " + dir + "/metadata.fb"));
  const VerifyReport report = verify_checkpoint(dir);
  EXPECT_EQ(report.status, VerifyReport::Status::kCorrupt);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("metadata.fb: XXH3"), std::string::npos) << report.problems[0];
}

// Past the head: a rank reads a tensor record alone and checks it against the
// head's XXH3 of it; verify checks the whole file against the marker.
TEST(FileIntegrity, AFlipInATensorRecordIsRejectedByTheRankThatReadsIt) {
  TempDir tmp("v3-record");
  const std::string dir = save_small(tmp);
  const std::string metadata = io::read_file(dir + "/metadata.fb", 1 << 20);
  flip_byte(dir + "/metadata.fb", metadata_head_bytes(metadata) + 8);
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["t"] = ShardedTensor::from_rank_offsets("t", at::zeros({4, 2}), {{0, comm.rank(), 2}});
    EXPECT_TRUE(throws_with<CorruptionError>([&] { load(request, dir, comm); },
                                             "checksum mismatch in the record of tensor 't'"));
  });
  // A reader of the whole index checks the whole file against the marker.
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(dir); }, "metadata.fb: XXH3"));
  const VerifyReport report = verify_checkpoint(dir);
  EXPECT_EQ(report.status, VerifyReport::Status::kCorrupt);
  ASSERT_FALSE(report.problems.empty());
  EXPECT_NE(report.problems[0].find("metadata.fb: XXH3"), std::string::npos) << report.problems[0];
}

TEST(FileIntegrity, ATruncatedOrSwappedFileIsNamed) {
  TempDir tmp("v2-swap");
  const std::string dir = save_small(tmp);
  io::write_file_atomic(dir + "/common.fb", "short");
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_common_state_dict(dir); },
                                           dir + "/common.fb has 5 bytes but the commit marker"));
}

// At scale, R ranks each checking all F data files up front is R x F
// metadata operations on a parallel file system: load() has only its
// coordinator check every file, each rank checks the files it reads as it
// opens them (a FIFO refused, never blocked on), and the metadata readers
// check none.
TEST(FileIntegrity, EachRankChecksTheFilesItReadsAndTheCoordinatorChecksThemAll) {
  TempDir tmp("v2-lazy");
  const std::string dir = save_small(tmp);
  const std::string data1 = dir + "/data/rank_00001.bin", kept = tmp.path() + "/kept";
  ASSERT_EQ(std::rename(data1.c_str(), kept.c_str()), 0);
  ASSERT_EQ(::mkfifo(data1.c_str(), 0644), 0);
  const std::string refusal = "'" + data1 + "' is not a regular file (a FIFO)";

  StorageOptions lazy;
  lazy.check_every_file = false;
  loading::CheckpointReader reader(open_storage(dir, lazy));  // opens: rank 1's file is not looked at
  const TensorRecord& t = reader.tensor("t");
  at::Tensor top = at::empty({4, 2});
  reader.read_region(t, Box{{0, 0}, {4, 2}}, top);  // rows 0-3: rank 0's file
  EXPECT_TRUE(at::equal(top, global_tensor("t", {8, 2}).narrow(0, 0, 4)));
  at::Tensor bottom = at::empty({4, 2});
  const auto read_bottom = [&] { reader.read_region(t, Box{{4, 0}, {4, 2}}, bottom); };
  EXPECT_TRUE(throws_with<CorruptionError>(read_bottom, "'" + data1 + "' is not a regular file (a FIFO)"));

  // What every rank of a job may call reads no data file, and checks none.
  EXPECT_EQ(load_common_state_dict(dir).at("iteration").as_int(), 1234);
  EXPECT_TRUE(load_tensors_metadata(dir).contains("t"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { open_storage(dir, StorageOptions{}); }, refusal));
  run_ranks(2, [&](Communicator& comm) {  // both ask for rank 0's rows only: the coordinator's check fails both
    StateDict request = Value::dict();
    request["t"] = ShardedTensor::from_rank_offsets("t", at::zeros({4, 2}), {{0, 0, 2}});
    // The same class on both; the agreed failure names the rank and its cause.
    EXPECT_TRUE(
        throws_with<CorruptionError>([&] { load(request, dir, comm); }, "rank 0 (CorruptionError): " + refusal));
  });
  ASSERT_EQ(::unlink(data1.c_str()), 0);
  ASSERT_EQ(std::rename(kept.c_str(), data1.c_str()), 0);
  EXPECT_TRUE(verify_checkpoint(dir).intact());

  // A file cut short is named by the rank that opens it to read.
  const uint64_t size = io::file_size(data1);
  ASSERT_EQ(::truncate(data1.c_str(), static_cast<off_t>(size - 1)), 0);
  EXPECT_TRUE(throws_with<CorruptionError>(read_bottom, fmt::format("checkpoint file {} has {} bytes but the "
                                                                    "metadata records {} bytes",
                                                                    data1, size - 1, size)));
}

// A checkpoint written by the previous release (format version 1, no
// recorded checksums of metadata.fb/common.fb) loads with the same values.
TEST(FileIntegrity, VersionOneCheckpointsStillLoad) {
  const std::string dir = DISTCKPT_SOURCE_DIR "/tests/data/format_v1";
  EXPECT_EQ(marker(dir).at("version"), 1);
  std::ostringstream digests;
  for (const TensorDigest& d : digest_checkpoint(dir)) digests << d.line() << '\n';
  EXPECT_EQ(digests.str(), io::read_file(DISTCKPT_SOURCE_DIR "/tests/data/format_v1.digest", 1 << 20));
  const StateDict common = load_common_state_dict(dir);
  EXPECT_TRUE(common.contains("iteration"));
  const VerifyReport report = verify_checkpoint(dir);
  EXPECT_TRUE(report.intact()) << ::testing::PrintToString(report.problems);
  EXPECT_EQ(report.format_version, 1);
}

TEST(FileIntegrity, RemovingTensorsSwitchesTheMarkerToNewMetadataAtomically) {
  TempDir tmp("v2-remove");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["a"] = ShardedTensor::from_rank_offsets("optimizer.a", at::ones({2}), {{0, comm.rank(), 2}});
    sd["b"] = ShardedTensor::from_rank_offsets("model.b", at::full({2}, 3.0), {{0, comm.rank(), 2}});
    // An object under the prefix goes with the tensors (its two shards count once); one outside stays.
    sd["o"] = ShardedObject{"optimizer.rng", "state", {2}, {comm.rank()}, {0}};
    sd["m"] = ShardedObject{"model.extra", "kept", {2}, {comm.rank()}, {0}};
    save(sd, dir, comm);
  });
  EXPECT_EQ(remove_sharded_tensors(dir, "optimizer."), 2u);
  const StateDict objects = load_sharded_objects_metadata(dir);
  EXPECT_EQ(objects.size(), 2u);
  EXPECT_TRUE(objects.contains("model.extra/shard_0_2") && objects.contains("model.extra/shard_1_2"));
  const std::string metadata_file = marker(dir).at("metadata").at("file");
  EXPECT_EQ(metadata_file.rfind("metadata-", 0), 0u) << metadata_file;
  EXPECT_TRUE(io::exists(dir + "/" + metadata_file));
  EXPECT_FALSE(io::exists(dir + "/metadata.fb"));  // the old one is gone once nothing names it
  EXPECT_TRUE(verify_checkpoint(dir).intact());
  const StateDict plain = load_plain_tensors(dir);
  EXPECT_FALSE(plain.contains("optimizer.a"));
  EXPECT_TRUE(at::equal(plain.at("model.b").as_tensor(), at::full({4}, 3.0)));
}

TEST(FileIntegrity, VerifyTellsCorruptFromNotACheckpoint) {
  TempDir tmp("verify-status");
  EXPECT_EQ(verify_checkpoint(tmp.path() + "/absent").status, VerifyReport::Status::kNotACheckpoint);
  EXPECT_EQ(verify_checkpoint(tmp.path()).status, VerifyReport::Status::kNotACheckpoint);
  io::write_file_atomic(tmp.path() + "/metadata.json", R"({"sharded_backend": "torch_dist"})");
  const VerifyReport foreign = verify_checkpoint(tmp.path());
  EXPECT_EQ(foreign.status, VerifyReport::Status::kNotACheckpoint);
  EXPECT_NE(foreign.problems.at(0).find("written by 'torch_dist'"), std::string::npos);
  // A save that never committed: our files, no marker.
  const std::string dir = save_small(tmp);
  io::remove_tree(dir + "/metadata.json");
  const VerifyReport uncommitted = verify_checkpoint(dir);
  EXPECT_EQ(uncommitted.status, VerifyReport::Status::kCorrupt);
  EXPECT_NE(uncommitted.problems.at(0).find("a save that never committed"), std::string::npos);
}

}  // namespace
}  // namespace distckpt
