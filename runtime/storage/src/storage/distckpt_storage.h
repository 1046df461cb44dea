// The distckpt format as a StorageReader: the commit marker (parsed
// strictly) records the size and XXH3 of metadata.fb and common.fb, and
// metadata.fb the XXH3 of every data block. Opening checks the marker, the
// metadata's frame and all but its tensor records, and (unless told not to)
// every file's kind and size; a tensor record is checked and decoded when
// first looked up (LazyMetadata), every one by index(). Reads check each file
// they open and each block they touch.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

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

  // What only this format records (layout, plan hashes, world size), and
  // every tensor record: decodes all of them on first call.
  const CheckpointMetadata& metadata() const;
  // The same without the tensor records (decoded when opened).
  const CheckpointMetadata& header() const { return lazy_->header(); }
  std::vector<NameMapping> name_mappings() const override { return header().name_mappings; }
  const CheckpointConfig& config() const { return config_; }

  StorageFormat format() const override { return StorageFormat::distckpt(); }
  const std::string& location() const override { return backend_->location(); }
  const StorageIndex& index() const override { return metadata(); }
  // Lookups decode one record each, the first time it is asked for.
  size_t tensor_count() const override { return lazy_->tensor_count(); }
  const TensorRecord& tensor_at(size_t i) const override;
  std::optional<size_t> find_tensor(const std::string& key) const override { return lazy_->find(key); }
  size_t lower_bound_tensor(const std::string& key) const override { return lazy_->lower_bound(key); }
  // Every file record (opened from the head: reads the file list, alone).
  const std::vector<FileRecord>& files() const override;
  const FileRecord& file_at(uint32_t file) const override;
  // Bytes of metadata.fb read so far.
  uint64_t metadata_bytes_read() const { return lazy_->bytes_read(); }
  const std::vector<ObjectRecord>& objects() const override { return header().objects; }
  uint64_t checksum_block_size() const override { return header().checksum_block_size; }
  size_t tensors_decoded() const override;
  Value read_common_state() const override;
  std::optional<Value> read_content_metadata() const override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override;

 private:
  // common.fb's bytes, checked against the commit marker; empty without one.
  std::string common_bytes(std::string& path) const;
  // Format 3: opens metadata.fb (`path`, described) from its head.
  void open_head(const std::string& path);

  std::shared_ptr<Backend> backend_;
  CheckpointConfig config_;
  std::string metadata_name_;
  bool from_head_ = false;  // metadata.fb opened from its head, records read alone
  std::unique_ptr<LazyMetadata> lazy_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<size_t, std::unique_ptr<TensorRecord>> decoded_;  // by tensor_at, under mutex_
  mutable std::once_flag decoded_all_;
  mutable std::unique_ptr<const CheckpointMetadata> all_;  // metadata(), once asked for
};

// Every data file and the common state file the metadata lists: present,
// regular, inside the checkpoint, of the recorded size (CorruptionError
// naming the first that is not).
void check_listed_files(const std::vector<FileRecord>& files, const std::string& common_file, Backend& backend);
inline void check_listed_files(const CheckpointMetadata& metadata, Backend& backend) {
  check_listed_files(metadata.files, metadata.common_file, backend);
}

}  // namespace distckpt::storage
