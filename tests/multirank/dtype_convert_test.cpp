// LoadOptions::convert_dtype: a floating-point tensor loads into another
// floating-point dtype under any layout and exchange mode, values converted
// as they are copied; without the option, or for integers, a clear error.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// Saves "w" [8, 6] in `dtype`, split by rows over 2 ranks, and "ids" [4] int64.
std::string save_rows(const TempDir& tmp, at::ScalarType dtype) {
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", {8, 6}, dtype).narrow(0, 4 * r, 4).clone(),
                                               {{0, r, 2}});
    sd["ids"] = ShardedTensor::from_rank_offsets("ids", at::arange(4, at::kLong), {}, ReplicaId{r});
    save(sd, dir, comm);
  });
  return dir;
}

TEST(DtypeConvert, Bf16StoredLoadsAsFp32ByColumnsInEveryExchangeMode) {
  TempDir tmp("dtype-convert");
  const std::string dir = save_rows(tmp, at::kBFloat16);
  const at::Tensor expected = global_tensor("w", {8, 6}, at::kBFloat16).to(at::kFloat);
  for (const LoadExchange mode : {LoadExchange::kNone, LoadExchange::kBroadcast, LoadExchange::kAllGather}) {
    run_ranks(3, [&](Communicator& comm) {
      StateDict sd = Value::dict();
      sd["w"] = ShardedTensor::from_rank_offsets("w", at::empty({8, 2}), {{1, comm.rank(), 3}});
      LoadOptions options;
      options.convert_dtype = true;
      options.exchange = mode;
      const LoadResult out = load(sd, dir, comm, options);
      const at::Tensor got = out.state_dict.at("w").as_tensor();
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(got, expected.narrow(1, 2 * comm.rank(), 2))) << static_cast<int>(mode);
    });
  }
}

TEST(DtypeConvert, Fp32StoredLoadsAsBf16WholeRows) {
  TempDir tmp("dtype-convert-down");
  const std::string dir = save_rows(tmp, at::kFloat);
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::empty({4, 6}, at::kBFloat16), {{0, comm.rank(), 2}});
    LoadOptions options;
    options.convert_dtype = true;
    const LoadResult out = load(sd, dir, comm, options);
    EXPECT_TRUE(at::equal(out.state_dict.at("w").as_tensor(),
                          global_tensor("w", {8, 6}).to(at::kBFloat16).narrow(0, 4 * comm.rank(), 4)));
  });
}

TEST(DtypeConvert, OnlyFloatingPointAndOnlyWhenAsked) {
  TempDir tmp("dtype-convert-refused");
  const std::string dir = save_rows(tmp, at::kBFloat16);
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::empty({8, 6}), {});
    EXPECT_TRUE(throws_with<ShardingError>([&] { load(sd, dir, comm); },
                                           "'w' is stored as bfloat16 in '" + dir +
                                               "' but requested as float32; request the stored dtype, set "
                                               "LoadOptions::convert_dtype"));
    StateDict ids = Value::dict();
    ids["ids"] = ShardedTensor::from_rank_offsets("ids", at::empty({4}, at::kInt), {});
    LoadOptions options;
    options.convert_dtype = true;
    EXPECT_TRUE(throws_with<ShardingError>([&] { load(ids, dir, comm, options); }, "'ids' is stored as int64"));
  });
}

}  // namespace
}  // namespace distckpt
