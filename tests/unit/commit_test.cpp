// format layer: metadata.json, the commit marker.
#include "format/commit.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "distckpt/core/errors.h"
#include "distckpt/distckpt.h"
#include "io/checksum.h"
#include "io/file.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

// What save records: the metadata and common files with sizes and hashes,
// and the metadata's head (its first 8 bytes here).
CheckpointConfig v3_config(int world_size) {
  CheckpointConfig config;
  config.world_size = world_size;  // everything else: this build's values
  config.metadata = record_file("metadata.fb", "metadata bytes");
  config.metadata->head_bytes = 8;
  config.metadata->head_xxh3 = io::xxh3("metadata", 8);
  config.common = record_file("common.fb", "common bytes");
  return config;
}

TEST(FormatCommitTest, MarkerRoundTrip) {
  TempDir dir("commit");
  EXPECT_FALSE(maybe_load_config(dir.path()).has_value());
  EXPECT_FALSE(is_distributed_checkpoint(dir.path()));
  EXPECT_FALSE(maybe_load_config(dir.file("absent")).has_value());

  CheckpointConfig config = v3_config(4);
  write_commit_marker(dir.path(), config);
  auto written = nlohmann::json::parse(io::read_file(dir.file("metadata.json"), 4096));
  const std::string created_by = written.at("created_by").get<std::string>();
  EXPECT_EQ(created_by.rfind("distckpt ", 0), 0u) << created_by;  // "distckpt <library version>"
  EXPECT_GT(created_by.size(), 9u);
  written.erase("created_by");
  const nlohmann::json expected = {
      {"format", "distckpt"},
      {"version", 3},
      {"sharded_backend", "distckpt-fb"},
      {"common_backend", "distckpt-fb"},
      {"world_size", 4},
      {"metadata",
       {{"file", "metadata.fb"},
        {"bytes", 14},
        {"xxh3", io::hex64(io::xxh3("metadata bytes", 14))},
        {"head_bytes", 8},
        {"head_xxh3", io::hex64(io::xxh3("metadata", 8))}}},
      {"common", {{"file", "common.fb"}, {"bytes", 12}, {"xxh3", io::hex64(io::xxh3("common bytes", 12))}}}};
  EXPECT_EQ(written, expected);
  const auto loaded = maybe_load_config(dir.path());
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->format, "distckpt");
  EXPECT_EQ(loaded->version, 3);
  EXPECT_EQ(loaded->sharded_backend, "distckpt-fb");
  EXPECT_EQ(loaded->common_backend, "distckpt-fb");
  EXPECT_EQ(loaded->sharded_backend_version, 3);  // the format version versions both backends
  EXPECT_EQ(loaded->common_backend_version, 3);
  EXPECT_EQ(loaded->metadata->head_bytes, 8u);
  EXPECT_EQ(loaded->metadata->head_xxh3, io::xxh3("metadata", 8));
  EXPECT_EQ(loaded->world_size, 4);
  EXPECT_EQ(loaded->created_by, created_by);
  ASSERT_TRUE(loaded->metadata && loaded->common);
  EXPECT_EQ(loaded->metadata->path, "metadata.fb");
  EXPECT_EQ(loaded->metadata->bytes, 14u);
  EXPECT_EQ(loaded->metadata->xxh3, io::xxh3("metadata bytes", 14));
  EXPECT_EQ(loaded->common->path, "common.fb");
  EXPECT_TRUE(is_distributed_checkpoint(dir.path()));
  config.world_size = 0;
  EXPECT_TRUE(throws_with<UsageError>([&] { write_commit_marker(dir.path(), config); }, "world_size 0 is not valid"));
  config.world_size = 1;
  config.common.reset();
  EXPECT_TRUE(
      throws_with<UsageError>([&] { write_commit_marker(dir.path(), config); }, "records metadata.fb and common.fb"));
}

