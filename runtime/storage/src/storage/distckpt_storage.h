// The distckpt format as a StorageReader: the commit marker (parsed
// strictly) records the size and XXH3 of metadata.fb and common.fb, and
// metadata.fb the XXH3 of every data block. Opening checks the marker, the
// metadata and (unless told not to) every file's kind and size; reads check
// each file they open and each block they touch.
#pragma once

#include <memory>
#include <string>

#include "distckpt/format/checkpoint_config.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"
#include "format/metadata.h"
#include "storage/file_ranges.h"

namespace distckpt::storage {

class DistckptStorage final : public FileBackedStorage {
 public:
  // Throws CheckpointError if the backend's root holds no committed
  // checkpoint and CorruptionError if its metadata or files are inconsistent.
  explicit DistckptStorage(std::shared_ptr<Backend> backend, bool verify_checksums = true,
                           bool check_every_file = true);

  // What only this format records (layout, plan hashes, world size).
  const CheckpointMetadata& metadata() const { return metadata_; }
  std::vector<NameMapping> name_mappings() const override { return metadata_.name_mappings; }
  const CheckpointConfig& config() const { return config_; }

  StorageFormat format() const override { return StorageFormat::distckpt(); }
  const std::string& location() const override { return backend_->location(); }
  const StorageIndex& index() const override { return metadata_; }
  Value read_common_state() const override;
  std::optional<Value> read_content_metadata() const override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override;

 private:
  // common.fb's bytes, checked against the commit marker; empty without one.
  std::string common_bytes(std::string& path) const;

  std::shared_ptr<Backend> backend_;
  CheckpointConfig config_;
  CheckpointMetadata metadata_;
};

// Every data file and the common state file the metadata lists: present,
// regular, inside the checkpoint, of the recorded size (CorruptionError
// naming the first that is not).
void check_listed_files(const CheckpointMetadata& metadata, Backend& backend);

}  // namespace distckpt::storage
