// Choosing the storage format of a path, and opening it.
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/format_registry.h"
#include "distckpt/storage/storage_reader.h"
#include "io/file.h"
#include "storage/builtin_formats.h"
#include "storage/locate.h"

namespace distckpt {

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

// The first registered format that recognises what `at` locates.
std::shared_ptr<const Format> detect(const storage::Located& at) {
  const std::vector<std::shared_ptr<const Format>> formats = storage::formats_in_order();
  for (const std::shared_ptr<const Format>& format : formats) {
    if (format->detect(*at.backend, at.file)) return format;
  }
  if (!at.file.empty()) {
    const std::string where = at.backend->describe(at.file);
    throw CheckpointError(
        fmt::format("'{}' is a file no storage format recognises (a checkpoint directory or one file of these: {})",
                    where, storage::format_names(formats)),
        where);
  }
  return storage::registered_format("distckpt");  // its error says what is missing
}

std::shared_ptr<const Format> chosen(const storage::Located& at, const StorageFormat& format) {
  return format.is_detected() ? detect(at) : storage::registered_format(format.name());
}

}  // namespace

StorageFormat detect_storage_format(const std::string& path) {
  if (!is_object_store(path) && io::lexists(path) && !io::is_dir(path)) io::require_regular_file(path);
  return StorageFormat(detect(storage::locate(path))->name());
}

std::unique_ptr<StorageReader> open_storage(const std::string& path, const StorageOptions& options) {
  if (!is_object_store(path) && io::lexists(path) && !io::is_dir(path)) io::require_regular_file(path);
  const storage::Located at = storage::locate(path);
  return chosen(at, options.format)->open(at.backend, at.file, options);
}

}  // namespace distckpt
