#include "io/file_write_job.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "distckpt/core/errors.h"
#include "io/checksum.h"
#include "io/threads.h"

namespace distckpt::io {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Slices hold whole checksum blocks so that each thread checksums its own,
// and fit the pool when it is bounded.
uint64_t slice_size(const FileWriteOptions& o, uint64_t pool_capacity) {
  uint64_t target = std::max<uint64_t>(o.slice_bytes, File::kDirectAlignment);
  if (pool_capacity != 0) target = std::min(target, std::max<uint64_t>(pool_capacity, File::kDirectAlignment));
  if (o.checksum_block == 0) return align_up(target, File::kDirectAlignment);
  return std::max<uint64_t>(1, target / o.checksum_block) * o.checksum_block;
}

}  // namespace

FileWriteJob::FileWriteJob(std::string path, std::vector<WriteItem> items, std::shared_ptr<BufferPool> pool,
                           FileWriteOptions options)
    : FileWriteJob(
          path, [path](bool direct_ok) { return file_sink(path, direct_ok); }, std::move(items), std::move(pool),
          options) {}

FileWriteJob::FileWriteJob(std::string name, SinkFactory open_sink, std::vector<WriteItem> items,
                           std::shared_ptr<BufferPool> pool, FileWriteOptions options)
    : path_(std::move(name)), items_(std::move(items)), pool_(std::move(pool)), options_(options) {
  if (options_.threads < 1) throw UsageError(fmt::format("io_threads must be at least 1 (got {})", options_.threads));
  const uint64_t slice = slice_size(options_, pool_->capacity_bytes());
  uint64_t at = 0;
  result_.items.resize(items_.size());
  for (uint32_t i = 0; i < items_.size(); ++i) {
    ItemWritten& w = result_.items[i];
    w.byte_offset = at;
    w.byte_length = items_[i].bytes;
    if (options_.checksum_block != 0) {
      w.block_checksums.resize((w.byte_length + options_.checksum_block - 1) / options_.checksum_block);
    }
    for (uint64_t off = 0; off < w.byte_length; off += slice) {
      slices_.push_back(Slice{i, off, std::min(slice, w.byte_length - off)});
    }
    payload_ += w.byte_length;
    at = align_up(at + w.byte_length, File::kDirectAlignment);
  }
  result_.file_size = at;
  if (items_.empty()) {
    synced_ = true;  // nothing to write, no file
    return;
  }
  sink_ = open_sink(options_.direct_io && slice % File::kDirectAlignment == 0);
  start();
}

void FileWriteJob::start() {
  if (synced_ || !threads_.empty()) return;
  const size_t threads = std::min<size_t>(static_cast<size_t>(options_.threads), slices_.size() + 1);
  start_threads(
      threads_, threads, [this] { run(); }, "writing '" + path_ + "'");
}

FileWriteJob::~FileWriteJob() {
  cancel();
  for (std::thread& t : threads_) t.join();
  if (sink_ && !synced_) sink_->abort();
}

void FileWriteJob::cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (synced_) return;
    cancelled_ = true;
  }
  progress_.notify_all();
}

void FileWriteJob::stage(size_t slice, uint8_t* dst) {
  const Slice& s = slices_[slice];
  items_[s.item].copy_out(s.offset, s.bytes, dst);
  const uint64_t padded = align_up(s.bytes, File::kDirectAlignment);
  if (padded > s.bytes) std::memset(dst + s.bytes, 0, padded - s.bytes);
}

void FileWriteJob::write(const Staged& staged) {
  const Slice& s = slices_[staged.slice];
  ItemWritten& w = result_.items[s.item];
  const uint64_t block = options_.checksum_block;
  if (block != 0) {
    for (uint64_t off = 0; off < s.bytes; off += block) {
      w.block_checksums[(s.offset + off) / block] = xxh3(staged.buffer.data() + off, std::min(block, s.bytes - off));
    }
  }
  // The item's last slice also writes the zeros up to the next aligned
  // offset, where the next item starts; an inner slice ends where the next
  // begins (slices hold whole checksum blocks, which need not be aligned).
  const bool last = s.offset + s.bytes == w.byte_length;
  sink_->write_at(w.byte_offset + s.offset, staged.buffer.data(),
                  last ? align_up(s.bytes, File::kDirectAlignment) : s.bytes);
}

void FileWriteJob::run() {
  bool lowered = false;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!cancelled_ && !error_ && !synced_) {
    try {
      if (next_stage_ < slices_.size()) {
        std::optional<BufferPool::Buffer> buffer =
            pool_->try_acquire(align_up(slices_[next_stage_].bytes, File::kDirectAlignment));
        if (buffer) {
          const size_t index = next_stage_++;
          lock.unlock();
          stage(index, buffer->data());
          lock.lock();
          ready_.push_back(Staged{index, std::move(*buffer)});
          if (++staged_ == slices_.size()) {
            for (WriteItem& item : items_) item.copy_out = nullptr;  // let go of the sources
          }
          progress_.notify_all();
          continue;
        }
      }
      if (!ready_.empty()) {
        if (options_.background_writes && !lowered && next_stage_ == slices_.size()) {
          // Per thread on Linux; best effort (a failure only costs speed).
          setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
          lowered = true;
        }
        Staged staged = std::move(ready_.front());
        ready_.pop_front();
        lock.unlock();
        write(staged);
        staged.buffer = BufferPool::Buffer();  // back to the pool before reporting progress
        lock.lock();
        ++written_;
        progress_.notify_all();
        continue;
      }
      if (written_ == slices_.size() && !syncing_) {
        syncing_ = true;
        lock.unlock();
        sink_->finish(result_.file_size);
        result_.direct = sink_->direct();
        lock.lock();
        synced_ = true;
        progress_.notify_all();
        break;
      }
    } catch (...) {
      if (!lock.owns_lock()) lock.lock();
      if (!error_) error_ = std::current_exception();
      progress_.notify_all();
      break;
    }
    // Waiting for a staged slice, for pool space (released by any job), or
    // for the thread that syncs.
    progress_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

void FileWriteJob::wait_staged() {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] { return staged_ == slices_.size() || error_ || cancelled_ || synced_; });
  if (error_) std::rethrow_exception(error_);
  if (staged_ != slices_.size()) throw Error(fmt::format("writing '{}' was cancelled", path_));
}

FileWritten FileWriteJob::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] { return synced_ || error_ || cancelled_; });
  if (error_) std::rethrow_exception(error_);
  if (!synced_) throw Error(fmt::format("writing '{}' was cancelled", path_));
  return result_;
}

bool FileWriteJob::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return synced_ || error_ != nullptr;
}

}  // namespace distckpt::io
