// io::BufferPool and io::FileWriteJob: aligned layout, checksums per block,
// identical bytes with and without O_DIRECT, bounded pools, errors, cancel;
// how many I/O threads a rank uses.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "distckpt/api/options.h"
#include "distckpt/core/errors.h"
#include "io/buffer_pool.h"
#include "io/checksum.h"
#include "io/file_write_job.h"
#include "support/ranks.h"

namespace distckpt::io {
namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed) & 0xff);
  return v;
}

WriteItem item_of(const std::vector<uint8_t>& bytes) {
  return WriteItem{bytes.size(),
                   [&bytes](uint64_t off, uint64_t n, uint8_t* dst) { std::memcpy(dst, bytes.data() + off, n); }};
}

TEST(BufferPool, ReusesBuffersAndHonoursItsCapacity) {
  auto pool = BufferPool::create({uint64_t{1} << 20, false});
  const uint8_t* first = nullptr;
  {
    BufferPool::Buffer a = pool->acquire(100);
    EXPECT_EQ(a.size(), BufferPool::kMinClass);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % BufferPool::kAlignment, 0u);
    first = a.data();
  }
  EXPECT_EQ(pool->acquire(1000).data(), first);  // the same warm buffer again
  BufferPool::Buffer half = pool->acquire(512 << 10);
  BufferPool::Buffer other = pool->acquire(512 << 10);
  EXPECT_FALSE(pool->try_acquire(512 << 10).has_value());  // full while both are in use
  EXPECT_LE(pool->allocated_bytes(), uint64_t{1} << 20);
  EXPECT_THROW(pool->try_acquire(2 << 20), Error);  // can never fit
}

TEST(FileWriteJob, LaysOutAlignedItemsWithBlockChecksums) {
  TempDir tmp("write-job");
  const auto a = pattern(5000, 1), b = pattern(0, 2), c = pattern(3 << 20, 3);
  for (const bool direct : {false, true}) {
    const std::string path = tmp.file(direct ? "direct.bin" : "buffered.bin");
    FileWriteOptions options;
    options.direct_io = direct;
    options.checksum_block = 1 << 20;
    options.slice_bytes = 1 << 20;
    FileWriteJob job(path, {item_of(a), item_of(b), item_of(c)}, BufferPool::create({}), options);
    const FileWritten w = job.wait();
    ASSERT_EQ(w.items.size(), 3u);
    EXPECT_EQ(w.items[0].byte_offset, 0u);
    EXPECT_EQ(w.items[1].byte_offset, 8192u);  // 5000 rounded up to 4 KiB
    EXPECT_EQ(w.items[2].byte_offset, 8192u);  // an empty item takes no room
    EXPECT_EQ(w.file_size, 8192u + (3u << 20));
    EXPECT_EQ(w.items[0].block_checksums, (std::vector<uint64_t>{xxh3(a.data(), a.size())}));
    ASSERT_EQ(w.items[2].block_checksums.size(), 3u);
    EXPECT_EQ(w.items[2].block_checksums[1], xxh3(c.data() + (1 << 20), 1 << 20));
    const std::string bytes = read_file(path, w.file_size);
    EXPECT_EQ(std::memcmp(bytes.data(), a.data(), a.size()), 0);
    EXPECT_EQ(std::memcmp(bytes.data() + 8192, c.data(), c.size()), 0);
  }
  EXPECT_EQ(read_file(tmp.file("direct.bin"), 1 << 23), read_file(tmp.file("buffered.bin"), 1 << 23));
}

TEST(FileWriteJob, BoundedPoolOverlapsStagingAndWriting) {
  TempDir tmp("write-job-bounded");
  const auto big = pattern(6 << 20, 9);
  auto pool = BufferPool::create({uint64_t{1} << 20, false});
  FileWriteOptions options;
  FileWriteJob job(tmp.file("f.bin"), {item_of(big)}, pool, options);
  job.wait_staged();
  const FileWritten w = job.wait();
  EXPECT_LE(pool->peak_allocated_bytes(), uint64_t{1} << 20);
  EXPECT_EQ(read_file(tmp.file("f.bin"), w.file_size), std::string(big.begin(), big.end()));
}

TEST(FileWriteJob, ASourceErrorIsRaisedByWaitAndNoEmptyJobMakesAFile) {
  TempDir tmp("write-job-error");
  std::vector<WriteItem> items{WriteItem{100, [](uint64_t, uint64_t, uint8_t*) { throw Error("source went away"); }}};
  FileWriteJob job(tmp.file("f.bin"), std::move(items), BufferPool::create({}), {});
  EXPECT_THROW(job.wait_staged(), Error);
  EXPECT_THROW(job.wait(), Error);
  FileWriteJob empty(tmp.file("none.bin"), {}, BufferPool::create({}), {});
  EXPECT_TRUE(empty.finished());
  EXPECT_EQ(empty.wait().file_size, 0u);
  EXPECT_FALSE(exists(tmp.file("none.bin")));
}

TEST(FileWriteJob, DestroyingARunningJobCancelsIt) {
  TempDir tmp("write-job-cancel");
  const auto big = pattern(32 << 20, 4);
  auto pool = BufferPool::create({uint64_t{2} << 20, false});
  { FileWriteJob job(tmp.file("f.bin"), {item_of(big)}, pool, {}); }  // joins without hanging
  EXPECT_EQ(pool->in_use_bytes(), 0u);
}

// Sets LOCAL_WORLD_SIZE for one scope (the launcher's variable).
class LocalWorldSize {
 public:
  explicit LocalWorldSize(const char* value) {
    if (const char* old = std::getenv("LOCAL_WORLD_SIZE")) old_ = old;
    value ? setenv("LOCAL_WORLD_SIZE", value, 1) : unsetenv("LOCAL_WORLD_SIZE");
  }
  ~LocalWorldSize() { old_ ? setenv("LOCAL_WORLD_SIZE", old_->c_str(), 1) : unsetenv("LOCAL_WORLD_SIZE"); }

 private:
  std::optional<std::string> old_;
};

TEST(IoThreads, AnExplicitCountWinsAndZeroSharesTheHostsCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  {
    LocalWorldSize unset(nullptr);
    EXPECT_EQ(resolve_io_threads(3), 3);
    EXPECT_EQ(resolve_io_threads(0), std::clamp(cores, 1, kMaxAutoIoThreads));
  }
  {
    LocalWorldSize many("100000");  // more ranks than cores: one thread each
    EXPECT_EQ(resolve_io_threads(0), 1);
    EXPECT_EQ(resolve_io_threads(2), 2);
  }
  {
    LocalWorldSize two("2");
    EXPECT_EQ(resolve_io_threads(0), std::clamp(cores / 2, 1, kMaxAutoIoThreads));
  }
  {
    LocalWorldSize garbage("two");  // ignored, as if unset
    EXPECT_EQ(resolve_io_threads(0), std::clamp(cores, 1, kMaxAutoIoThreads));
  }
  try {
    resolve_io_threads(-1);
    FAIL() << "a negative count must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("io_threads is -1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distckpt::io