TEST(FormatCommitTest, VersionOneMarkersStillParse) {
  const auto v1 = parse_commit_marker(R"({"format": "distckpt", "version": 1, "sharded_backend": "distckpt-fb",
      "common_backend": "distckpt-fb", "world_size": 2, "created_by": "distckpt 0.1.0"})",
                                      "m");
  EXPECT_EQ(v1.version, 1);
  EXPECT_EQ(v1.world_size, 2);
  EXPECT_FALSE(v1.metadata.has_value());
  EXPECT_FALSE(v1.common.has_value());
}

TEST(FormatCommitTest, VersionTwoMarkersAreParsedStrictly) {
  const nlohmann::json good = nlohmann::json::parse(R"({"format": "distckpt", "version": 2,
      "sharded_backend": "distckpt-fb", "common_backend": "distckpt-fb", "world_size": 2, "created_by": "x",
      "metadata": {"file": "metadata.fb", "bytes": 10, "xxh3": "0123456789abcdef"},
      "common": {"file": "common.fb", "bytes": 3, "xxh3": "fedcba9876543210"}})");
  EXPECT_EQ(parse_commit_marker(good.dump(), "m").metadata->xxh3, 0x0123456789abcdefu);
  const auto rejects = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& message) {
    nlohmann::json doc = good;
    edit(doc);
    return throws_with<CorruptionError>([&] { parse_commit_marker(doc.dump(), "m"); }, message);
  };
  EXPECT_TRUE(rejects([](auto& d) { d["extra"] = 1; }, "m: unknown field \"extra\""));
  EXPECT_TRUE(rejects([](auto& d) { d.erase("common"); }, "field \"common\" is missing"));
  EXPECT_TRUE(rejects([](auto& d) { d.erase("created_by"); }, "field \"created_by\" is missing"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["xxh3"] = "0123456789abcdeF"; }, "16 lowercase hex digits"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["xxh3"] = "123"; }, "16 lowercase hex digits"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["bytes"] = -1; }, "field \"bytes\" is out of range"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["size"] = 1; }, "unknown field \"size\""));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["head_bytes"] = 1; }, "unknown field \"head_bytes\""));
  EXPECT_TRUE(rejects([](auto& d) { d["common"]["file"] = "../common.fb"; }, "unsafe path"));
  EXPECT_TRUE(rejects([](auto& d) { d["sharded_backend"] = "distckpt-fc"; }, "unknown backend 'distckpt-fc'"));
  EXPECT_TRUE(rejects([](auto& d) { d["world_size"] = 0; }, "world_size 0 is not valid"));
  EXPECT_TRUE(rejects([](auto& d) { d["version"] = 0; }, "format version 0 is not valid"));
}

TEST(FormatCommitTest, VersionThreeMarkersRecordTheMetadataHead) {
  nlohmann::json good = nlohmann::json::parse(R"({"format": "distckpt", "version": 3,
      "sharded_backend": "distckpt-fb", "common_backend": "distckpt-fb", "world_size": 2, "created_by": "x",
      "metadata": {"file": "metadata.fb", "bytes": 10, "xxh3": "0123456789abcdef", "head_bytes": 4,
                   "head_xxh3": "00000000000000ff"},
      "common": {"file": "common.fb", "bytes": 3, "xxh3": "fedcba9876543210"}})");
  const CheckpointConfig config = parse_commit_marker(good.dump(), "m");
  EXPECT_EQ(config.metadata->head_bytes, 4u);
  EXPECT_EQ(config.metadata->head_xxh3, 0xffu);
  const auto rejects = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& message) {
    nlohmann::json doc = good;
    edit(doc);
    return throws_with<CorruptionError>([&] { parse_commit_marker(doc.dump(), "m"); }, message);
  };
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"].erase("head_bytes"); }, "field \"head_bytes\" is missing"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"].erase("head_xxh3"); }, "field \"head_xxh3\" is missing"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["head_bytes"] = 11; }, "field \"head_bytes\" is out of range"));
  EXPECT_TRUE(rejects([](auto& d) { d["metadata"]["head_xxh3"] = "ff"; }, "16 lowercase hex digits"));
  EXPECT_TRUE(rejects([](auto& d) { d["common"]["head_bytes"] = 1; }, "unknown field \"head_bytes\""));
  // A writer must say where the head ends.
  CheckpointConfig no_head = v3_config(2);
  no_head.metadata->head_bytes = 0;
  EXPECT_THROW(encode_commit_marker(no_head), UsageError);
}

