// Loads read only the stored bytes that overlap the request: exactly those
// without verification, and whole checksum blocks around them with it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "api/checkpoint_reader.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

TEST(ReadAmount, SmallRegionsReadOnlyTheirBytesOrTheirChecksumBlocks) {
  TempDir tmp("read-amount");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor g = testing::global_tensor("big", {1024, 1024});  // 4 MiB: four 1 MiB checksum blocks
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["big"] = ShardedTensor::from_rank_offsets("big", g, {});
    save(sd, dir, comm);
  });
  const Box two_rows{{300, 0}, {2, 1024}};  // 8 KiB inside block 1
  {
    api::CheckpointReader reader(dir, /*verify_checksums=*/false);
    at::Tensor out = at::empty({2, 1024});
    reader.read_region(reader.tensor("big"), two_rows, out);
    EXPECT_TRUE(at::equal(out, g.narrow(0, 300, 2)));
    EXPECT_EQ(reader.bytes_read(), 2u * 1024 * 4);
  }
  {
    api::CheckpointReader reader(dir);
    at::Tensor out = at::empty({2, 1024});
    reader.read_region(reader.tensor("big"), two_rows, out);
    EXPECT_TRUE(at::equal(out, g.narrow(0, 300, 2)));
    EXPECT_EQ(reader.bytes_read(), uint64_t{1} << 20);  // the one block it verifies
  }
  {
    // A column strip touches every row: all four blocks, each read once.
    api::CheckpointReader reader(dir);
    at::Tensor out = at::empty({1024, 16});
    reader.read_region(reader.tensor("big"), Box{{0, 512}, {1024, 16}}, out);
    EXPECT_TRUE(at::equal(out, g.narrow(1, 512, 16)));
    EXPECT_EQ(reader.bytes_read(), uint64_t{4} << 20);
  }
}

}  // namespace
}  // namespace distckpt
