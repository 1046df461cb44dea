// Reads any region of any stored tensor of a checkpoint, in whatever
// storage format (distckpt/storage/), straight from the byte ranges that
// hold it. Reads are thread-safe (the load engine runs several reader
// threads).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"
#include "distckpt/format/storage_index.h"
#include "distckpt/storage/storage_reader.h"
#include "plan/chunk_index.h"

namespace distckpt::loading {

class CheckpointReader {
 public:
  static constexpr uint64_t kCopyBatchBytes = uint64_t{16} << 20;

  // Opens `path` in the format it holds (open_storage). Throws
  // CheckpointError if there is no checkpoint and CorruptionError if its
  // metadata or files are inconsistent.
  explicit CheckpointReader(const std::string& path, bool verify_checksums = true);
  explicit CheckpointReader(std::unique_ptr<StorageReader> storage);
  // Over a storage the caller owns (and keeps alive).
  explicit CheckpointReader(StorageReader& storage);

  const std::string& dir() const { return storage_->location(); }
  StorageReader& storage() { return *storage_; }
  // Every record (a format that decodes records on demand decodes them all:
  // tools use it; a load looks up its own tensors below).
  const StorageIndex& index() const { return storage_->index(); }
  // KeyMismatchError naming the key when absent.
  const TensorRecord& tensor(const std::string& key) const;
  // Records by their place in the checkpoint (sorted by key), the number
  // planning messages carry; std::out_of_range past tensor_count().
  const TensorRecord& tensor_at(size_t i) const { return storage_->tensor_at(i); }
  size_t tensor_count() const { return storage_->tensor_count(); }
  std::optional<size_t> find_tensor(const std::string& key) const { return storage_->find_tensor(key); }
  const std::vector<ObjectRecord>& objects() const { return storage_->objects(); }
  uint32_t tensor_index(const TensorRecord& record) const;
  // The stored pieces of a tensor (built once, then shared).
  const plan::ChunkIndex& index_for(const TensorRecord& record);
  const ObjectRecord* find_object(const std::string& unique_key) const;

  // Fills `dest` (sizes = region.length, any strides, CPU or device) with the
  // stored values of `region`; throws CheckpointError if the checkpoint does
  // not hold all of it.
  void read_region(const TensorRecord& record, const Box& region, at::Tensor dest);
  // The whole tensor on the CPU; CheckpointError for a dtype this build lacks.
  at::Tensor read_whole(const TensorRecord& record);
  // The record of `key`; CheckpointError naming the command that lists keys.
  const TensorRecord& tensor_record(const std::string& key) const;
  std::string read_object(const ObjectRecord& record) { return storage_->read_object(record); }
  // Bytes [begin, end) of chunk `chunk` of `record` (relative to the chunk's
  // first byte) into `out`, checked as the storage format allows.
  void read_chunk_bytes(const TensorRecord& record, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) {
    storage_->read_chunk(record, chunk, begin, end, out);
  }
  // The byte runs of one chunk into their outputs (StorageReader::read_chunk_runs).
  void read_chunk_runs(const TensorRecord& record, uint32_t chunk, const std::vector<ByteRun>& runs) {
    storage_->read_chunk_runs(record, chunk, runs);
  }
  // The ranks that can read chunk `chunk` of tensor record `tensor`
  // (ascending), when not every rank can: a live transfer's sources
  // (transfer/live_sources.h) hold their chunks in memory. Empty: any rank
  // reads the storage.
  using ChunkHolders = std::function<std::vector<int>(uint32_t tensor, uint32_t chunk)>;
  void set_chunk_holders(ChunkHolders holders) { holders_ = std::move(holders); }
  bool has_chunk_holders() const { return static_cast<bool>(holders_); }
  std::vector<int> chunk_holders(uint32_t tensor, uint32_t chunk) const {
    return holders_ ? holders_(tensor, chunk) : std::vector<int>{};
  }
  // Bytes read from storage so far (to check that loads read what they need).
  uint64_t bytes_read() const { return storage_->bytes_read(); }
  // The values saved outside tensors (an empty dict if none).
  Value read_common_state() const { return storage_->read_common_state(); }

 private:
  void copy_piece(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part, at::Tensor dest);
  void copy_contiguous_span(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part,
                            at::Tensor dest);

  std::unique_ptr<StorageReader> owned_;
  StorageReader* storage_;
  std::map<std::string, size_t> object_by_unique_key_;
  std::mutex indexes_mutex_;
  std::map<const TensorRecord*, std::unique_ptr<plan::ChunkIndex>> indexes_;
  ChunkHolders holders_;
};

// Streams a whole stored tensor in row-major windows of about
// `window_bytes`: `visit(flat_start, values)` gets each window as a 1-d
// tensor (of the stored dtype) starting at element `flat_start`. Memory is
// one window, whatever the tensor's size.
void read_in_windows(CheckpointReader& reader, const TensorRecord& record, uint64_t window_bytes,
                     const std::function<void(int64_t flat_start, const at::Tensor& values)>& visit);
// The same over `region` of the tensor: flat_start counts within its
// flattening. `scratch` (bytes, at least `window_bytes`), when given, holds
// the windows: a caller streaming many tensors allocates once.
void read_in_windows(CheckpointReader& reader, const TensorRecord& record, const Box& region, uint64_t window_bytes,
                     const std::function<void(int64_t flat_start, const at::Tensor& values)>& visit,
                     const at::Tensor& scratch = {});

// The slice of `view` (whose box is `outer`) covering `inner`.
at::Tensor sub_view(const at::Tensor& view, const Box& outer, const Box& inner);

}  // namespace distckpt::loading
