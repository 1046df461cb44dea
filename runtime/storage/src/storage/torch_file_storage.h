// A torch.save file (pytorch_model.bin, a trainer's model.pt) as a
// StorageReader, so that load() reshards it directly, each rank reading only
// the byte ranges its shards overlap: every tensor is one stored chunk, row
// major inside its storage's record. A strided view (a transposed or
// column-sliced tensor) has no such byte range: its storage is read whole,
// checked, and its values kept row major for the reads that follow (the
// views read most recently, up to kStridedCacheBytes, or the last one alone
// when it is larger). The pickle's plain values are the common state. A read
// that covers a whole record is checked against the record's CRC-32; a part
// of a record cannot be (the archive records one CRC per record): `verify`
// re-reads them all.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "distckpt/storage/storage_reader.h"
#include "storage/file_ranges.h"
#include "storage/torch_file_reader.h"

namespace distckpt::storage {

class TorchFileStorage final : public FileBackedStorage {
 public:
  // CheckpointError for a file that is no state dict; CorruptionError for a
  // damaged archive or pickle.
  // `file` of `backend`.
  TorchFileStorage(std::shared_ptr<Backend> backend, const std::string& file);

  StorageFormat format() const override { return StorageFormat::torch(); }
  const std::string& location() const override { return reader_.path(); }
  const StorageIndex& index() const override { return index_; }
  Value read_common_state() const override { return reader_.common(); }
  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) override;
  void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override { reader_.verify(report, progress); }
  uint64_t bytes_read() const override { return FileBackedStorage::bytes_read() + strided_bytes_read_.load(); }

 private:
  static constexpr uint64_t kStridedCacheBytes = uint64_t{1} << 30;

  // Strided view `i` (of reader_), its values row-major: read from its
  // storage on first use and kept while the views read since fit the cache.
  std::shared_ptr<const at::Tensor> strided_values(size_t i);

  TorchFileReader reader_;
  StorageIndex index_;
  std::unordered_map<std::string, const zip::Entry*> whole_record_;  // tensors that are their storage's whole record
  std::unordered_map<std::string, size_t> strided_;                  // key -> index in reader_, for strided views
  std::mutex strided_mutex_;
  using CachedView = std::pair<size_t, std::shared_ptr<const at::Tensor>>;
  std::list<CachedView> strided_cache_;  // most recently read first
  std::unordered_map<size_t, std::list<CachedView>::iterator> strided_cached_;
  uint64_t strided_cache_bytes_ = 0;
  std::atomic<uint64_t> strided_bytes_read_{0};
};

}  // namespace distckpt::storage
