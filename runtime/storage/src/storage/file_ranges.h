// The objects of one checkpoint as byte ranges: opened on demand through
// its backend (a bounded number at once), read with every checksum block
// they touch verified, and re-read whole for verification. Shared by the
// storage formats, which differ only in how they find the ranges.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/format/storage_index.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"

namespace distckpt::storage {

class FileRanges {
 public:
  static constexpr size_t kMaxOpenFiles = 64;

  // The record of file `index` (objects of `backend`); it must stay valid
  // as long as this object.
  using FileLookup = std::function<const FileRecord&(uint32_t index)>;

  FileRanges(std::shared_ptr<Backend> backend, FileLookup files, uint64_t checksum_block_size, bool verify_checksums);
  // Over a complete index, which must outlive this object.
  FileRanges(std::shared_ptr<Backend> backend, const StorageIndex& index, bool verify_checksums);

  Backend& backend() const { return *backend_; }
  // File `file` of the index, opened anew and its size checked.
  std::unique_ptr<ObjectReader> open_uncached(uint32_t file) const;
  // Bytes [begin, end) of the range [base, base + length) of `file` into
  // `out`, verifying every checksum block of the range that they overlap
  // (blocks are counted from `base`; none when `checksums` is empty). A block
  // only partly needed stays cached in the calling thread, so consecutive
  // reads that split it (slabs of whole rows) read and verify it once.
  void read(uint32_t file, uint64_t base, uint64_t length, const std::vector<uint64_t>& checksums, uint64_t begin,
            uint64_t end, uint8_t* out, const std::string& what);
  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out);
  // StorageReader::read_chunk_runs: each checksum block the runs touch is
  // read with one preadv straight into the runs' outputs (what lies between
  // them into a scratch buffer), then hashed from there.
  void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs);
  std::string read_object(const ObjectRecord& object);
  uint64_t bytes_read() const { return bytes_read_.load(); }

  // Re-reads every tensor chunk and object of `index` (the index the ranges
  // were made with, or the same with every record decoded), comparing
  // checksums where it has them; one problem line per damaged block or
  // unreadable range.
  void verify_all(const StorageIndex& index, VerifyReport& report, const VerifyProgress& progress);

 private:
  std::shared_ptr<ObjectReader> file(uint32_t index);  // from the bounded set of open files
  // Throws CorruptionError naming the block unless `digest` is checksum `index` of the range.
  void check_block(uint64_t digest, uint32_t file_index, uint64_t base, uint64_t length,
                   const std::vector<uint64_t>& checksums, uint64_t index, const std::string& what) const;

  const uint64_t id_;  // tells this object's cached block from an earlier one's at the same address
  std::shared_ptr<Backend> backend_;
  FileLookup files_;
  uint64_t block_;  // checksum block size
  bool verify_;
  std::mutex files_mutex_;
  std::list<std::pair<uint32_t, std::shared_ptr<ObjectReader>>> open_files_;  // most recently used first
  std::atomic<uint64_t> bytes_read_{0};
};

// A storage format whose tensors and objects are byte ranges of files: the
// reads are FileRanges'; the format supplies the index, common state and
// verification.
class FileBackedStorage : public StorageReader {
 public:
  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) override {
    ranges_->read_chunk(tensor, chunk, begin, end, out);
  }
  void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) override {
    ranges_->read_chunk_runs(tensor, chunk, runs);
  }
  std::string read_object(const ObjectRecord& object) override { return ranges_->read_object(object); }
  uint64_t bytes_read() const override { return ranges_->bytes_read(); }

 protected:
  std::unique_ptr<FileRanges> ranges_;  // set by the format's constructor, once its index is built
};

}  // namespace distckpt::storage
