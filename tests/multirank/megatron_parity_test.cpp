// Megatron-Core dist_checkpointing parity, item by item (issue 21): each
// test names the Megatron behaviour it pins down.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "multirank/checkpoint_fixtures.h"
#include "plan/partitioned_plan.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

// What a refused collective save throws: the reason on the coordinator, a
// CommError carrying it everywhere else.
void expect_save_refused(const std::function<StateDict(int rank)>& state, const std::string& message) {
  TempDir tmp("parity-objects");
  run_ranks(4, [&](Communicator& comm) {
    const auto save_it = [&] { save(state(comm.rank()), tmp.path() + "/ckpt", comm); };
    // Every rank raises the class the failing rank saw.
    EXPECT_TRUE(throws_with<ShardingError>(save_it, message));
  });
  EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/ckpt"));
}

ShardedObject shard(const std::string& key, Shape grid, Shape offset, ReplicaId replica = {0}) {
  return ShardedObject{key, "bytes of " + key, std::move(grid), std::move(offset), std::move(replica)};
}

// Megatron's _validate_objects_for_key: every shard of the grid saved, by exactly one main replica.
TEST(MegatronParity, AnObjectShardNoRankSavesIsRefusedNamingTheShard) {
  expect_save_refused(
      [](int rank) {
        StateDict sd = Value::dict();
        if (rank != 2) sd["rng"] = shard("rng", {2, 2}, {rank / 2, rank % 2});  // (1, 0) missing
        return sd;
      },
      "sharded object 'rng' is missing shard [1, 0] of its grid [2, 2]: no rank saves it (3 of the grid's shards are "
      "present)");
}

TEST(MegatronParity, AnObjectWithTwoShardGridsIsRefused) {
  expect_save_refused(
      [](int rank) {
        StateDict sd = Value::dict();
        sd["rng"] = rank == 3 ? shard("rng", {8}, {3}) : shard("rng", {4}, {rank});
        return sd;
      },
      "sharded object 'rng' has the shard grid [4] on rank 0 but [8] on rank 3");
}

TEST(MegatronParity, AnObjectShardSavedAsMainTwiceOrNeverIsRefused) {
  expect_save_refused(
      [](int rank) {
        StateDict sd = Value::dict();
        sd["rng"] = shard("rng", {2}, {rank % 2});  // ranks 0 and 2 both main for shard 0
        return sd;
      },
      "sharded object 'rng/shard_0_2' has a main replica on rank 0 and on rank 2");
  expect_save_refused(
      [](int rank) {
        StateDict sd = Value::dict();
        sd["rng"] = shard("rng", {4}, {rank}, {rank == 1 ? 1 : 0});
        return sd;
      },
      "sharded object 'rng/shard_1_4' has no main replica (held by rank 1 with replica id (1))");
}

TEST(MegatronParity, ObjectGridsThatAreCompleteSaveAndLoadEveryShard) {
  TempDir tmp("parity-objects-ok");
  run_ranks(4, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["rng"] = shard("rng", {2, 2}, {comm.rank() / 2, comm.rank() % 2});
    sd["once"] = shard("once", {}, {}, {comm.rank()});  // one shard, replicated
    save(sd, tmp.path() + "/ckpt", comm);
  });
  EXPECT_TRUE(verify_checkpoint(tmp.path() + "/ckpt").intact());
}

