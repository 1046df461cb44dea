// Choosing the storage format of a path, and opening it.
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/storage/storage_reader.h"
#include "format/commit.h"
#include "io/file.h"
#include "storage/distckpt_storage.h"
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

StorageFormat detect_storage_format(const std::string& path) {
  if (!io::exists(path)) return StorageFormat::kDistckpt;  // its error says what is missing
  if (!io::is_dir(path)) {
    io::require_regular_file(path);
    if (storage::is_safetensors_name(path)) return StorageFormat::kSafetensors;
    if (storage::is_torch_file(path)) return StorageFormat::kTorch;
    if (storage::is_legacy_torch_file(path)) {
      throw CheckpointError(fmt::format("'{}' is a torch.save file in the legacy format (PyTorch before 1.6, or "
                                        "_use_new_zipfile_serialization=False), which distckpt does not read: load it "
                                        "with torch.load and save it again with torch.save",
                                        path),
                            path);
    }
    throw CheckpointError(
        fmt::format("'{}' is a file, neither a checkpoint directory, a .safetensors file nor a torch.save file", path),
        path);
  }
  // A distckpt directory is recognised by its commit marker alone: an
  // uncommitted save must be reported as such, not as some other format.
  if (io::exists(io::safe_join(path, kCommitFile))) return StorageFormat::kDistckpt;
  if (storage::holds_safetensors(path)) return StorageFormat::kSafetensors;
  return StorageFormat::kDistckpt;  // its error says what is missing
}

std::unique_ptr<StorageReader> open_storage(const std::string& path, const StorageOptions& options) {
  const StorageFormat format = options.format == StorageFormat::kAuto ? detect_storage_format(path) : options.format;
  if (format == StorageFormat::kSafetensors) return std::make_unique<storage::SafetensorsStorage>(path);
  if (format == StorageFormat::kTorch) return std::make_unique<storage::TorchFileStorage>(path);
  return std::make_unique<storage::DistckptStorage>(path, options.verify_checksums, options.check_every_file);
}

}  // namespace distckpt
