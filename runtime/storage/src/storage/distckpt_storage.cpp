#include "storage/distckpt_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "distckpt/core/errors.h"
#include "format/commit.h"
#include "format/common_state.h"
#include "format/metadata.h"
#include "io/file.h"

namespace distckpt::storage {
namespace {

// metadata.fb and common.fb are FlatBuffers, which cannot exceed 2 GiB: a
// larger file is refused before it is read.
constexpr uint64_t kMaxFlatBufferBytes = (uint64_t{1} << 31) - 1;

// Whether `dir` is a root of iter_* checkpoints (CheckpointManager's layout)
// rather than a checkpoint.
bool holds_iterations(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.path().filename().string().rfind("iter_", 0) == 0) return true;
  }
  return false;
}

}  // namespace

DistckptStorage::DistckptStorage(std::string dir, bool verify_checksums, bool check_every_file) : dir_(std::move(dir)) {
  std::optional<CheckpointConfig> config = maybe_load_config(dir_);
  if (!config) {
    if (const std::optional<std::string> writer = checkpoint_writer(dir_)) {
      throw CheckpointError(fmt::format("{}/{}: was written by '{}', not distckpt; load it with the tool that wrote it",
                                        dir_, kCommitFile, *writer),
                            io::safe_join(dir_, kCommitFile));
    }
    if (!io::exists(dir_)) throw CheckpointError(fmt::format("'{}' does not exist", dir_), dir_);
    throw CheckpointError(
        fmt::format(
            "'{}' holds no committed distckpt checkpoint ({} is missing): the save never finished or the path is "
            "wrong{}",
            dir_, kCommitFile,
            holds_iterations(dir_)
                ? fmt::format("; it holds iter_* checkpoints: pass one of them (`distckpt ls {}` lists them)", dir_)
                : ""),
        dir_);
  }
  config_ = std::move(*config);
  // Version 1 markers record no checksums: the file name is fixed.
  const std::string path = io::safe_join(dir_, config_.metadata ? config_.metadata->path : kMetadataFile);
  const std::string bytes = io::read_file_inside(dir_, path, kMaxFlatBufferBytes);
  if (config_.metadata) check_recorded_file(*config_.metadata, bytes, path);
  metadata_ = decode_metadata(bytes, path);
  if (metadata_.format_version != static_cast<uint32_t>(config_.version) ||
      metadata_.world_size != config_.world_size) {
    throw CorruptionError(
        fmt::format(
            "{}: format version {} and world size {} disagree with the commit marker's (version {}, {} ranks); the "
            "checkpoint is corrupt or mixes files of two checkpoints",
            path, metadata_.format_version, metadata_.world_size, config_.version, config_.world_size),
        path);
  }
  if (config_.common && config_.common->path != metadata_.common_file) {
    throw CorruptionError(
        fmt::format("{}: the common state file is '{}' but the commit marker records '{}'; the checkpoint is corrupt",
                    path, metadata_.common_file, config_.common->path),
        path);
  }
  if (check_every_file) check_files(metadata_, dir_);
  ranges_ = std::make_unique<FileRanges>(dir_, metadata_, verify_checksums);
}

std::string DistckptStorage::common_bytes(std::string& path) const {
  path = io::safe_join(dir_, metadata_.common_file);
  io::File file;
  try {
    file = io::open_inside(dir_, path);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) throw missing_listed_file(path);  // as check_files says it
    throw;
  }
  std::string bytes =
      io::read_all(file, std::min(config_.common ? config_.common->bytes : file.size(), kMaxFlatBufferBytes));
  if (config_.common) check_recorded_file(*config_.common, bytes, path);
  return bytes;
}

Value DistckptStorage::read_common_state() const {
  if (metadata_.common_file.empty()) return Value::dict();
  std::string path;
  const std::string bytes = common_bytes(path);
  return decode_common_state(bytes, path);
}

std::optional<Value> DistckptStorage::read_content_metadata() const {
  if (metadata_.common_file.empty()) return std::nullopt;
  std::string path;
  const std::string bytes = common_bytes(path);
  return decode_content_metadata(bytes, path);
}

void DistckptStorage::verify(VerifyReport& report, const VerifyProgress& progress) {
  report.format_version = config_.version;
  report.files += 2 + metadata_.files.size() + (metadata_.common_file.empty() ? 0 : 1);
  try {
    read_common_state();
  } catch (const Error& e) {
    report.problems.push_back(e.what());
  }
  ranges_->verify_all(report, progress);
}

}  // namespace distckpt::storage
