// Checkpoints on an S3-protocol server (moto_server on loopback), saved and
// loaded by ranks of a real Gloo group: round trips with resharding, an
// asynchronous save with background staging, the manager's tracker and
// retention, and the failure paths through the fault-injecting proxy.
//
// moto 5.2 checks a signature against the URL as its web framework decoded
// it, which fails for a listing whose prefix holds a '/' (every checkpoint
// below a bucket's root); these tests use the server that checks none.
// Signatures are checked against moto in s3_client_test.cpp and against
// AWS's and botocore's vectors in s3_sigv4_test.cpp.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "distckpt/api/checkpoint_manager.h"
#include "distckpt/save/async.h"
#include "distckpt/storage/backend.h"
#include "format/commit.h"
#include "multirank/checkpoint_fixtures.h"
#include "storage/object_commit.h"
#include "storage/s3/client.h"
#include "support/ranks.h"
#include "support/s3_server.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// A fresh prefix of the test bucket per test.
std::string fresh_prefix(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::random_device random;
  return fmt::format("s3://{}/{}-{:08x}-{}", MotoServer::kBucket, tag, random(), counter++);
}

// The key of `url`'s prefix inside the bucket.
std::string key_of(const std::string& url) {
  return url.substr(std::string("s3://").size() + std::string(MotoServer::kBucket).size() + 1);
}

// Rows of a [rows, 1024] float tensor over the ranks (4 KiB per row), an
// object per rank and a common value.
StateDict model(int rank, int world, int64_t rows, double bump) {
  StateDict sd = Value::dict();
  const int64_t mine = rows / world;
  sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", {rows, 1024}).narrow(0, mine * rank, mine) + bump,
                                             {{0, rank, world}});
  sd["bias"] = ShardedTensor::from_rank_offsets("bias", global_tensor("bias", {1024}) + bump, {}, {rank});
  sd["rng"] = ShardedObject{"rng", "state-" + std::to_string(rank), {world}, {rank}};
  sd["iteration"] = static_cast<int64_t>(bump);
  return sd;
}

// Loads `w` by rows over `world` ranks and checks every value; returns the
// bytes the ranks fetched from storage, together.
uint64_t expect_loads(const std::string& where, int world, int64_t rows, double bump) {
  std::atomic<uint64_t> fetched{0};
  run_ranks(world, [&](Communicator& comm) {
    StateDict request = Value::dict();
    const int64_t mine = rows / world;
    request["w"] = ShardedTensor::from_rank_offsets("w", at::empty({mine, 1024}), {{0, comm.rank(), world}});
    const LoadResult r = load(request, where, comm);
    EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(),
                          global_tensor("w", {rows, 1024}).narrow(0, mine * comm.rank(), mine) + bump));
    EXPECT_EQ(r.state_dict.at("iteration").as_int(), static_cast<int64_t>(bump));
    fetched += r.bytes_read;
  });
  return fetched;
}

std::vector<std::string> digest_lines(const std::string& where) {
  std::vector<std::string> lines;
  for (const TensorDigest& d : digest_checkpoint(where)) lines.push_back(d.line());
  return lines;
}

class S3Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = MotoServer::shared(MotoServer::Signatures::kUnchecked);
    if (!server_) GTEST_SKIP() << kMotoMissing;
    server_->export_environment();
    unsetenv("AWS_MAX_ATTEMPTS");
  }
  s3::Client client() const { return s3::Client(server_->config(), MotoServer::kBucket); }
  std::vector<std::string> keys_under(const std::string& url) {
    std::vector<std::string> keys;
    for (const s3::ListedObject& o : client().list_objects(key_of(url) + "/")) keys.push_back(o.key);
    return keys;
  }
  MotoServer* server_ = nullptr;
};

