#include "storage/distckpt_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/errors.h"
#include "format/commit.h"
#include "format/common_state.h"
#include "format/metadata.h"
#include "storage/commit_marker.h"

namespace distckpt::storage {
namespace {

// metadata.fb and common.fb are FlatBuffers, which cannot exceed 2 GiB: a
// larger file is refused before it is read.
constexpr uint64_t kMaxFlatBufferBytes = (uint64_t{1} << 31) - 1;

// A file the metadata (or the marker) lists: a missing one means an
// incomplete checkpoint.
std::string read_listed(Backend& backend, const std::string& name, uint64_t max_bytes) {
  try {
    return backend.read_small(name, max_bytes);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) throw missing_listed_file(backend.describe(name));
    throw;
  }
}

}  // namespace

void check_listed_files(const CheckpointMetadata& metadata, Backend& backend) {
  // Each file must be a regular object inside the checkpoint (a FIFO or a
  // device would make a read block or return other bytes; a link out of it
  // would read another file) with exactly the recorded size.
  std::vector<std::string> names;
  names.reserve(metadata.files.size() + 1);
  for (const FileRecord& f : metadata.files) names.push_back(f.path);
  if (!metadata.common_file.empty()) names.push_back(metadata.common_file);
  const std::vector<std::optional<uint64_t>> sizes = backend.sizes_of(names);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!sizes[i]) throw missing_listed_file(backend.describe(names[i]));
    if (i < metadata.files.size()) check_file_size(backend.describe(names[i]), *sizes[i], metadata.files[i].size);
  }
}

DistckptStorage::DistckptStorage(std::shared_ptr<Backend> backend, bool verify_checksums, bool check_every_file)
    : backend_(std::move(backend)) {
  const std::optional<std::string> marker = read_commit_marker(*backend_);
  std::optional<CheckpointConfig> config =
      marker ? config_of_marker(*marker, backend_->describe(kCommitFile)) : std::nullopt;
  const std::string& where = backend_->location();
  if (!config) {
    if (marker) {
      throw CheckpointError(
          fmt::format("{}: was written by '{}', not distckpt; load it with the tool that wrote it",
                      backend_->describe(kCommitFile), writer_of_marker(*marker, backend_->describe(kCommitFile))),
          backend_->describe(kCommitFile));
    }
    if (!backend_->root_exists()) throw CheckpointError(fmt::format("'{}' does not exist", where), where);
    throw CheckpointError(
        fmt::format(
            "'{}' holds no committed distckpt checkpoint ({} is missing): the save never finished or the path is "
            "wrong{}",
            where, kCommitFile,
            !backend_->list("iter_", 1).empty()
                ? fmt::format("; it holds iter_* checkpoints: pass one of them (`distckpt ls {}` lists them)", where)
                : ""),
        where);
  }
  config_ = std::move(*config);
  // Version 1 markers record no checksums: the file name is fixed.
  const std::string name = config_.metadata ? config_.metadata->path : kMetadataFile;
  const std::string path = backend_->describe(name);
  std::string bytes = read_listed(*backend_, name, kMaxFlatBufferBytes);
  if (config_.metadata) check_recorded_file(*config_.metadata, bytes, path);
  lazy_ = std::make_unique<LazyMetadata>(std::move(bytes), path);
  const CheckpointMetadata& opened = lazy_->header();
  if (opened.format_version != static_cast<uint32_t>(config_.version) || opened.world_size != config_.world_size) {
    throw CorruptionError(
        fmt::format(
            "{}: format version {} and world size {} disagree with the commit marker's (version {}, {} ranks); the "
            "checkpoint is corrupt or mixes files of two checkpoints",
            path, opened.format_version, opened.world_size, config_.version, config_.world_size),
        path);
  }
  if (config_.common && config_.common->path != opened.common_file) {
    throw CorruptionError(
        fmt::format("{}: the common state file is '{}' but the commit marker records '{}'; the checkpoint is corrupt",
                    path, opened.common_file, config_.common->path),
        path);
  }
  if (check_every_file) check_listed_files(opened, *backend_);
  ranges_ = std::make_unique<FileRanges>(backend_, opened, verify_checksums);
}

const CheckpointMetadata& DistckptStorage::metadata() const {
  std::call_once(decoded_all_, [&] { all_ = std::make_unique<const CheckpointMetadata>(lazy_->decode_all()); });
  return *all_;
}

const TensorRecord& DistckptStorage::tensor_at(size_t i) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<TensorRecord>& slot = decoded_[i];
  if (!slot) {
    try {
      slot = std::make_unique<TensorRecord>(lazy_->tensor(i));
    } catch (...) {
      decoded_.erase(i);
      throw;
    }
  }
  return *slot;
}

size_t DistckptStorage::tensors_decoded() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return decoded_.size();
}

std::string DistckptStorage::common_bytes(std::string& path) const {
  path = backend_->describe(header().common_file);
  std::string bytes =
      read_listed(*backend_, header().common_file,
                  std::min(config_.common ? config_.common->bytes : kMaxFlatBufferBytes, kMaxFlatBufferBytes));
  if (config_.common) check_recorded_file(*config_.common, bytes, path);
  return bytes;
}

Value DistckptStorage::read_common_state() const {
  if (header().common_file.empty()) return Value::dict();
  std::string path;
  const std::string bytes = common_bytes(path);
  return decode_common_state(bytes, path);
}

std::optional<Value> DistckptStorage::read_content_metadata() const {
  if (header().common_file.empty()) return std::nullopt;
  std::string path;
  const std::string bytes = common_bytes(path);
  return decode_content_metadata(bytes, path);
}

void DistckptStorage::verify(VerifyReport& report, const VerifyProgress& progress) {
  report.format_version = config_.version;
  report.files += 2 + header().files.size() + (header().common_file.empty() ? 0 : 1);
  try {
    read_common_state();
  } catch (const Error& e) {
    report.problems.push_back(e.what());
  }
  ranges_->verify_all(metadata(), report, progress);
}

}  // namespace distckpt::storage
