// Issue 21 item 9: a configurable coordinator rank, the save and load
// planner hooks (DCP's resolve_data and commit_tensor) and a dry run that
// computes a checkpoint's index without saving.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>

#include "distckpt/distckpt.h"
#include "io/buffer_pool.h"
#include "multirank/checkpoint_fixtures.h"
#include "plan/partitioned_plan.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

constexpr int kRanks = 4;
const Shape kShape{8, 4};

// Rows of `w` split over the ranks, a replicated `b`, a common value that
// differs per rank (every rank warns but the coordinator) and content metadata.
StateDict state_of(int rank, at::ScalarType dtype = at::kFloat) {
  StateDict sd = Value::dict();
  const int64_t rows = kShape[0] / kRanks;
  sd["w"] = Value(ShardedTensor::from_rank_offsets(
      "w", global_tensor("w", kShape).narrow(0, rank * rows, rows).to(dtype).clone(), {{0, rank, kRanks}}));
  sd["b"] = Value(ShardedTensor::from_rank_offsets("b", global_tensor("b", {4}).to(dtype), {}, {rank}));
  sd["who"] = Value(int64_t{rank});
  return sd;
}

StateDict request_of(int rank, at::ScalarType dtype) {
  StateDict sd = Value::dict();
  sd["w"] = Value(
      ShardedTensor::from_rank_offsets("w", at::zeros({kShape[0] / kRanks, kShape[1]}, dtype), {{0, rank, kRanks}}));
  return sd;
}

TEST(PlannerHooks, TheCoordinatorRankCommitsAndItsCommonStateIsSaved) {
  TempDir tmp("hooks-coordinator");
  testing::LogCapture log;
  run_ranks(kRanks, [&](Communicator& comm) {
    SaveOptions options;
    options.coordinator_rank = 2;
    StateDict content = Value::dict();
    content["by"] = Value(int64_t{comm.rank()});
    options.content_metadata = content;
    save(state_of(comm.rank()), tmp.path() + "/sync", comm, options);

    // Asynchronous, with a plan cache: a new coordinator is a new plan.
    auto pool = io::BufferPool::create({uint64_t{1} << 20, false});
    options.plan_cache = SavePlanCache::create();
    options.coordinator_rank = 3;
    AsyncRequest first = async_save(state_of(comm.rank()), tmp.path() + "/async3", comm, options, pool);
    first.finalize(comm);
    options.coordinator_rank = 1;
    AsyncRequest second = async_save(state_of(comm.rank()), tmp.path() + "/async1", comm, options, pool);
    EXPECT_FALSE(second.plan_reused());
    second.finalize(comm);

    const LoadResult loaded = load(request_of(comm.rank(), at::kFloat), tmp.path() + "/sync", comm);
    EXPECT_TRUE(loaded.state_dict.at("w").as_tensor().equal(global_tensor("w", kShape).narrow(0, comm.rank() * 2, 2)));
  });
  const std::vector<std::pair<std::string, int>> saves = {{"/sync", 2}, {"/async3", 3}, {"/async1", 1}};
  for (const auto& [dir, coordinator] : saves) {
    const std::string path = tmp.path() + dir;
    EXPECT_TRUE(verify_checkpoint(path).intact()) << path;
    EXPECT_EQ(load_common_state_dict(path).at("who").as_int(), coordinator) << path;
    EXPECT_EQ(load_content_metadata(path)->at("by").as_int(), coordinator) << path;
  }
  EXPECT_NE(log.joined().find("the common (non-sharded) state of rank 0 differs from rank 2's at 'who'; only rank "
                              "2's is saved"),
            std::string::npos)
      << log.joined();
}

TEST(PlannerHooks, ACoordinatorRankOutsideTheWorldOrDifferentPerRankIsRefused) {
  TempDir tmp("hooks-coordinator-bad");
  run_ranks(kRanks, [&](Communicator& comm) {
    SaveOptions options;
    options.coordinator_rank = kRanks;
    EXPECT_TRUE(throws_with<UsageError>([&] { save(state_of(comm.rank()), tmp.path() + "/a", comm, options); },
                                        "SaveOptions::coordinator_rank is 4, but the ranks are 0 to 3"));
    options.coordinator_rank = comm.rank() == 3 ? 1 : 0;
    EXPECT_TRUE(throws_with<UsageError>(
        [&] { save(state_of(comm.rank()), tmp.path() + "/b", comm, options); },
        "SaveOptions::coordinator_rank is 0 on rank 0 but 1 on rank 3; pass the same on every rank"));
  });
  EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/a"));
  EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/b"));
}

// Quantized to int8 with a fixed scale on save, dequantized on load.
constexpr double kScale = 1.0 / 16;

at::Tensor quantize(const at::Tensor& t) { return t.div(kScale).round().clamp(-127, 127).to(at::kChar); }

