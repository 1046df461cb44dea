// format layer: metadata.json, the commit marker.
#include "format/commit.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "distckpt/core/errors.h"
#include "io/file.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

TEST(FormatCommitTest, MarkerRoundTrip) {
  TempDir dir("commit");
  EXPECT_FALSE(maybe_load_config(dir.path()).has_value());
  EXPECT_FALSE(is_distributed_checkpoint(dir.path()));
  EXPECT_FALSE(maybe_load_config(dir.file("absent")).has_value());

  CheckpointConfig config;
  config.world_size = 4;  // everything else: this build's values
  write_commit_marker(dir.path(), config);
  auto written = nlohmann::json::parse(io::read_file(dir.file("metadata.json"), 4096));
  const std::string created_by = written.at("created_by").get<std::string>();
  EXPECT_EQ(created_by.rfind("distckpt ", 0), 0u) << created_by;  // "distckpt <library version>"
  EXPECT_GT(created_by.size(), 9u);
  written.erase("created_by");
  const nlohmann::json expected = {{"format", "distckpt"},
                                   {"version", 1},
                                   {"sharded_backend", "distckpt-fb"},
                                   {"common_backend", "distckpt-fb"},
                                   {"world_size", 4}};
  EXPECT_EQ(written, expected);
  const auto loaded = maybe_load_config(dir.path());
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->format, "distckpt");
  EXPECT_EQ(loaded->version, 1);
  EXPECT_EQ(loaded->sharded_backend, "distckpt-fb");
  EXPECT_EQ(loaded->common_backend, "distckpt-fb");
  EXPECT_EQ(loaded->world_size, 4);
  EXPECT_EQ(loaded->created_by, created_by);
  EXPECT_TRUE(is_distributed_checkpoint(dir.path()));
  config.world_size = 0;
  EXPECT_TRUE(throws_with<Error>([&] { write_commit_marker(dir.path(), config); }, "world_size 0 is not valid"));
}

TEST(FormatCommitTest, RejectsForeignMalformedAndNewerMarkers) {
  TempDir dir("commit");
  const std::string path = dir.file("metadata.json");
  const auto load_with = [&](const std::string& text) {
    io::write_file_atomic(path, text);
    return [&] { maybe_load_config(dir.path()); };
  };
  const std::string ok_tail = R"("sharded_backend": "distckpt-fb", "common_backend": "distckpt-fb", "world_size": 2})";
  EXPECT_TRUE(throws_with<CheckpointError>(load_with("{not json"), path + ": malformed JSON"));
  EXPECT_TRUE(throws_with<CheckpointError>(load_with("[1, 2]"), path + ": expected a JSON object"));
  EXPECT_TRUE(throws_with<CheckpointError>(load_with(R"({"format": "distckpt", "version": "1", )" + ok_tail),
                                           "field \"version\" is missing or not an integer"));
  EXPECT_TRUE(throws_with<CheckpointError>(load_with(R"({"format": "distckpt", "version": 1, "world_size": 2})"),
                                           "field \"sharded_backend\" is missing or not a string"));
  EXPECT_TRUE(throws_with<CheckpointError>(
      load_with(R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch"})"),
      path + ": was written by 'torch_dist', not distckpt"));
  EXPECT_TRUE(throws_with<CheckpointError>(load_with(R"({"format": "zarr"})"), "was written by 'zarr', not distckpt"));
  EXPECT_TRUE(throws_with<CheckpointError>(load_with(R"({"format": "distckpt", "version": 2, )" + ok_tail),
                                           "checkpoint format version 2 is newer than this build of distckpt reads "
                                           "(version 1); upgrade distckpt"));
  EXPECT_TRUE(throws_with<CorruptionError>(load_with(std::string(2 << 20, ' ')), "more than the 1048576 bytes"));
}

}  // namespace
}  // namespace distckpt
