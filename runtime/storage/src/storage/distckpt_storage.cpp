#include "storage/distckpt_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

void check_listed_files(const std::vector<FileRecord>& files, const std::string& common_file, Backend& backend) {
  // Each file must be a regular object inside the checkpoint (a FIFO or a
  // device would make a read block or return other bytes; a link out of it
  // would read another file) with exactly the recorded size.
  std::vector<std::string> names;
  names.reserve(files.size() + 1);
  for (const FileRecord& f : files) names.push_back(f.path);
  if (!common_file.empty()) names.push_back(common_file);
  const std::vector<std::optional<uint64_t>> sizes = backend.sizes_of(names);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!sizes[i]) throw missing_listed_file(backend.describe(names[i]));
    if (i < files.size()) check_file_size(backend.describe(names[i]), *sizes[i], files[i].size);
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
  metadata_name_ = config_.metadata ? config_.metadata->path : kMetadataFile;
  const std::string path = backend_->describe(metadata_name_);
  if (config_.version >= 3) {
    open_head(path);
  } else {
    std::string bytes = read_listed(*backend_, metadata_name_, kMaxFlatBufferBytes);
    if (config_.metadata) check_recorded_file(*config_.metadata, bytes, path);
    lazy_ = std::make_unique<LazyMetadata>(std::move(bytes), path);
  }
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
  if (check_every_file) check_listed_files(files(), opened.common_file, *backend_);
  ranges_ = std::make_unique<FileRanges>(
      backend_, [this](uint32_t file) -> const FileRecord& { return file_at(file); }, opened.checksum_block_size,
      verify_checksums);
}

void DistckptStorage::open_head(const std::string& path) {
  // Format 3: the head (the index of the records) is read and checked
  // against the marker; each record is read when first looked up, so a rank
  // reads its own records. Where a request costs as much as reading a large
  // piece (an object store), a small file is read whole in one request.
  const RecordedFile& recorded = *config_.metadata;
  std::shared_ptr<ObjectReader> reader;
  try {
    reader = backend_->open(metadata_name_);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) throw missing_listed_file(path);
    throw;
  }
  if (recorded.bytes >= kMaxFlatBufferBytes) {
    throw CorruptionError(fmt::format("{}: the commit marker records {} bytes, more than metadata can be (2 GiB, the "
                                      "FlatBuffers limit); the marker is damaged",
                                      path, recorded.bytes),
                          path);
  }
  check_recorded_size(recorded, reader->size(), path);
  LazyMetadata::RangeRead read = [reader](uint64_t offset, uint64_t length, uint8_t* out) {
    reader->read(offset, length, out);
  };
  if (recorded.bytes <= reader->preferred_read_bytes()) {
    // Read whole in one request, checked whole, then read by parts from
    // memory: the same checks as from storage.
    auto bytes = std::make_shared<std::string>(recorded.bytes, '\0');
    reader->read(0, bytes->size(), reinterpret_cast<uint8_t*>(bytes->data()));
    check_recorded_file(recorded, *bytes, path);
    read = [bytes](uint64_t offset, uint64_t length, uint8_t* out) {
      std::memcpy(out, bytes->data() + offset, length);  // inside the file: the reader checks where records lie
    };
  }
  std::string head(recorded.head_bytes, '\0');
  read(0, head.size(), reinterpret_cast<uint8_t*>(head.data()));
  check_recorded_head(recorded, head, path);
  from_head_ = true;
  lazy_ = std::make_unique<LazyMetadata>(std::move(head), recorded.bytes, std::move(read), path);
}

const CheckpointMetadata& DistckptStorage::metadata() const {
  std::call_once(decoded_all_, [&] {
    if (!from_head_) {
      all_ = std::make_unique<const CheckpointMetadata>(lazy_->decode_all());
      return;
    }
    // Opened from the head: the whole file, read and checked as a version 2 reader does.
    const std::string path = backend_->describe(metadata_name_);
    const std::string bytes = read_listed(*backend_, metadata_name_, kMaxFlatBufferBytes);
    check_recorded_file(*config_.metadata, bytes, path);
    CheckpointMetadata all = decode_metadata(bytes, path);
    // The head the marker records is the one the file has (a reader by
    // parts starts from it).
    check_recorded_head(*config_.metadata, std::string_view(bytes).substr(0, metadata_head_bytes(bytes)), path);
    all_ = std::make_unique<const CheckpointMetadata>(std::move(all));
  });
  return *all_;
}

const FileRecord& DistckptStorage::file_at(uint32_t file) const {
  // A record decoded through index() (a whole decode, say for a name
  // mapping) names files its lookups did not read: the file list has them.
  if (const FileRecord* read = lazy_->find_file(file)) return *read;
  return files().at(file);
}

const std::vector<FileRecord>& DistckptStorage::files() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return lazy_->files();
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
  report.files += 2 + lazy_->file_count() + (header().common_file.empty() ? 0 : 1);
  try {
    read_common_state();
  } catch (const Error& e) {
    report.problems.push_back(e.what());
  }
  ranges_->verify_all(metadata(), report, progress);
}

}  // namespace distckpt::storage
