// Reads a committed checkpoint: verified metadata, then any region of any
// tensor straight from the byte ranges that hold it, checking the checksum
// of every block it touches. Open files are bounded. Reads are thread-safe
// (the load engine runs several reader threads).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"
#include "distckpt/format/checkpoint_config.h"
#include "format/metadata.h"
#include "io/file.h"
#include "plan/chunk_index.h"

namespace distckpt::api {

class CheckpointReader {
 public:
  static constexpr size_t kMaxOpenFiles = 64;
  static constexpr uint64_t kCopyBatchBytes = uint64_t{16} << 20;

  // Throws CheckpointError if `dir` holds no committed checkpoint and
  // CorruptionError if its metadata or files are inconsistent.
  explicit CheckpointReader(std::string dir, bool verify_checksums = true);

  const std::string& dir() const { return dir_; }
  const CheckpointMetadata& metadata() const { return metadata_; }
  const CheckpointConfig& config() const { return config_; }
  // KeyMismatchError naming the key when absent.
  const TensorRecord& tensor(const std::string& key) const;
  uint32_t tensor_index(const TensorRecord& record) const {
    return static_cast<uint32_t>(&record - metadata_.tensors.data());
  }
  // The stored pieces of a tensor (built once, then shared).
  const plan::ChunkIndex& index_for(const TensorRecord& record);
  const ObjectRecord* find_object(const std::string& unique_key) const;

  // Fills `dest` (sizes = region.length, any strides, CPU or device) with the
  // stored values of `region`; throws CheckpointError if the checkpoint does
  // not hold all of it.
  void read_region(const TensorRecord& record, const Box& region, at::Tensor dest);
  std::string read_object(const ObjectRecord& record);
  // Bytes [begin, end) of chunk `chunk` of `record` (relative to the chunk's
  // first byte) into `out`, verifying every checksum block they touch.
  void read_chunk_bytes(const TensorRecord& record, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out);
  // Bytes read from data files so far (to check that loads read what they need).
  uint64_t bytes_read() const { return bytes_read_.load(); }
  // The common state saved by the coordinator (an empty dict if none).
  Value read_common_state() const;

 private:
  std::shared_ptr<io::File> file(uint32_t index);
  void copy_piece(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part, at::Tensor dest);
  void copy_contiguous_span(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part,
                            at::Tensor dest);
  // Reads bytes [begin, end) of a stored byte range (a chunk or object) into
  // `out`, verifying every checksum block that overlaps the range.
  void read_verified(uint32_t file_index, uint64_t base, uint64_t length, const std::vector<uint64_t>& checksums,
                     uint64_t begin, uint64_t end, uint8_t* out, const std::string& what);

  std::string dir_;
  bool verify_;
  CheckpointConfig config_;
  CheckpointMetadata metadata_;
  std::map<std::string, size_t> object_by_unique_key_;
  std::mutex indexes_mutex_;
  std::map<const TensorRecord*, std::unique_ptr<plan::ChunkIndex>> indexes_;
  std::mutex files_mutex_;
  std::list<std::pair<uint32_t, std::shared_ptr<io::File>>> open_files_;  // most recently used first
  std::atomic<uint64_t> bytes_read_{0};
};

// The slice of `view` (whose box is `outer`) covering `inner`.
at::Tensor sub_view(const at::Tensor& view, const Box& outer, const Box& inner);

}  // namespace distckpt::api