TEST(PlannerHooks, SaveTransformStoresCastOrQuantizedAndLoadHookDequantizes) {
  TempDir tmp("hooks-transform");
  std::atomic<int> resolved{0};
  const at::Tensor small = global_tensor("w", kShape).remainder(7.0).sub(3.0);  // within int8 * kScale
  run_ranks(kRanks, [&](Communicator& comm) {
    StateDict sd = state_of(comm.rank());
    sd["w"].as_sharded_tensor().data = small.narrow(0, comm.rank() * 2, 2).clone();
    SaveOptions options;
    options.transform.stored_dtype = [](const ShardedTensor& t) { return t.key == "w" ? at::kChar : at::kBFloat16; };
    options.transform.resolve_data = [&](const ShardedTensor& t, const at::Tensor& data) {
      ++resolved;
      return t.key == "w" ? quantize(data) : data.to(at::kBFloat16);
    };
    save(sd, tmp.path() + "/ckpt", comm, options);

    // The stored int8 values, as stored.
    const LoadResult raw = load(request_of(comm.rank(), at::kChar), tmp.path() + "/ckpt", comm);
    EXPECT_TRUE(raw.state_dict.at("w").as_tensor().equal(quantize(small.narrow(0, comm.rank() * 2, 2))));

    // Dequantized into a parameter that requires grad, in place.
    LoadOptions load_options;
    load_options.commit_tensor = [](const ShardedTensor& request, const at::Tensor& stored, at::Tensor& destination) {
      EXPECT_EQ(request.dtype, at::kFloat);
      if (request.key == "w") {
        EXPECT_EQ(stored.scalar_type(), at::kChar);
        destination.copy_(stored.to(at::kFloat).mul(kScale));
      } else {
        EXPECT_EQ(stored.scalar_type(), at::kBFloat16);
        destination.copy_(stored);
      }
    };
    StateDict request = request_of(comm.rank(), at::kFloat);
    at::Tensor param = request["w"].as_sharded_tensor().data.requires_grad_();
    request["b"] = Value(ShardedTensor::from_rank_offsets("b", at::zeros({4}), {}, {comm.rank()}));
    const LoadResult loaded = load(request, tmp.path() + "/ckpt", comm, load_options);
    EXPECT_TRUE(loaded.state_dict.at("w").as_tensor().is_same(param));
    EXPECT_TRUE(param.allclose(small.narrow(0, comm.rank() * 2, 2), 0, kScale / 2));
    // b is stored as bf16: also handed to the hook (its dtype differs), here a plain cast.
    EXPECT_TRUE(loaded.state_dict.at("b").as_tensor().equal(global_tensor("b", {4}).to(at::kBFloat16).to(at::kFloat)));
  });
  // Only the rank that writes a shard transforms it: 4 shards of w, one of b.
  EXPECT_EQ(resolved.load(), kRanks + 1);
  const StateDict meta = load_tensors_metadata(tmp.path() + "/ckpt");
  EXPECT_EQ(meta.at("w").as_sharded_tensor().dtype, at::kChar);
  EXPECT_EQ(meta.at("b").as_sharded_tensor().dtype, at::kBFloat16);
}

TEST(PlannerHooks, ACastNeedsNoResolveDataAndConvertDtypeLoadsIt) {
  TempDir tmp("hooks-cast");
  run_ranks(kRanks, [&](Communicator& comm) {
    SaveOptions options;
    options.transform.stored_dtype = [](const ShardedTensor&) { return at::kBFloat16; };
    save(state_of(comm.rank()), tmp.path() + "/ckpt", comm, options);
    LoadOptions convert;
    convert.convert_dtype = true;
    const LoadResult loaded = load(request_of(comm.rank(), at::kFloat), tmp.path() + "/ckpt", comm, convert);
    EXPECT_TRUE(loaded.state_dict.at("w").as_tensor().equal(
        global_tensor("w", kShape).narrow(0, comm.rank() * 2, 2).to(at::kBFloat16).to(at::kFloat)));
  });
}

