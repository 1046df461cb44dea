// One rank's data file, written by a few threads: items laid out one after
// another at 4 KiB-aligned offsets, cut into slices; each slice is copied out
// of its source into a pooled buffer ("staged"), checksummed block by block
// and written with one pwrite (O_DIRECT where the file system allows), then
// the file is fsync'ed.
//
// Staging is preferred over writing while pool buffers are available, so an
// asynchronous save gets its sources copied (and the caller released) as soon
// as possible; with a bounded pool, copying and writing overlap.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/buffer_pool.h"
#include "io/byte_sink.h"
#include "io/file.h"

namespace distckpt::io {

struct WriteItem {
  uint64_t bytes = 0;
  // Copies bytes [offset, offset + n) of the item into host memory `dst`.
  // Called from writer threads, concurrently for disjoint ranges.
  std::function<void(uint64_t offset, uint64_t n, uint8_t* dst)> copy_out;
};

struct FileWriteOptions {
  int threads = 2;
  bool direct_io = true;
  uint64_t checksum_block = uint64_t{1} << 20;  // 0: no checksums
  uint64_t slice_bytes = uint64_t{16} << 20;    // rounded to whole checksum blocks
  // Once everything is staged, the threads lower their scheduling priority
  // (nice +10): an asynchronous save's writing must not slow the training
  // that goes on meanwhile, nor the staging of other ranks on the node.
  bool background_writes = false;
};

struct ItemWritten {
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  std::vector<uint64_t> block_checksums;
};

struct FileWritten {
  uint64_t file_size = 0;
  bool direct = false;  // written with O_DIRECT
  std::vector<ItemWritten> items;
};

class FileWriteJob {
 public:
  // Creates the file (none when `items` is empty) and starts the threads.
  FileWriteJob(std::string path, std::vector<WriteItem> items, std::shared_ptr<BufferPool> pool,
               FileWriteOptions options);
  // The same into the sink `open_sink` makes (an object of a backend); its
  // argument says whether O_DIRECT would suit the slices. `name` is for
  // messages. Unfinished, the sink is aborted.
  using SinkFactory = std::function<std::unique_ptr<ByteSink>(bool direct_ok)>;
  FileWriteJob(std::string name, SinkFactory open_sink, std::vector<WriteItem> items, std::shared_ptr<BufferPool> pool,
               FileWriteOptions options);
  // Cancels what is left and joins the threads; never throws. A file that was
  // not finished stays behind, incomplete: the caller owns its directory.
  ~FileWriteJob();
  FileWriteJob(const FileWriteJob&) = delete;
  FileWriteJob& operator=(const FileWriteJob&) = delete;

  // Blocks until every byte was copied out of its source (sources may change
  // afterwards). Rethrows the first error.
  void wait_staged();
  // Blocks until everything is written, fsync'ed and closed. Rethrows the
  // first error.
  FileWritten wait();
  // wait() would return or throw without blocking.
  bool finished() const;
  // Stops at the next slice; wait() then throws.
  void cancel();

  uint64_t payload_bytes() const { return payload_; }

 private:
  struct Slice {
    uint32_t item;
    uint64_t offset;  // within the item
    uint64_t bytes;
  };
  struct Staged {
    size_t slice;
    BufferPool::Buffer buffer;
  };

  void start();
  void run();
  void stage(size_t slice, uint8_t* dst);
  void write(const Staged& staged);

  std::string path_;
  std::vector<WriteItem> items_;
  std::shared_ptr<BufferPool> pool_;
  FileWriteOptions options_;
  std::unique_ptr<ByteSink> sink_;
  std::vector<Slice> slices_;
  FileWritten result_;
  uint64_t payload_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable progress_;
  size_t next_stage_ = 0;
  size_t staged_ = 0;
  size_t written_ = 0;
  std::deque<Staged> ready_;
  bool syncing_ = false;
  bool synced_ = false;
  bool cancelled_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

}  // namespace distckpt::io