// Megatron's load_tensors_metadata: whole tensors, offset 0, one fragment
// per axis, replica 0, whatever the save's layout (flat ZeRO slices too),
// and they load back whole on any number of ranks.
TEST(MegatronParity, TensorsMetadataDescribesWholeTensorsThatLoadOnAnyRankCount) {
  TempDir tmp("parity-metadata");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor rows = testing::global_tensor("rows", {8, 6});
  const at::Tensor flat = testing::global_tensor("flat", {4, 5}, at::kBFloat16);
  const at::Tensor norm = testing::global_tensor("norm", {6});
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["rows"] = ShardedTensor::from_rank_offsets("rows", rows.chunk(4, 0)[r].contiguous(), {{0, r, 4}});
    // rows [2 * (r / 2), +2) of the 4x5 tensor, each half of it on one of two ranks
    const at::Tensor half = flat.chunk(2, 0)[r / 2].contiguous().flatten();
    const FlatRange range{(r % 2) * 5, (r % 2) * 5 + 5};
    sd["flat"] = ShardedTensor::from_rank_offsets_flat("flat", half.slice(0, range.start, range.stop).clone(), {2, 5},
                                                       {{0, r / 2, 2}}, range);
    sd["norm"] = ShardedTensor::from_rank_offsets("norm", norm, {}, ReplicaId{r});
    save(sd, dir, comm);
  });

  const StateDict meta = load_tensors_metadata(dir);
  ASSERT_EQ(meta.as_dict().size(), 3u);
  const std::map<std::string, std::pair<Shape, at::ScalarType>> want{
      {"rows", {{8, 6}, at::kFloat}}, {"flat", {{4, 5}, at::kBFloat16}}, {"norm", {{6}, at::kFloat}}};
  for (const auto& [key, shape_dtype] : want) {
    const ShardedTensor& t = meta.at(key).as_sharded_tensor();
    EXPECT_EQ(t.key, key);
    EXPECT_EQ(t.dtype, shape_dtype.second) << key;
    EXPECT_EQ(t.global_shape, shape_dtype.first) << key;
    EXPECT_EQ(t.local_shape, shape_dtype.first) << key;
    EXPECT_EQ(t.global_offset, Shape(shape_dtype.first.size(), 0)) << key;
    EXPECT_EQ(t.axis_fragmentations, Shape(shape_dtype.first.size(), 1)) << key;
    EXPECT_EQ(t.replica_id, ReplicaId{0}) << key;
    EXPECT_EQ(t.prepend_axis_num, 0) << key;
    EXPECT_FALSE(t.flattened_range.has_value()) << key;
    EXPECT_FALSE(t.data.defined()) << key;
  }
  for (const int ranks : {1, 3}) {
    run_ranks(ranks, [&](Communicator& comm) {
      const LoadResult loaded = load(load_tensors_metadata(dir), dir, comm);
      EXPECT_TRUE(at::equal(loaded.state_dict.at("rows").as_tensor(), rows));
      EXPECT_TRUE(at::equal(loaded.state_dict.at("flat").as_tensor(), flat));
      EXPECT_TRUE(at::equal(loaded.state_dict.at("norm").as_tensor(), norm));
    });
  }
}

// Loading without a model (item 10): a key or prefix selection, one tensor,
// and every stored object listed and loaded.
TEST(MegatronParity, PlainTensorsBySelectionAndEveryStoredObject) {
  TempDir tmp("parity-plain");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor a = testing::global_tensor("layers.0.w", {4, 6});
  const at::Tensor b = testing::global_tensor("layers.1.w", {4, 6});
  const at::Tensor emb = testing::global_tensor("embedding", {8, 2});
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["a"] = ShardedTensor::from_rank_offsets("layers.0.w", a.chunk(2, 0)[r].contiguous(), {{0, r, 2}});
    sd["b"] = ShardedTensor::from_rank_offsets("layers.1.w", b.chunk(2, 1)[r].contiguous(), {{1, r, 2}});
    sd["emb"] = ShardedTensor::from_rank_offsets("embedding", emb, {}, ReplicaId{r});
    sd["rng"] = shard("rng", {2}, {r});
    sd["once"] = shard("once", {}, {}, {r});
    save(sd, dir, comm);
  });

  const StateDict layers = load_plain_tensors(dir, TensorSelection{{}, {"layers."}});
  ASSERT_EQ(layers.as_dict().size(), 2u);
  EXPECT_TRUE(at::equal(layers.at("layers.0.w").as_tensor(), a));
  EXPECT_TRUE(at::equal(layers.at("layers.1.w").as_tensor(), b));
  const StateDict picked = load_plain_tensors(dir, TensorSelection{{"embedding"}, {"layers.1"}});
  ASSERT_EQ(picked.as_dict().size(), 2u);
  EXPECT_TRUE(at::equal(picked.at("embedding").as_tensor(), emb));
  EXPECT_TRUE(at::equal(load_plain_tensor(dir, "layers.1.w"), b));
  EXPECT_TRUE(throws_with<CheckpointError>([&] { load_plain_tensor(dir, "layers.2.w"); },
                                           "holds no tensor 'layers.2.w'; `distckpt inspect"));
  EXPECT_TRUE(throws_with<CheckpointError>(
      [&] {
        load_plain_tensors(dir, TensorSelection{{}, {"decoder."}});
      },
      "no tensor key of '" + dir + "' starts with 'decoder.'"));

  const StateDict listed = load_sharded_objects_metadata(dir);
  std::vector<std::string> names;
  for (const auto& [name, value] : listed.as_dict()) {
    names.push_back(name);
    EXPECT_TRUE(value.as_sharded_object().data.empty()) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"once/shard__", "rng/shard_0_2", "rng/shard_1_2"}));
  const StateDict objects = load_all_sharded_objects(dir);
  EXPECT_EQ(objects.at("rng/shard_1_2").as_sharded_object().data, "bytes of rng");
  EXPECT_EQ(objects.at("rng/shard_1_2").as_sharded_object().global_offset, (Shape{1}));
  EXPECT_EQ(objects.at("once/shard__").as_sharded_object().data, "bytes of once");
}