TEST(PlannerHooks, TransformsThatBreakThePlanAreRefusedNamingTheTensor) {
  TempDir tmp("hooks-transform-bad");
  run_ranks(kRanks, [&](Communicator& comm) {
    SaveOptions unstorable;
    unstorable.transform.stored_dtype = [](const ShardedTensor&) { return at::kQInt8; };
    EXPECT_TRUE(
        throws_with<UsageError>([&] { save(state_of(comm.rank()), tmp.path() + "/a", comm, unstorable); },
                                "SaveOptions::transform.stored_dtype gave QInt8 for 'b', which a checkpoint cannot "
                                "store"));

    SaveOptions disagreeing;
    disagreeing.transform.stored_dtype = [&](const ShardedTensor&) {
      return comm.rank() == 1 ? at::kHalf : at::kFloat;
    };
    const auto disagree = [&] { save(state_of(comm.rank()), tmp.path() + "/b", comm, disagreeing); };
    // The ranks that plan 'b' and 'w' find the disagreement; every rank
    // raises it, naming both.
    EXPECT_TRUE(throws_with<ShardingError>(disagree, "'b' has dtype float32 on rank 0 but float16 on rank 1"));
    EXPECT_TRUE(throws_with<ShardingError>(disagree, "'w' has dtype float32 on rank 0 but float16 on rank 1"));

    SaveOptions wrong;
    wrong.transform.stored_dtype = [](const ShardedTensor& t) { return t.key == "w" ? at::kChar : t.dtype; };
    wrong.transform.resolve_data = [](const ShardedTensor&, const at::Tensor& data) { return data; };
    const auto write = [&] { save(state_of(comm.rank()), tmp.path() + "/c", comm, wrong); };
    EXPECT_TRUE(throws_with<ShardingError>(write,
                                           "SaveOptions::transform.resolve_data gave 8 elements of Float, expected 8 "
                                           "elements of int8 (the stored dtype planned for it)"));
  });
  for (const char* dir : {"/a", "/b", "/c"}) EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + dir)) << dir;
}

TEST(PlannerHooks, ALoadHookMustFillTheGivenDestination) {
  TempDir tmp("hooks-commit-bad");
  run_ranks(kRanks, [&](Communicator& comm) {
    save(state_of(comm.rank(), at::kBFloat16), tmp.path() + "/ckpt", comm);
    LoadOptions options;
    options.commit_tensor = [](const ShardedTensor&, const at::Tensor& stored, at::Tensor& destination) {
      destination = stored.to(at::kFloat);  // a new tensor, not the caller's
    };
    EXPECT_TRUE(throws_with<UsageError>(
        [&] { load(request_of(comm.rank(), at::kFloat), tmp.path() + "/ckpt", comm, options); },
        "LoadOptions::commit_tensor replaced the destination of 'w'; fill the given tensor in place ([2, 4] of "
        "float32)"));
  });
}

TEST(PlannerHooks, DryRunGivesTheIndexTheSaveWritesWithoutTouchingStorage) {
  TempDir tmp("hooks-dry-run");
  std::vector<StorageIndex> planned(kRanks);
  run_ranks(kRanks, [&](Communicator& comm) {
    SaveOptions options;
    options.transform.stored_dtype = [](const ShardedTensor& t) { return t.key == "b" ? at::kHalf : t.dtype; };
    planned[static_cast<size_t>(comm.rank())] = dry_run_save(state_of(comm.rank()), comm, options);
    EXPECT_FALSE(io::exists(tmp.path() + "/ckpt"));
    save(state_of(comm.rank()), tmp.path() + "/ckpt", comm, options);
  });
  const std::unique_ptr<StorageReader> storage = open_storage(tmp.path() + "/ckpt");
  const StorageIndex& saved = storage->index();
  for (const StorageIndex& index : planned) {
    ASSERT_EQ(index.tensors.size(), saved.tensors.size());
    for (size_t i = 0; i < saved.tensors.size(); ++i) {
      const TensorRecord& p = index.tensors[i];
      const TensorRecord& s = saved.tensors[i];
      EXPECT_EQ(p.key, s.key);
      EXPECT_EQ(p.dtype, s.dtype);
      EXPECT_EQ(p.global_shape, s.global_shape);
      ASSERT_EQ(p.chunks.size(), s.chunks.size());
      for (size_t c = 0; c < s.chunks.size(); ++c) {
        EXPECT_EQ(p.chunks[c].box, s.chunks[c].box);
        EXPECT_EQ(p.chunks[c].byte_length, s.chunks[c].byte_length);
        EXPECT_EQ(index.files[p.chunks[c].file].path, saved.files[s.chunks[c].file].path);
        EXPECT_EQ(index.files[p.chunks[c].file].writer_rank, saved.files[s.chunks[c].file].writer_rank);
      }
    }
    EXPECT_EQ(index.tensors[0].key, "b");
    EXPECT_EQ(index.tensors[0].dtype, at::kHalf);
    EXPECT_EQ(index.tensors[1].chunks.size(), size_t{kRanks});
  }

  // A sharding a save would refuse, the dry run refuses the same way.
  run_ranks(kRanks, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({2, 4}), {{0, comm.rank() % 2, kRanks}}));
    const auto dry = [&] { dry_run_save(sd, comm); };
    EXPECT_TRUE(throws_with<ShardingError>(
        dry,
        "invalid sharding of 'w' (global shape [8, 4]): main replicas overlap: rank 0 holds offset [0, 0] "
        "length [2, 4] and rank 2 holds offset [0, 0] length [2, 4]"));
  });
}

}  // namespace
}  // namespace distckpt