TEST_F(S3Checkpoints, SavedByFourRanksLoadsUnderTwoWithEqualDigests) {
  TempDir tmp("s3-round-trip");
  const std::string url = fresh_prefix("round-trip");
  run_ranks(4, [&](Communicator& comm) {
    save(model(comm.rank(), 4, 64, 1), url, comm);
    save(model(comm.rank(), 4, 64, 1), tmp.path() + "/local", comm);
  });
  EXPECT_TRUE(is_distributed_checkpoint(url));
  EXPECT_EQ(digest_lines(url), digest_lines(tmp.path() + "/local"));
  // Resharded (4 writers, 2 readers): every stored byte of `w` fetched once, no other.
  EXPECT_EQ(expect_loads(url, 2, 64, 1), uint64_t{64} * 1024 * sizeof(float));
  // Ordinary objects: each rank's data object under the save's id, the metadata, the marker last.
  const std::vector<std::string> keys = keys_under(url);
  EXPECT_EQ(std::count_if(keys.begin(), keys.end(),
                          [](const std::string& k) { return k.find("/data/") != std::string::npos; }),
            4);
  EXPECT_NE(std::find(keys.begin(), keys.end(), key_of(url) + "/metadata.json"), keys.end());
  // Saving again is refused, and overwriting replaces every object of the old one.
  EXPECT_THROW(run_ranks(4, [&](Communicator& comm) { save(model(comm.rank(), 4, 64, 2), url, comm); }),
               CheckpointError);
  run_ranks(4, [&](Communicator& comm) {
    SaveOptions options;
    options.overwrite = true;
    save(model(comm.rank(), 4, 64, 2), url, comm, options);
  });
  expect_loads(url, 4, 64, 2);
  const std::vector<std::string> after = keys_under(url);
  EXPECT_EQ(after.size(), keys.size());  // none of the first save's objects left
  for (const std::string& k : after) {
    if (k.find("/data/") != std::string::npos) {
      EXPECT_EQ(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
    }
  }
}

TEST_F(S3Checkpoints, AnAsyncSaveWithBackgroundStagingCommitsOnFinalize) {
  const std::string url = fresh_prefix("async");
  run_ranks(2, [&](Communicator& comm) {
    AsyncQueueOptions options;
    options.staging = AsyncStaging::kInBackground;
    AsyncCallsQueue queue(comm, options);
    StateDict sd = model(comm.rank(), 2, 64, 3);
    queue.save(sd, url);
    queue.wait_staged();
    sd.at("w").as_sharded_tensor().data.fill_(-5);  // after staging: not in the checkpoint
    EXPECT_FALSE(is_distributed_checkpoint(url));   // not before finalize
    queue.close();
  });
  expect_loads(url, 4, 64, 3);
}

TEST_F(S3Checkpoints, TheManagerTracksPrunesAndListsUnderAPrefix) {
  const std::string root = fresh_prefix("manager");
  run_ranks(2, [&](Communicator& comm) {
    CheckpointManager manager(root, /*keep_last=*/2);
    for (int64_t it : {10, 20, 30}) manager.save(model(comm.rank(), 2, 16, static_cast<double>(it)), it, comm);
    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("w", at::empty({8, 1024}), {{0, comm.rank(), 2}});
    const LatestLoadResult r = manager.load_latest(request, comm);
    EXPECT_EQ(r.iteration, 30);
  });
  const std::vector<CheckpointEntry> entries = CheckpointManager(root).list();
  ASSERT_EQ(entries.size(), 2U);
  EXPECT_EQ(entries[0].iteration, 20);
  EXPECT_EQ(entries[1].iteration, 30);
  EXPECT_TRUE(entries[1].latest && entries[1].committed);
  EXPECT_TRUE(keys_under(root + "/iter_0000010").empty());
}

TEST_F(S3Checkpoints, OfTwoSavesCommittingOnePrefixExactlyOneWins) {
  const std::string url = fresh_prefix("race");
  const std::unique_ptr<Backend> backend = open_backend(url);
  CheckpointMetadata metadata;
  metadata.world_size = 1;
  const uint64_t first = storage::new_save_id(), second = storage::new_save_id();
  // Both wrote their objects; both find the prefix free when they claim it.
  storage::claim_object_prefix(*backend, false);
  storage::claim_object_prefix(*backend, false);
  storage::commit_objects(*backend, metadata, "first", false, first);
  EXPECT_THROW(storage::commit_objects(*backend, metadata, "second", false, second), CheckpointError);
  storage::discard_objects(*backend, second);
  // The first one's marker stands, naming its own metadata object.
  const std::string marker = backend->read_small(kCommitFile, 1 << 16);
  EXPECT_NE(marker.find(fmt::format("metadata.{:016x}.fb", first)), std::string::npos) << marker;
  EXPECT_FALSE(backend->size_of(fmt::format("common.{:016x}.fb", second)).has_value());
  EXPECT_THROW(storage::claim_object_prefix(*backend, false), CheckpointError);
}

// Objects of one part exactly, of several, and of a part and a byte: each
// reads back as written (a full first part goes to upload at once; the
// object must still be that upload, not a PUT of what is left).
TEST_F(S3Checkpoints, ObjectsAroundThePartSizeReadBackExactly) {
  setenv("DISTCKPT_S3_PART_MB", "5", 1);
  const std::unique_ptr<Backend> backend = open_backend(fresh_prefix("parts"));
  unsetenv("DISTCKPT_S3_PART_MB");
  const uint64_t part = uint64_t{5} << 20;
  for (const uint64_t size : {part - 1, part, part + 1, 3 * part}) {
    std::vector<uint8_t> bytes(size);
    for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    const std::string name = "object-" + std::to_string(size);
    const std::unique_ptr<ObjectWriter> writer = backend->create(name, size);
    for (uint64_t at = 0; at < size; at += 1 << 20) {
      writer->write(at, bytes.data() + at, std::min<uint64_t>(1 << 20, size - at));
    }
    writer->finish(size);
    std::vector<uint8_t> back(size);
    backend->open(name)->read(0, size, back.data());
    EXPECT_TRUE(back == bytes) << size;
  }
  EXPECT_TRUE(client().list_multipart_uploads(key_of(backend->location()) + "/").empty());
}

// Tensors only (safetensors holds no objects): rows of `w`, columns of `v`.
StateDict tensors_only(int rank, int world) {
  StateDict sd = Value::dict();
  const int64_t rows = 4096 / world, columns = 1024 / world;
  sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", {4096, 1024}).narrow(0, rows * rank, rows),
                                             {{0, rank, world}});
  sd["v"] = ShardedTensor::from_rank_offsets("v", global_tensor("v", {1024, 1024}).narrow(1, columns * rank, columns),
                                             {{1, rank, world}});
  sd["note"] = std::string("saved by the ranks");
  return sd;
}

