// Choosing the storage format of a path, and opening it.
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"
#include "format/commit.h"
#include "io/file.h"
#include "storage/distckpt_storage.h"
#include "storage/locate.h"
#include "storage/safetensors_storage.h"
#include "storage/torch_file_reader.h"
#include "storage/torch_file_storage.h"

namespace distckpt {

const char* storage_format_name(StorageFormat format) {
  switch (format) {
    case StorageFormat::kAuto:
      return "auto";
    case StorageFormat::kDistckpt:
      return "distckpt";
    case StorageFormat::kSafetensors:
      return "safetensors";
    case StorageFormat::kTorch:
      return "torch";
  }
  return "unknown";
}

const char* status_name(VerifyReport::Status status) {
  switch (status) {
    case VerifyReport::Status::kIntact:
      return "intact";
    case VerifyReport::Status::kCorrupt:
      return "corrupt";
    case VerifyReport::Status::kNotACheckpoint:
      return "not_a_checkpoint";
  }
  return "unknown";
}

namespace {

// The format of what `at` locates.
StorageFormat detect(const storage::Located& at) {
  if (!at.file.empty()) {
    if (storage::is_safetensors_name(at.file)) return StorageFormat::kSafetensors;
    const std::unique_ptr<ObjectReader> file = at.backend->open(at.file);
    if (storage::is_torch_file(*file)) return StorageFormat::kTorch;
    const std::string where = at.backend->describe(at.file);
    if (storage::is_legacy_torch_file(*file)) {
      throw CheckpointError(fmt::format("'{}' is a torch.save file in the legacy format (PyTorch before 1.6, or "
                                        "_use_new_zipfile_serialization=False), which distckpt does not read: load it "
                                        "with torch.load and save it again with torch.save",
                                        where),
                            where);
    }
    throw CheckpointError(
        fmt::format("'{}' is a file, neither a checkpoint directory, a .safetensors file nor a torch.save file", where),
        where);
  }
  // A distckpt checkpoint is recognised by its commit marker alone: an
  // uncommitted save must be reported as such, not as some other format.
  if (at.backend->size_of(kCommitFile)) return StorageFormat::kDistckpt;
  if (storage::holds_safetensors(*at.backend)) return StorageFormat::kSafetensors;
  return StorageFormat::kDistckpt;  // its error says what is missing
}

}  // namespace

StorageFormat detect_storage_format(const std::string& path) {
  if (!is_object_store(path) && io::lexists(path) && !io::is_dir(path)) io::require_regular_file(path);
  return detect(storage::locate(path));
}

std::unique_ptr<StorageReader> open_storage(const std::string& path, const StorageOptions& options) {
  if (!is_object_store(path) && io::lexists(path) && !io::is_dir(path)) io::require_regular_file(path);
  const storage::Located at = storage::locate(path);
  const StorageFormat format = options.format == StorageFormat::kAuto ? detect(at) : options.format;
  if (format == StorageFormat::kSafetensors) return std::make_unique<storage::SafetensorsStorage>(at.backend, at.file);
  if (format == StorageFormat::kTorch) {
    if (at.file.empty()) throw CheckpointError(fmt::format("'{}' is not a torch.save file", path), path);
    return std::make_unique<storage::TorchFileStorage>(at.backend, at.file);
  }
  if (!at.file.empty()) {
    throw CheckpointError(
        fmt::format("'{}' is a file; a distckpt checkpoint is a directory (or an s3:// prefix)", path), path);
  }
  return std::make_unique<storage::DistckptStorage>(at.backend, options.verify_checksums, options.check_every_file);
}

}  // namespace distckpt