TEST(FormatCommitTest, RecordedFilesCatchEveryChange) {
  const RecordedFile record = record_file("common.fb", "abcd");
  check_recorded_file(record, "abcd", "/c/common.fb");
  EXPECT_TRUE(throws_with<CorruptionError>([&] { check_recorded_file(record, "abce", "/c/common.fb"); },
                                           "checksum mismatch in /c/common.fb"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { check_recorded_file(record, "abc", "/c/common.fb"); },
                                           "/c/common.fb has 3 bytes but the commit marker (metadata.json) records 4"));
}

TEST(FormatCommitTest, RejectsForeignMalformedAndNewerMarkers) {
  TempDir dir("commit");
  const std::string path = dir.file("metadata.json");
  const auto load_with = [&](const std::string& text) {
    io::write_file_atomic(path, text);
    return [&] { maybe_load_config(dir.path()); };
  };
  const std::string ok_tail = R"("sharded_backend": "distckpt-fb", "common_backend": "distckpt-fb", "world_size": 2})";
  EXPECT_TRUE(throws_with<CorruptionError>(load_with("{not json"), path + ": malformed JSON"));
  EXPECT_TRUE(throws_with<CorruptionError>(load_with("[1, 2]"), path + ": expected a JSON object"));
  EXPECT_TRUE(throws_with<CorruptionError>(load_with(R"({"format": "distckpt", "version": "1", )" + ok_tail),
                                           "field \"version\" is not an integer"));
  EXPECT_TRUE(throws_with<CorruptionError>(load_with(R"({"format": "distckpt", "version": 1, "world_size": 2})"),
                                           "field \"sharded_backend\" is missing"));
  EXPECT_TRUE(throws_with<CheckpointError>(load_with(R"({"format": "distckpt", "version": 4, )" + ok_tail),
                                           "checkpoint format version 4 is newer than this build of distckpt reads "
                                           "(version 3); upgrade distckpt"));
  EXPECT_TRUE(throws_with<CorruptionError>(load_with(std::string(2 << 20, ' ')), "more than the 1048576 bytes"));
}

// Megatron's maybe_load_config answers for its own markers only: another
// tool's checkpoint is "not a distributed checkpoint" here, and
// checkpoint_writer says which tool wrote it; loading and verifying it name the tool.
TEST(FormatCommitTest, AMarkerAnotherToolWroteIsNotADistckptCheckpoint) {
  TempDir dir("commit-foreign");
  const std::string marker = dir.file("metadata.json");
  EXPECT_EQ(checkpoint_writer(dir.path()), std::nullopt);
  for (const auto& [text, writer] :
       {std::pair<std::string, std::string>{
            R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch"})",
            "torch_dist"},
        {R"({"format": "zarr"})", "zarr"},
        {R"({"version": 1})", "an unknown program"}}) {
    io::write_file_atomic(marker, text);
    EXPECT_EQ(maybe_load_config(dir.path()), std::nullopt) << text;
    EXPECT_FALSE(is_distributed_checkpoint(dir.path())) << text;
    EXPECT_EQ(checkpoint_writer(dir.path()), writer) << text;
    EXPECT_TRUE(throws_with<CheckpointError>([&] { load_common_state_dict(dir.path()); },
                                             marker + ": was written by '" + writer + "', not distckpt"));
    const VerifyReport report = verify_checkpoint(dir.path());
    EXPECT_EQ(report.status, VerifyReport::Status::kNotACheckpoint) << text;
  }
  io::write_file_atomic(marker, "{damaged");
  EXPECT_TRUE(throws_with<CorruptionError>([&] { checkpoint_writer(dir.path()); }, "malformed JSON"));
  write_commit_marker(dir.path(), [] {
    CheckpointConfig c;
    c.version = 1;
    c.world_size = 1;
    return c;
  }());
  EXPECT_EQ(checkpoint_writer(dir.path()), std::string("distckpt"));
}

}  // namespace
}  // namespace distckpt
