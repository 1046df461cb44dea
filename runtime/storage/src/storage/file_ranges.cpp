#include "storage/file_ranges.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "distckpt/core/errors.h"
#include "format/metadata.h"
#include "io/checksum.h"

namespace distckpt::storage {
namespace {

// Without checksums, verification still re-reads every byte (a failing disk
// shows there), in pieces of this size.
constexpr uint64_t kUncheckedPiece = uint64_t{16} << 20;

// Re-reads ranges block by block, collecting problems instead of stopping at
// the first, reporting progress at most every kProgressInterval.
class BlockChecker {
 public:
  BlockChecker(FileRanges& ranges, const StorageIndex& index, uint64_t total, const VerifyProgress& progress,
               VerifyReport& report)
      : ranges_(ranges), index_(index), total_(total), progress_(progress), report_(report) {}

  void check(uint32_t file, uint64_t offset, uint64_t length, const std::vector<uint64_t>& checksums,
             const std::string& what) {
    const std::string& name = index_.files.at(file).path;
    const bool checked = !checksums.empty();
    const uint64_t block = checked ? index_.checksum_block_size : kUncheckedPiece;
    try {
      const std::unique_ptr<ObjectReader> f = ranges_.open_uncached(file);
      // Several blocks per read where requests are costly (an object store).
      const uint64_t per_read = std::max<uint64_t>(1, f->preferred_read_bytes() / block);
      for (uint64_t i = 0; i * block < length; i += per_read) {
        const uint64_t s = i * block, n = std::min(block * per_read, length - s);
        buffer_.resize(n);
        f->read(offset + s, n, buffer_.data());
        for (uint64_t b = 0; b < n; b += block) {
          const uint64_t m = std::min(block, n - b);
          report_.bytes_checked += m;
          if (checked) {
            ++report_.blocks_checked;
            if (io::xxh3(buffer_.data() + b, m) != checksums[i + b / block]) {
              report_.problems.push_back(fmt::format("checksum mismatch: {} (file '{}', bytes {}..{})", what, name,
                                                     offset + s + b, offset + s + b + m));
            }
          }
          tick();
        }
      }
    } catch (const Error& e) {
      report_.problems.push_back(fmt::format("cannot read {}: {}", what, e.what()));
    }
  }

  void finish() {
    if (progress_) progress_(report_.bytes_checked, total_);
  }

 private:
  static constexpr auto kProgressInterval = std::chrono::milliseconds(250);

  void tick() {
    if (!progress_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < kProgressInterval) return;
    last_ = now;
    progress_(report_.bytes_checked, total_);
  }

