// A torch.save file (pytorch_model.bin, a trainer's model.pt) as a
// StorageReader, so that load() reshards it directly, each rank reading only
// the byte ranges its shards overlap: every tensor is one stored chunk, row
// major inside its storage's record. The pickle's plain values are the
// common state. A read that covers a whole record is checked against the
// record's CRC-32; a part of a record cannot be (the archive records one
// CRC per record): `verify` re-reads them all.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "distckpt/storage/storage_reader.h"
#include "storage/file_ranges.h"
#include "storage/torch_file_reader.h"

namespace distckpt::storage {

class TorchFileStorage final : public FileBackedStorage {
 public:
  // CheckpointError for a file that is no state dict, or that holds a
  // strided view (which no byte range describes: convert the file first);
  // CorruptionError for a damaged archive or pickle.
  explicit TorchFileStorage(const std::string& path);

  StorageFormat format() const override { return StorageFormat::kTorch; }
  const std::string& location() const override { return reader_.path(); }
  const StorageIndex& index() const override { return index_; }
  Value read_common_state() const override { return reader_.common(); }
  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override { reader_.verify(report, progress); }

 private:
  TorchFileReader reader_;
  StorageIndex index_;
  std::unordered_map<std::string, const zip::Entry*> whole_record_;  // tensors that are their storage's whole record
};

}  // namespace distckpt::storage
