// The built-in formats as registry entries: how each recognises its
// checkpoints, opens them and, for those saves write, makes the writer.
#include "storage/builtin_formats.h"

#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/storage/dcp.h"
#include "distckpt/storage/safetensors.h"
#include "format/commit.h"
#include "storage/dcp_storage.h"
#include "storage/distckpt_storage.h"
#include "storage/safetensors_storage.h"
#include "storage/torch_file_reader.h"
#include "storage/torch_file_storage.h"

namespace distckpt::storage {
namespace {

class DistckptFormat final : public Format {
 public:
  std::string name() const override { return "distckpt"; }
  // By its commit marker alone: an uncommitted save must be reported as
  // such, not taken for some other format.
  bool detect(Backend& backend, const std::string& file) const override {
    return file.empty() && backend.size_of(kCommitFile).has_value();
  }
  std::unique_ptr<StorageReader> open(std::shared_ptr<Backend> backend, const std::string& file,
                                      const StorageOptions& options) const override {
    if (!file.empty()) {
      const std::string where = backend->describe(file);
      throw CheckpointError(
          fmt::format("'{}' is a file; a distckpt checkpoint is a directory (or an s3:// prefix)", where), where);
    }
    return std::make_unique<DistckptStorage>(std::move(backend), options.verify_checksums, options.check_every_file);
  }
  std::unique_ptr<StorageWriter> make_writer(const std::string& location, const StorageFormat&) const override {
    throw UsageError(fmt::format(
        "distckpt's writer is made by save() from its plan (its metadata): save into '{}' with SaveOptions::format "
        "= StorageFormat::distckpt()",
        location));
  }
};

class SafetensorsFormat final : public Format {
 public:
  std::string name() const override { return "safetensors"; }
  bool detect(Backend& backend, const std::string& file) const override {
    return file.empty() ? holds_safetensors(backend) : is_safetensors_name(file);
  }
  std::unique_ptr<StorageReader> open(std::shared_ptr<Backend> backend, const std::string& file,
                                      const StorageOptions&) const override {
    return std::make_unique<SafetensorsStorage>(std::move(backend), file);
  }
  std::unique_ptr<StorageWriter> make_writer(const std::string& location, const StorageFormat& format) const override {
    const auto* knobs = format.options_as<SafetensorsWriteOptions>();
    if (format.options() && !knobs) {
      throw UsageError("the safetensors format takes SafetensorsWriteOptions as its options (safetensors_format())");
    }
    return make_safetensors_writer(location, knobs ? *knobs : SafetensorsWriteOptions{});
  }
};

class TorchFormat final : public Format {
 public:
  std::string name() const override { return "torch"; }
  bool detect(Backend& backend, const std::string& file) const override {
    if (file.empty()) return false;
    const std::unique_ptr<ObjectReader> reader = backend.open(file);
    if (is_torch_file(*reader)) return true;
    if (is_legacy_torch_file(*reader)) {
      const std::string where = backend.describe(file);
      throw CheckpointError(fmt::format("'{}' is a torch.save file in the legacy format (PyTorch before 1.6, or "
                                        "_use_new_zipfile_serialization=False), which distckpt does not read: load it "
                                        "with torch.load and save it again with torch.save",
                                        where),
                            where);
    }
    return false;
  }
  std::unique_ptr<StorageReader> open(std::shared_ptr<Backend> backend, const std::string& file,
                                      const StorageOptions&) const override {
    if (file.empty()) {
      const std::string where = backend->location();
      throw CheckpointError(fmt::format("'{}' is not a torch.save file", where), where);
    }
    return std::make_unique<TorchFileStorage>(std::move(backend), file);
  }
  std::unique_ptr<StorageWriter> make_writer(const std::string&, const StorageFormat&) const override {
    throw UsageError(
        "saves write the distckpt or the safetensors format; write a torch.save file from a checkpoint with "
        "convert_to_torch (distckpt convert DIR FILE.pt --to torch)");
  }
};

// PyTorch DCP (torch.distributed.checkpoint, Megatron's torch_dist): by its
// `.metadata`, which DCP writes last. Asked before distckpt's, whose marker
// file name (metadata.json) Megatron's torch_dist checkpoints carry too.
class DcpFormat final : public Format {
 public:
  std::string name() const override { return "dcp"; }
  bool detect(Backend& backend, const std::string& file) const override { return file.empty() && holds_dcp(backend); }
  std::unique_ptr<StorageReader> open(std::shared_ptr<Backend> backend, const std::string& file,
                                      const StorageOptions& options) const override {
    if (!file.empty()) {
      const std::string where = backend->describe(file);
      throw CheckpointError(
          fmt::format("'{}' is a file; a PyTorch DCP checkpoint is the directory (or s3:// prefix) holding .metadata",
                      where),
          where);
    }
    return std::make_unique<DcpStorage>(std::move(backend), options.verify_checksums);
  }
  std::unique_ptr<StorageWriter> make_writer(const std::string& location, const StorageFormat& format) const override {
    const auto* knobs = format.options_as<DcpWriteOptions>();
    if (format.options() && !knobs)
      throw UsageError("the dcp format takes DcpWriteOptions as its options (dcp_format())");
    return make_dcp_writer(location, knobs ? *knobs : DcpWriteOptions{});
  }
};

}  // namespace

std::vector<std::shared_ptr<const Format>> builtin_formats() {
  return {std::make_shared<DcpFormat>(), std::make_shared<DistckptFormat>(), std::make_shared<SafetensorsFormat>(),
          std::make_shared<TorchFormat>()};
}

}  // namespace distckpt::storage

namespace distckpt {

StorageFormat safetensors_format(SafetensorsWriteOptions options) {
  return StorageFormat("safetensors", std::make_shared<const SafetensorsWriteOptions>(std::move(options)));
}

}  // namespace distckpt
