// A PyTorch DCP checkpoint (torch.distributed.checkpoint's FileSystemWriter,
// Megatron-Core's torch_dist, torchtitan) as a StorageReader: `.metadata`
// read by the restricted pickle machine (format/dcp_metadata.h), each chunk
// of a tensor an item of a `.distcp` file. An item is a torch.save archive
// of one contiguous tensor at [offset, offset + length) of its file, its
// values the stored record of the archive: an item's archive is opened the
// first time one of its bytes is read (its directory and pickle checked
// against `.metadata`), then reads take exactly the byte ranges a rank
// needs. A read of a whole record is checked against the record's CRC-32.
//
// Items PyTorch 2.x compressed ("stream.zstd" transform descriptors) are
// read whole and decompressed (bounded: a tensor chunk's archive is its
// values plus a little), the last one kept for the reads that follow.
//
// Bytes items: "KEY/shard_O_S" ones (Megatron's sharded objects) are
// objects; the others are common state, each decoded by the restricted
// pickle machine when it holds plain values, otherwise kept as its bytes.
// Megatron's common.pt joins the common state.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"
#include "storage/file_ranges.h"

namespace distckpt::storage {

constexpr const char* kDcpMetadataFile = ".metadata";

class DcpStorage final : public FileBackedStorage {
 public:
  // CheckpointError when the root holds no `.metadata`; CorruptionError
  // naming the file for a damaged or hostile one. `verify_checksums` off:
  // reads skip the records' CRC-32 (as PyTorch's own reader does; verify()
  // still checks every one).
  explicit DcpStorage(std::shared_ptr<Backend> backend, bool verify_checksums = true);
  ~DcpStorage() override;

  StorageFormat format() const override { return StorageFormat("dcp"); }
  const std::string& location() const override { return backend_->location(); }
  const StorageIndex& index() const override { return index_; }
  Value read_common_state() const override;
  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) override;
  void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) override;
  std::string read_object(const ObjectRecord& object) override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override;

  // "torch 1.13", "torch 2" or "Megatron MCoreMetadata": whose class names `.metadata` uses.
  const std::string& naming() const { return naming_; }

 private:
  // An item: bytes [offset, offset + length) of index_.files[file].
  struct Item {
    std::string key;
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t inflated_limit = 0;  // zstd-compressed: the most bytes it may decompress to; 0: stored plain
  };
  // A tensor item's stored record, found when first read.
  struct Record {
    uint64_t file_offset = 0;  // of the record's first byte (in the decompressed item when inflated)
    uint64_t bytes = 0;
    bool whole_record = false;  // the record holds these values and nothing else: its CRC-32 checks them
    uint32_t crc32 = 0;
    bool inflated = false;
  };

  std::string describe(const Item& item) const;
  // The item's bytes as an object (decompressed when compressed).
  std::unique_ptr<ObjectReader> open_item(const Item& item) const;
  std::shared_ptr<const std::string> inflate(const Item& item) const;
  Item item_of(const ObjectRecord& object) const;
  // Chunk `chunk` of `tensor` as a one-chunk record at its stored record's
  // bytes, with the index of its tensor and where its record lies.
  struct Located {
    TensorRecord record;
    size_t tensor = 0;
    Record stored;
  };
  Located located(const TensorRecord& tensor, uint32_t chunk);
  // The runs (bytes of the chunk) of a chunk whose item is compressed, from its decompressed record.
  void copy_inflated(const Located& at, uint32_t chunk, const std::vector<ByteRun>& runs) const;
  Record record_of(size_t tensor, uint32_t chunk);
  Record find_record(const TensorRecord& tensor, uint32_t chunk, const Item& item) const;
  Value decode_bytes(const Item& item) const;
  static std::optional<Value> decode_archive(std::unique_ptr<ObjectReader> reader, const std::string& where);

  std::shared_ptr<Backend> backend_;
  bool verify_checksums_;
  std::string naming_;
  StorageIndex index_;
  std::vector<std::vector<Item>> tensor_items_;  // [tensor][chunk], parallel to index_.tensors
  std::vector<Item> common_items_;               // bytes items that are common state
  bool has_common_file_ = false;                 // Megatron's common.pt

  std::mutex records_mutex_;
  std::unordered_map<uint64_t, Record> records_;        // by tensor << 32 | chunk
  std::unordered_set<std::string> compressed_objects_;  // by unique key

  mutable std::mutex inflated_mutex_;  // the last item decompressed, by (file, offset)
  mutable std::pair<uint32_t, uint64_t> inflated_at_{UINT32_MAX, 0};
  mutable std::shared_ptr<const std::string> inflated_;
  mutable std::mutex common_mutex_;
  mutable std::optional<Value> common_;
};

// Whether the backend's root holds a DCP checkpoint (its `.metadata`).
bool holds_dcp(Backend& backend);

}  // namespace distckpt::storage