// A request without data is allocated where its ShardedTensor::device says
// (the meta device stands in for an accelerator on this CPU build).
TEST(MegatronParity, RequestsWithoutDataLoadOnTheirDevice) {
  TempDir tmp("parity-device");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor w = testing::global_tensor("w", {4, 2});
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd;
    sd["w"] = ShardedTensor::from_rank_offsets("w", w.chunk(2, 0)[comm.rank()].contiguous(), {{0, comm.rank(), 2}});
    save(sd, dir, comm);
    StateDict request;
    ShardedTensor on_meta = sd.at("w").as_sharded_tensor().without_data();
    on_meta.device = at::kMeta;
    request["w"] = on_meta;
    request["cpu"] = sd.at("w").as_sharded_tensor().without_data();
    request["cpu"].as_sharded_tensor().key = "w";
    const LoadResult loaded = load(request, dir, comm);
    EXPECT_EQ(loaded.state_dict.at("w").as_tensor().device().type(), at::kMeta);
    EXPECT_EQ(loaded.state_dict.at("w").as_tensor().sizes(), (at::IntArrayRef{2, 2}));
    EXPECT_TRUE(at::equal(loaded.state_dict.at("cpu").as_tensor(), w.chunk(2, 0)[comm.rank()]));
  });
}

// Megatron's content_metadata: a small dict saved with the checkpoint and
// read back alone.
TEST(MegatronParity, ContentMetadataIsSavedAndReadAlone) {
  TempDir tmp("parity-content");
  StateDict content;
  content["distrib_optim_sharding_type"] = "fully_sharded_model_space";
  content["format"]["version"] = 2;
  content["format"]["chained"] = true;
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd;
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::ones({2}), {{0, comm.rank(), 2}});
    sd["iteration"] = 7;
    SaveOptions options;
    options.content_metadata = content;
    save(sd, tmp.path() + "/with", comm, options);
    save(sd, tmp.path() + "/without", comm);

    options.content_metadata = Value(3);
    EXPECT_TRUE(throws_with<UsageError>([&] { save(sd, tmp.path() + "/scalar", comm, options); },
                                        "SaveOptions::content_metadata must be a dict, not a int"));
    options.content_metadata = content;
    options.format = StorageFormat::safetensors();
    EXPECT_TRUE(throws_with<UsageError>([&] { save(sd, tmp.path() + "/st", comm, options); },
                                        "a safetensors save has no place for it"));
  });
  const std::optional<StateDict> read = load_content_metadata(tmp.path() + "/with");
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->equals(content));
  // Not part of the common state a load returns.
  const StateDict common = load_common_state_dict(tmp.path() + "/with");
  EXPECT_EQ(common.as_dict().size(), 1u);
  EXPECT_EQ(common.at("iteration").as_int(), 7);
  EXPECT_FALSE(load_content_metadata(tmp.path() + "/without").has_value());
  EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/scalar"));
  EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/st"));
  // Checkpoints written before content metadata existed have none.
  EXPECT_FALSE(load_content_metadata(DISTCKPT_SOURCE_DIR "/tests/data/format_v1").has_value());
}

