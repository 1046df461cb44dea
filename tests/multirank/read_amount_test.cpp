// Loads read only the stored bytes that overlap the request: exactly those
// without verification, and whole checksum blocks around them with it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "load/checkpoint_reader.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

// One rank saves "big", [1024, 1024] float32: 4 MiB, four 1 MiB checksum blocks. Returns its values.
at::Tensor save_big(const std::string& dir) {
  const at::Tensor g = testing::global_tensor("big", {1024, 1024});
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["big"] = ShardedTensor::from_rank_offsets("big", g, {});
    save(sd, dir, comm);
  });
  return g;
}

TEST(ReadAmount, SmallRegionsReadOnlyTheirBytesOrTheirChecksumBlocks) {
  TempDir tmp("read-amount");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor g = save_big(dir);
  const Box two_rows{{300, 0}, {2, 1024}};  // 8 KiB inside block 1
  {
    loading::CheckpointReader reader(dir, /*verify_checksums=*/false);
    at::Tensor out = at::empty({2, 1024});
    reader.read_region(reader.tensor("big"), two_rows, out);
    EXPECT_TRUE(at::equal(out, g.narrow(0, 300, 2)));
    EXPECT_EQ(reader.bytes_read(), 2u * 1024 * 4);
  }
  {
    loading::CheckpointReader reader(dir);
    at::Tensor out = at::empty({2, 1024});
    reader.read_region(reader.tensor("big"), two_rows, out);
    EXPECT_TRUE(at::equal(out, g.narrow(0, 300, 2)));
    EXPECT_EQ(reader.bytes_read(), uint64_t{1} << 20);  // the one block it verifies
  }
  {
    // A column strip touches every row: all four blocks, each read once.
    loading::CheckpointReader reader(dir);
    at::Tensor out = at::empty({1024, 16});
    reader.read_region(reader.tensor("big"), Box{{0, 512}, {1024, 16}}, out);
    EXPECT_TRUE(at::equal(out, g.narrow(1, 512, 16)));
    EXPECT_EQ(reader.bytes_read(), uint64_t{4} << 20);
  }
}

// Byte runs of a column strip (64 bytes of every 4 KiB row) scattered into
// their destination: with verification every checksum block the runs touch
// is read once and hashed whole, so a flipped byte between the runs is found.
TEST(ReadAmount, ScatteredRunsReadEachTouchedBlockOnceAndVerifyTheBytesBetween) {
  TempDir tmp("read-runs");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor g = save_big(dir);
  auto strip_runs = [](at::Tensor& out, int64_t first_row, int64_t rows) {
    std::vector<ByteRun> runs;
    for (int64_t r = 0; r < rows; ++r) {
      runs.push_back(ByteRun{static_cast<uint64_t>(((first_row + r) * 1024 + 512) * 4), 16 * 4,
                             static_cast<uint8_t*>(out.data_ptr()) + r * 16 * 4});
    }
    return runs;
  };
  {
    loading::CheckpointReader reader(dir);
    at::Tensor out = at::zeros({1024, 16});
    reader.read_chunk_runs(reader.tensor("big"), 0, strip_runs(out, 0, 1024));
    EXPECT_TRUE(at::equal(out, g.narrow(1, 512, 16)));
    EXPECT_EQ(reader.bytes_read(), uint64_t{4} << 20);
  }
  {
    loading::CheckpointReader reader(dir, /*verify_checksums=*/false);
    at::Tensor out = at::zeros({300, 16});
    reader.read_chunk_runs(reader.tensor("big"), 0, strip_runs(out, 100, 300));
    EXPECT_TRUE(at::equal(out, g.narrow(0, 100, 300).narrow(1, 512, 16)));
    EXPECT_EQ(reader.bytes_read(), uint64_t{299 * 1024 + 16} * 4);  // the runs' span
  }
  {
    loading::CheckpointReader reader(dir);
    at::Tensor out = at::zeros({1024, 16});
    std::vector<ByteRun> runs = strip_runs(out, 0, 1024);
    runs[7].bytes = 5000;  // into the next run
    EXPECT_THROW(reader.read_chunk_runs(reader.tensor("big"), 0, runs), Error);
  }
  flip_byte(dir + "/data/rank_00000.bin", 3 * 4096 + 8);  // row 3, column 2: outside the strip
  loading::CheckpointReader reader(dir);
  at::Tensor out = at::zeros({1024, 16});
  EXPECT_THROW(reader.read_chunk_runs(reader.tensor("big"), 0, strip_runs(out, 0, 1024)), CorruptionError);
}

}  // namespace
}  // namespace distckpt