TEST_F(S3Checkpoints, SafetensorsSavedByTheRanksEqualTheLocalFilesByteForByte) {
  TempDir tmp("s3-safetensors");
  const std::string url = fresh_prefix("safetensors");
  run_ranks(4, [&](Communicator& comm) {
    SaveOptions options;
    SafetensorsWriteOptions knobs;
    knobs.max_shard_bytes = uint64_t{12} << 20;  // two files, the first over one window
    options.format = safetensors_format(knobs);
    save(tensors_only(comm.rank(), 4), url, comm, options);
    save(tensors_only(comm.rank(), 4), tmp.path() + "/local", comm, options);
  });
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path() + "/local")) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected;
  for (const std::string& name : names) expected.push_back(key_of(url) + "/" + name);
  EXPECT_EQ(keys_under(url), expected);  // the files and the index, nothing staged left
  for (const std::string& name : names) {
    std::ifstream in(tmp.path() + "/local/" + name, std::ios::binary);
    const std::string local((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(client().get_object(key_of(url) + "/" + name, local.size() + 1) == local) << name;
  }
  EXPECT_EQ(digest_lines(url), digest_lines(tmp.path() + "/local"));
}

// The proxy's faults, over objects large enough for multipart uploads
// (5 MiB parts; each rank writes 8 MiB).
class S3CheckpointFaults : public S3Checkpoints {
 protected:
  void SetUp() override {
    S3Checkpoints::SetUp();
    if (!server_) return;
    proxy_ = std::make_unique<FaultProxy>(*server_);
    server_->export_environment(proxy_->endpoint());
    setenv("DISTCKPT_S3_PART_MB", "5", 1);
  }
  void TearDown() override {
    unsetenv("DISTCKPT_S3_PART_MB");
    unsetenv("AWS_MAX_ATTEMPTS");
  }
  std::unique_ptr<FaultProxy> proxy_;
};

TEST_F(S3CheckpointFaults, SlowDownsAndResetsOnPartsAreRetriedAndTheSaveCommits) {
  const std::string url = fresh_prefix("retried");
  proxy_->set_rules(R"([{"method": "PUT", "query": "partNumber=", "action": "slowdown", "every": 2},
                        {"method": "PUT", "query": "partNumber=", "action": "reset", "nth": [3]}])");
  run_ranks(2, [&](Communicator& comm) { save(model(comm.rank(), 2, 4096, 4), url, comm); });
  EXPECT_GE(proxy_->faults().size(), 3U);
  expect_loads(url, 2, 4096, 4);
}

TEST_F(S3CheckpointFaults, ASpentRetryBudgetFailsEveryRankAlikeAndLeavesNothing) {
  const std::string url = fresh_prefix("spent");
  setenv("AWS_MAX_ATTEMPTS", "2", 1);
  proxy_->set_rules(R"([{"method": "PUT", "query": "partNumber=2", "action": "slowdown"}])");
  std::vector<std::string> classes(2), messages(2);
  EXPECT_ANY_THROW(run_ranks(2, [&](Communicator& comm) {
    try {
      save(model(comm.rank(), 2, 4096, 5), url, comm);
    } catch (const Error& e) {
      classes[comm.rank()] = e.class_name();
      messages[comm.rank()] = e.what();
      throw;
    }
  }));
  EXPECT_EQ(classes[0], classes[1]);
  EXPECT_EQ(classes[0], "IoError");
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("503"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("SlowDown"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("/data/"), std::string::npos) << messages[0];  // the object
  // Nothing left: no marker, no object, no multipart upload.
  EXPECT_FALSE(is_distributed_checkpoint(url));
  EXPECT_TRUE(keys_under(url).empty());
  EXPECT_TRUE(client().list_multipart_uploads(key_of(url) + "/").empty());
}

TEST_F(S3CheckpointFaults, ALoadThatMeetsCutBodiesRetriesThem) {
  const std::string url = fresh_prefix("cut");
  run_ranks(2, [&](Communicator& comm) { save(model(comm.rank(), 2, 4096, 6), url, comm); });
  proxy_->set_rules(R"([{"method": "GET", "path": "/data/", "action": "truncate", "first": 2}])");
  expect_loads(url, 2, 4096, 6);
  EXPECT_EQ(proxy_->faults().size(), 2U);
}

}  // namespace
}  // namespace distckpt