// Megatron saves rank 0's common state and warns on the others; distckpt
// names the key paths that differ, and can refuse the save instead.
TEST(MegatronParity, CommonStateThatDiffersAcrossRanksIsReported) {
  TempDir tmp("parity-common");
  // `like`: whose common values this rank holds.
  const auto state = [](int rank, int like) {
    StateDict sd;
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::ones({2}), {{0, rank, 3}});
    rank = like;
    sd["iteration"] = rank == 1 ? 8 : 7;
    sd["args"]["lr"] = at::full({1}, rank == 2 ? 0.5 : 0.1);
    sd["args"]["name"] = "gpt";
    if (rank == 2) sd["only_on_2"] = true;
    return sd;
  };
  testing::LogCapture log;
  run_ranks(3, [&](Communicator& comm) { save(state(comm.rank(), comm.rank()), tmp.path() + "/warned", comm); });
  const std::string logged = log.joined();
  EXPECT_NE(logged.find("the common (non-sharded) state of rank 1 differs from rank 0's at 'iteration'; only rank "
                        "0's is saved"),
            std::string::npos)
      << logged;
  EXPECT_NE(logged.find("state of rank 2 differs from rank 0's at 'args/lr', 'only_on_2'; only"), std::string::npos)
      << logged;
  EXPECT_EQ(logged.find("of rank 0 differs"), std::string::npos) << logged;
  const StateDict saved = load_common_state_dict(tmp.path() + "/warned");
  EXPECT_EQ(saved.at("iteration").as_int(), 7);
  EXPECT_FALSE(saved.contains("only_on_2"));

  // Equal common state: no warning (and no extra collective step).
  testing::LogCapture quiet;
  run_ranks(3, [&](Communicator& comm) { save(state(comm.rank(), 0), tmp.path() + "/equal", comm); });
  EXPECT_EQ(quiet.joined().find("differs"), std::string::npos);

  run_ranks(3, [&](Communicator& comm) {
    SaveOptions options;
    options.common_state_check = CommonStateCheck::kError;
    const auto save_it = [&] { save(state(comm.rank(), comm.rank()), tmp.path() + "/refused", comm, options); };
    // Every rank raises the class the failing ranks saw, rank 0 included.
    EXPECT_TRUE(throws_with<CheckpointError>(save_it, "SaveOptions::common_state_check is kError"));
  });
  EXPECT_FALSE(is_distributed_checkpoint(tmp.path() + "/refused"));
}

// Megatron's validate_access_integrity: on by default for saves (with an
// opt-out), on request for loads and for TensorAwareStateDict::to_state_dict.
TEST(MegatronParity, AccessIntegrityOnSaveLoadAndToStateDict) {
  TempDir tmp("parity-access");
  const at::Tensor w = testing::global_tensor("w", {4, 2});
  run_ranks(2, [&](Communicator& comm) {
    // Both ranks hold all of w as its main replica.
    StateDict doubled;
    doubled["w"] = ShardedTensor::from_rank_offsets("w", w, {});
    const auto save_doubled = [&](const SaveOptions& options) {
      save(doubled, tmp.path() + "/doubled", comm, options);
    };
    // The rank that plans "w" finds it; every rank raises it.
    EXPECT_TRUE(throws_with<ShardingError>([&] { save_doubled({}); }, "main replicas overlap"));
    SaveOptions unchecked;
    unchecked.validate_access_integrity = false;
    save_doubled(unchecked);  // written once (same box), loadable
    EXPECT_TRUE(at::equal(load(doubled, tmp.path() + "/doubled", comm).state_dict.at("w").as_tensor(), w));

    // Loads: the same overlapping request passes unless asked to validate.
    LoadOptions validating;
    validating.validate_access_integrity = true;
    const auto load_doubled = [&] { load(doubled, tmp.path() + "/doubled", comm, validating); };
    // Every rank raises the class the failing rank saw.
    EXPECT_TRUE(throws_with<ShardingError>(load_doubled, "main replicas overlap"));
    StateDict replicated;
    replicated["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({4, 2}), {}, {comm.rank()});
    EXPECT_TRUE(
        at::equal(load(replicated, tmp.path() + "/doubled", comm, validating).state_dict.at("w").as_tensor(), w));
    StateDict half;  // only rank 0 asks (rank 1's request is empty), rows 0..1: rows 2..3 are not covered
    if (comm.rank() == 0) half["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({2, 2}), {{0, 0, 2}});
    const auto load_half = [&] { load(half, tmp.path() + "/doubled", comm, validating); };
    // Every rank raises the class the failing rank saw.
    EXPECT_TRUE(throws_with<ShardingError>(load_half, "'w'"));

    const TensorAwareStateDict tasd = TensorAwareStateDict::from_state_dict(replicated, comm);
    ToStateDictOptions to_options;
    to_options.validate_access_integrity = true;
    StateDict again;
    again["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({4, 2}), {}, {comm.rank()});
    EXPECT_NO_THROW(tasd.to_state_dict(again, comm, to_options));
    again["w"].as_sharded_tensor().replica_id = {0};
    // Every rank raises the class the failing rank saw.
    EXPECT_TRUE(throws_with<ShardingError>([&] { tasd.to_state_dict(again, comm, to_options); }, "overlap"));
  });
}

}  // namespace
}  // namespace distckpt