  FileRanges& ranges_;
  const StorageIndex& index_;
  uint64_t total_;
  const VerifyProgress& progress_;
  VerifyReport& report_;
  std::vector<uint8_t> buffer_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

namespace {

std::atomic<uint64_t> next_ranges_id{1};

// The calling thread's last partly needed block, verified.
struct CachedBlock {
  uint64_t ranges = 0;  // FileRanges::id_; 0: none
  uint32_t file = 0;
  uint64_t offset = 0;  // in the file
  std::vector<uint8_t> bytes;
};
thread_local CachedBlock cached_block;

}  // namespace

FileRanges::FileRanges(std::shared_ptr<Backend> backend, FileLookup files, uint64_t checksum_block_size,
                       bool verify_checksums)
    : id_(next_ranges_id++),
      backend_(std::move(backend)),
      files_(std::move(files)),
      block_(checksum_block_size),
      verify_(verify_checksums) {}

FileRanges::FileRanges(std::shared_ptr<Backend> backend, const StorageIndex& index, bool verify_checksums)
    : FileRanges(
          std::move(backend), [&index](uint32_t i) -> const FileRecord& { return index.files.at(i); },
          index.checksum_block_size, verify_checksums) {}

std::unique_ptr<ObjectReader> FileRanges::open_uncached(uint32_t index) const {
  const FileRecord& record = files_(index);
  std::unique_ptr<ObjectReader> opened;
  try {
    opened = backend_->open(record.path);  // a regular file or object, inside the checkpoint
  } catch (const IoError& e) {
    // A file the index lists that is not there: the checkpoint is incomplete,
    // as the coordinator's check of every file (check_files) says too.
    if (e.error_number() == ENOENT) throw missing_listed_file(backend_->describe(record.path));
    throw;
  }
  // Its size is checked here, on the object opened: a rank checks the files
  // it reads, not every file of the checkpoint (StorageOptions::check_every_file).
  check_file_size(backend_->describe(record.path), opened->size(), record.size);
  return opened;
}

std::shared_ptr<ObjectReader> FileRanges::file(uint32_t index) {
  std::lock_guard<std::mutex> lock(files_mutex_);
  for (auto it = open_files_.begin(); it != open_files_.end(); ++it) {
    if (it->first == index) {
      open_files_.splice(open_files_.begin(), open_files_, it);
      return open_files_.front().second;
    }
  }
  // A file evicted here stays open until the threads reading it are done.
  if (open_files_.size() >= kMaxOpenFiles) open_files_.pop_back();
  open_files_.emplace_front(index, std::shared_ptr<ObjectReader>(open_uncached(index)));
  return open_files_.front().second;
}

void FileRanges::check_block(uint64_t digest, uint32_t file_index, uint64_t base, uint64_t length,
                             const std::vector<uint64_t>& checksums, uint64_t index, const std::string& what) const {
  if (digest == checksums.at(index)) return;
  const uint64_t block = block_;
  const uint64_t s = index * block, e = std::min(s + block, length);
  throw CorruptionError(
      fmt::format("checksum mismatch in {} (file '{}', bytes {}..{}): the checkpoint is corrupt; run `distckpt verify "
                  "{}` and load an intact copy",
                  what, files_(file_index).path, base + s, base + e, backend_->location()),
      backend_->describe(files_(file_index).path));
}

void FileRanges::read(uint32_t file_index, uint64_t base, uint64_t length, const std::vector<uint64_t>& checksums,
                      uint64_t begin, uint64_t end, uint8_t* out, const std::string& what) {
  const std::shared_ptr<ObjectReader> handle = file(file_index);
  const ObjectReader& f = *handle;
  if (!verify_ || checksums.empty()) {
    f.read(base + begin, end - begin, out);
    bytes_read_ += end - begin;
    return;
  }
  const uint64_t block = block_;
  auto verify_block = [&](const uint8_t* data, uint64_t index) {
    const uint64_t s = index * block, e = std::min(s + block, length);
    check_block(io::xxh3(data, e - s), file_index, base, length, checksums, index, what);
  };
  uint64_t pos = begin;
  while (pos < end) {
    const uint64_t index = pos / block;
    const uint64_t block_begin = index * block;
    const uint64_t block_end = std::min(block_begin + block, length);
    if (block_begin >= begin && block_end <= end) {
      // Whole blocks: read straight into `out` and verified at once, while
      // their bytes are still in the CPU's cache (a second pass over a long
      // run would fetch them from memory again): one block per read, or as
      // many as one request should carry where requests are costly.
      uint64_t run_end = block_end;
      while (run_end < end && run_end - block_begin < f.preferred_read_bytes()) {
        const uint64_t next = std::min(run_end + block, length);
        if (next > end) break;
        run_end = next;
      }
      f.read(base + block_begin, run_end - block_begin, out + (block_begin - begin));
      bytes_read_ += run_end - block_begin;
      for (uint64_t b = block_begin; b < run_end; b += block) verify_block(out + (b - begin), b / block);
      pos = run_end;
      continue;
    }
    // A block only partly needed: read it whole into the cache, verify, copy the needed part.
    CachedBlock& c = cached_block;
    if (c.ranges != id_ || c.file != file_index || c.offset != base + block_begin ||
        c.bytes.size() != block_end - block_begin) {
      c.ranges = 0;
      c.bytes.resize(block_end - block_begin);
      f.read(base + block_begin, block_end - block_begin, c.bytes.data());
      bytes_read_ += block_end - block_begin;
      verify_block(c.bytes.data(), index);
      c = CachedBlock{id_, file_index, base + block_begin, std::move(c.bytes)};
    }
    const uint64_t to = std::min(end, block_end);
    std::memcpy(out + (pos - begin), c.bytes.data() + (pos - block_begin), to - pos);
    pos = to;
  }
}

void FileRanges::read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) {
  const ChunkRecord& c = tensor.chunks.at(chunk);
  read(c.file, c.byte_offset, c.byte_length, c.block_checksums, begin, end, out,
       fmt::format("'{}' chunk {}", tensor.key, chunk));
}

void FileRanges::read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) {
  if (runs.empty()) return;
  const ChunkRecord& c = tensor.chunks.at(chunk);
  const uint64_t begin = runs.front().offset, end = runs.back().offset + runs.back().bytes;
  for (size_t i = 0; i < runs.size(); ++i) {
    const uint64_t next = i + 1 < runs.size() ? runs[i + 1].offset : c.byte_length;
    if (runs[i].offset + runs[i].bytes > next) {
      throw UsageError(fmt::format("read of '{}' chunk {}: byte runs overlap or leave the chunk ({} + {} > {})",
                                   tensor.key, chunk, runs[i].offset, runs[i].bytes, next));
    }
  }
  const std::shared_ptr<ObjectReader> handle = file(c.file);
  const bool verify = verify_ && !c.block_checksums.empty();
  // Windows: each checksum block the runs touch, whole; unverified, the span in pieces.
  const uint64_t window = verify ? block_ : kUncheckedPiece;
  thread_local std::vector<uint8_t> scratch;  // what lies between the runs, at its place in the window
  std::vector<struct iovec> iov;
  size_t r = 0;       // the run being placed
  uint64_t done = 0;  // its bytes placed
  for (uint64_t wb = verify ? begin / window * window : begin; wb < end;) {
    const uint64_t we = verify ? std::min(wb + window, c.byte_length) : std::min(wb + window, end);
    scratch.resize(we - wb);
    iov.clear();
    for (uint64_t pos = wb; pos < we;) {
      const uint64_t next = r < runs.size() ? std::min(runs[r].offset + done, we) : we;
      if (next > pos) {  // not wanted: into the scratch
        iov.push_back({scratch.data() + (pos - wb), next - pos});
        pos = next;
        continue;
      }
      const uint64_t n = std::min(runs[r].offset + runs[r].bytes, we) - pos;
      iov.push_back({runs[r].out + done, n});
      pos += n;
      done += n;
      if (done == runs[r].bytes) {
        ++r;
        done = 0;
      }
    }
    handle->readv(iov, c.byte_offset + wb);
    bytes_read_ += we - wb;
    if (verify) {
      io::StreamingHash hash;
      for (const struct iovec& v : iov) hash.update(v.iov_base, v.iov_len);
      check_block(hash.digest(), c.file, c.byte_offset, c.byte_length, c.block_checksums, wb / window,
                  fmt::format("'{}' chunk {}", tensor.key, chunk));
    }
    wb = we;
  }
}

std::string FileRanges::read_object(const ObjectRecord& object) {
  std::string bytes(object.byte_length, '\0');
  read(object.file, object.byte_offset, object.byte_length, object.block_checksums, 0, object.byte_length,
       reinterpret_cast<uint8_t*>(bytes.data()), fmt::format("object '{}'", object.unique_key()));
  return bytes;
}

void FileRanges::verify_all(const StorageIndex& index, VerifyReport& report, const VerifyProgress& progress) {
  uint64_t total = 0;
  for (const TensorRecord& t : index.tensors) {
    for (const ChunkRecord& chunk : t.chunks) total += chunk.byte_length;
  }
  for (const ObjectRecord& o : index.objects) total += o.byte_length;
  BlockChecker checker(*this, index, total, progress, report);
  for (const TensorRecord& t : index.tensors) {
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const ChunkRecord& chunk = t.chunks[c];
      checker.check(chunk.file, chunk.byte_offset, chunk.byte_length, chunk.block_checksums,
                    fmt::format("tensor '{}' chunk {} ({})", t.key, c, to_string(chunk.box)));
    }
  }
  for (const ObjectRecord& o : index.objects) {
    checker.check(o.file, o.byte_offset, o.byte_length, o.block_checksums, fmt::format("object '{}'", o.unique_key()));
  }
  checker.finish();
}

}  // namespace distckpt::storage
