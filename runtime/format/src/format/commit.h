// metadata.json: written last by the coordinator; its presence marks a
// committed checkpoint. The reading side is public (checkpoint_config.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "distckpt/format/checkpoint_config.h"

namespace distckpt {

constexpr const char* kCommitFile = "metadata.json";
constexpr const char* kMetadataFile = "metadata.fb";
constexpr const char* kCommonFile = "common.fb";

// The marker's text parsed and checked (what maybe_load_config does after
// reading the file); `origin` names it in errors.
CheckpointConfig parse_commit_marker(std::string_view text, const std::string& origin);
// The same, but nullopt for a marker another program wrote (a Megatron
// torch_dist checkpoint's metadata.json, say).
std::optional<CheckpointConfig> config_of_marker(std::string_view text, const std::string& origin);
// "distckpt", or the other program's name as its marker gives it; throws
// CorruptionError for a damaged marker of ours.
std::string writer_of_marker(std::string_view text, const std::string& origin);
// The largest marker a reader accepts.
uint64_t max_commit_marker_bytes();

// The marker of a checkpoint of this build's format whose metadata and
// common state are the recorded files.
CheckpointConfig commit_config(int world_size, RecordedFile metadata, RecordedFile common);
// The marker's text (UsageError for a config no reader would accept).
std::string encode_commit_marker(const CheckpointConfig& config);
// Writes DIR/metadata.json atomically (temp + fsync + rename + dir fsync).
void write_commit_marker(const std::string& dir, const CheckpointConfig& config);

// The record of `bytes` stored as DIR-relative `path`.
RecordedFile record_file(const std::string& path, std::string_view bytes);
// The same for an encoded metadata.fb: with its head too.
RecordedFile record_metadata(const std::string& path, std::string_view encoded);
// Throws CorruptionError (naming `full_path`) unless `bytes` has the recorded
// size and XXH3.
void check_recorded_file(const RecordedFile& record, std::string_view bytes, const std::string& full_path);
// The same for the size alone, and for metadata.fb's head (its first
// record.head_bytes bytes) alone.
void check_recorded_size(const RecordedFile& record, uint64_t actual, const std::string& full_path);
void check_recorded_head(const RecordedFile& record, std::string_view head, const std::string& full_path);

}  // namespace distckpt
