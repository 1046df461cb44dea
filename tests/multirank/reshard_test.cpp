// Save under one layout, load under another: prepended (stacked) axes,
// uneven and empty shards, flat (ZeRO) ranges, padded tensors, factories.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;
constexpr int64_t kLayers = 8, kRows = 16, kCols = 12, kVocab = 32;

// Stacked layers over pp (prepended axis 0), rows over tp; the embedding is
// split over tp and replicated over pp.
StateDict stacked_model(int64_t tp, int64_t pp, int rank, bool with_data) {
  const int64_t tp_rank = rank % tp, pp_rank = rank / tp;
  const at::Tensor w = global_tensor("layers.w", {kLayers, kRows, kCols});
  const at::Tensor emb = global_tensor("emb", {kVocab, kCols});
  StateDict sd = Value::dict();
  const int64_t per_stage = kLayers / pp, rows = kRows / tp;
  for (int64_t i = 0; i < per_stage; ++i) {
    const int64_t layer = pp_rank * per_stage + i;
    at::Tensor local = w[layer].narrow(0, tp_rank * rows, rows).clone();
    if (!with_data) local = at::full_like(local, -1);
    sd["layers"][std::to_string(i)] =
        ShardedTensor::from_rank_offsets("layers.w", local, {{0, layer, kLayers}, {1, tp_rank, tp}}, {0}, 1);
  }
  const int64_t vrows = kVocab / tp;
  at::Tensor local_emb = with_data ? emb.narrow(0, tp_rank * vrows, vrows).clone() : at::zeros({vrows, kCols});
  sd["emb"] = ShardedTensor::from_rank_offsets("emb", local_emb, {{0, tp_rank, tp}}, {pp_rank});
  sd["iteration"] = 7;
  return sd;
}

TEST(Reshard, Tp2Pp4ToTp1Pp2WithPrependedAxis) {
  TempDir tmp("reshard");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(8, [&](Communicator& comm) { save(stacked_model(2, 4, comm.rank(), true), dir, comm); });
  ASSERT_TRUE(is_distributed_checkpoint(dir));
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = stacked_model(1, 2, comm.rank(), false);
    LoadResult result = load(request, dir, comm);
    const StateDict expected = stacked_model(1, 2, comm.rank(), true);
    for (int i = 0; i < 4; ++i) {
      const std::string k = std::to_string(i);
      EXPECT_TRUE(at::equal(result.state_dict.at("layers").at(k).as_tensor(),
                            expected.at("layers").at(k).as_sharded_tensor().data))
          << "rank " << comm.rank() << " layer " << i;
      // Filled in place: the request's own tensor holds the values.
      EXPECT_TRUE(at::equal(request.at("layers").at(k).as_sharded_tensor().data,
                            expected.at("layers").at(k).as_sharded_tensor().data));
    }
    EXPECT_TRUE(at::equal(result.state_dict.at("emb").as_tensor(), expected.at("emb").as_sharded_tensor().data));
    EXPECT_EQ(result.state_dict.at("iteration").as_int(), 7);
  });
  // Only main replicas were written: the embedding once, not once per pp stage.
  const StateDict meta = load_tensors_metadata(dir);
  EXPECT_EQ(meta.at("layers.w").as_sharded_tensor().global_shape, (Shape{kLayers, kRows, kCols}));
  const StateDict plain = load_plain_tensors(dir);
  EXPECT_TRUE(at::equal(plain.at("emb").as_tensor(), global_tensor("emb", {kVocab, kCols})));
  EXPECT_TRUE(at::equal(plain.at("layers.w").as_tensor(), global_tensor("layers.w", {kLayers, kRows, kCols})));
}

// Uneven 1-D pieces: rank r holds the pieces listed for it (several, or none).
StateDict uneven_model(const std::vector<std::vector<std::pair<int64_t, int64_t>>>& pieces, int rank) {
  const at::Tensor g = global_tensor("vec", {20});
  StateDict sd = Value::dict();
  List shards;
  for (const auto& [start, size] : pieces[rank]) {
    shards.push_back(ShardedTensor::from_global_offset("vec", g.narrow(0, start, size).clone(), {20}, {start}));
  }
  sd["vec"] = Value(std::move(shards));
  return sd;
}

TEST(Reshard, UnevenSplitsWithEmptyAndMultipleShardsPerRank) {
  TempDir tmp("uneven");
  const std::string dir = tmp.path() + "/ckpt";
  // rank 0: [0,3) and [15,20); rank 1: nothing but an empty shard; rank 2: [3,15).
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> saved{{{0, 3}, {15, 5}}, {{7, 0}}, {{3, 12}}};
  run_ranks(3, [&](Communicator& comm) { save(uneven_model(saved, comm.rank()), dir, comm); });
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> wanted{{{0, 11}}, {{11, 0}, {11, 9}}};
  run_ranks(2, [&](Communicator& comm) {
    StateDict request = uneven_model(wanted, comm.rank());
    StateDict expected = uneven_model(wanted, comm.rank());
    map_inplace(request, [](Value& v) { v = Value(v.as_sharded_tensor().without_data()); });
    const StateDict got = load(request, dir, comm).state_dict;
    const List& shards = got.at("vec").as_list();
    ASSERT_EQ(shards.size(), wanted[comm.rank()].size());
    for (size_t i = 0; i < shards.size(); ++i) {
      EXPECT_TRUE(at::equal(shards[i].as_tensor(), expected.at("vec")[i].as_sharded_tensor().data));
    }
  });
}

// A [8, 6] tensor split over tp on rows; each tp chunk further split into
// flat (ZeRO) ranges over dp at the given cut points.
StateDict flat_model(int64_t tp, const std::vector<int64_t>& cuts, int rank) {
  const int64_t dp = static_cast<int64_t>(cuts.size()) - 1;
  const int64_t tp_rank = rank / dp, dp_rank = rank % dp;
  const int64_t rows = 8 / tp;
  const at::Tensor chunk = global_tensor("opt.exp_avg", {8, 6}).narrow(0, tp_rank * rows, rows).flatten();
  const FlatRange range{cuts[dp_rank], cuts[dp_rank + 1]};
  StateDict sd = Value::dict();
  sd["exp_avg"] = ShardedTensor::from_rank_offsets_flat("opt.exp_avg", chunk.slice(0, range.start, range.stop).clone(),
                                                        {rows, 6}, {{0, tp_rank, tp}}, range);
  return sd;
}

TEST(Reshard, FlattenedRangesAcrossLayouts) {
  TempDir tmp("flat");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(4, [&](Communicator& comm) { save(flat_model(2, {0, 10, 24}, comm.rank()), dir, comm); });
  // Load as tp=1 with three uneven flat ranges of the whole 48 elements.
  run_ranks(3, [&](Communicator& comm) {
    StateDict request = flat_model(1, {0, 5, 30, 48}, comm.rank());
    const at::Tensor expected = request.at("exp_avg").as_sharded_tensor().data.clone();
    request.at("exp_avg").as_sharded_tensor().data.fill_(0);
    const StateDict got = load(request, dir, comm).state_dict;
    EXPECT_TRUE(at::equal(got.at("exp_avg").as_tensor(), expected)) << "rank " << comm.rank();
  });
}

TEST(Reshard, AllowShapeMismatchPadsWithZerosAndTruncates) {
  TempDir tmp("padded");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor g = global_tensor("vocab", {10, 4});
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("vocab", g.narrow(0, comm.rank() * 5, 5).clone(), {{0, comm.rank(), 2}});
    save(sd, dir, comm);
  });
  run_ranks(2, [&](Communicator& comm) {
    // Padded to 12 rows: rank 1 gets stored rows 6..9 then two zero rows.
    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("vocab", at::full({6, 4}, 5.0), {{0, comm.rank(), 2}}, {0}, 0,
                                                    /*allow_shape_mismatch=*/true);
    const at::Tensor got = load(request, dir, comm).state_dict.at("w").as_tensor();
    at::Tensor expected = at::zeros({6, 4});
    const int64_t stored_rows = comm.rank() == 0 ? 6 : 4;
    expected.narrow(0, 0, stored_rows).copy_(g.narrow(0, comm.rank() * 6, stored_rows));
    EXPECT_TRUE(at::equal(got, expected)) << "rank " << comm.rank();

    // Truncated to 8 rows.
    StateDict smaller = Value::dict();
    smaller["w"] = ShardedTensor::from_rank_offsets("vocab", at::zeros({4, 4}), {{0, comm.rank(), 2}}, {0}, 0, true);
    EXPECT_TRUE(at::equal(load(smaller, dir, comm).state_dict.at("w").as_tensor(), g.narrow(0, comm.rank() * 4, 4)));

    // Without allow_shape_mismatch the mismatch is an error naming the fix.
    StateDict strict = Value::dict();
    strict["w"] = ShardedTensor::from_rank_offsets("vocab", at::zeros({6, 4}), {{0, comm.rank(), 2}});
    try {
      load(strict, dir, comm);
      ADD_FAILURE() << "expected a ShardingError";
    } catch (const ShardingError& e) {
      EXPECT_NE(std::string(e.what()).find("allow_shape_mismatch"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[10, 4]"), std::string::npos) << e.what();
    }
  });
}

// Distributed-optimizer state of a padded vocabulary: flat ranges of the
// whole [vocab, h] chunk, saved at 10 rows and loaded at 12 (Megatron's
// fully_sharded_model_space format before 5ab481c combined the two).
TEST(Reshard, FlatRangesOfAPaddedTensorPadAndTruncate) {
  TempDir tmp("padded-flat");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor g = global_tensor("vocab", {10, 4});
  run_ranks(2, [&](Communicator& comm) {
    const FlatRange range{comm.rank() * 20, comm.rank() * 20 + 20};
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets_flat("vocab", g.reshape(-1).slice(0, range.start, range.stop).clone(),
                                                    {10, 4}, {}, range, {0});
    sd["w"].as_sharded_tensor().allow_shape_mismatch = true;
    save(sd, dir, comm);
  });
  run_ranks(2, [&](Communicator& comm) {
    const auto request = [&](int64_t rows) {
      const int64_t half = rows * 4 / 2;
      const FlatRange range{comm.rank() * half, comm.rank() * half + half};
      StateDict sd = Value::dict();
      sd["w"] = ShardedTensor::from_rank_offsets_flat("vocab", at::full({half}, 5.0), {rows, 4}, {}, range, {0});
      sd["w"].as_sharded_tensor().allow_shape_mismatch = true;
      return load(sd, dir, comm).state_dict.at("w").as_tensor();
    };
    // 12 rows: rank 1 holds rows 6..11, of which 10 and 11 are padding.
    at::Tensor padded = at::zeros({12, 4});
    padded.narrow(0, 0, 10).copy_(g);
    EXPECT_TRUE(at::equal(request(12), padded.reshape(-1).narrow(0, comm.rank() * 24, 24))) << "rank " << comm.rank();
    // 8 rows: truncated.
    EXPECT_TRUE(at::equal(request(8), g.narrow(0, 0, 8).reshape(-1).narrow(0, comm.rank() * 16, 16)));
  });
}

// SwiGLU-style fused [W; V] rows: stored as two tensors so each half
// reshards on its own; merge concatenates them back.
Value fused_factory(int64_t tp, int64_t tp_rank, const at::Tensor& local) {
  ShardedTensorFactory f;
  f.key = "fc1";
  f.data = local;
  f.build = [tp, tp_rank](const std::string& key, const at::Tensor& data, const ReplicaId& replica,
                          const std::optional<FlatRange>&) {
    const ShardedTensor whole = ShardedTensor::from_rank_offsets(key, data, {{0, tp_rank, tp}}, replica);
    const int64_t half = data.size(0) / 2;
    Value sub = Value::dict();
    sub["w"] = whole.narrow(0, 0, half).front();
    sub["w"].as_sharded_tensor().key = key + ".w";
    sub["v"] = whole.narrow(0, half, half).front();
    sub["v"].as_sharded_tensor().key = key + ".v";
    return sub;
  };
  f.merge = [](const Value& loaded) { return at::cat({loaded.at("w").as_tensor(), loaded.at("v").as_tensor()}, 0); };
  return Value(std::move(f));
}

TEST(Reshard, FactoryMergeReassemblesFusedTensor) {
  TempDir tmp("factory");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor W = global_tensor("W", {8, 3}), V = global_tensor("V", {8, 3});
  run_ranks(2, [&](Communicator& comm) {
    const int64_t r = comm.rank();
    const at::Tensor local = at::cat({W.narrow(0, r * 4, 4), V.narrow(0, r * 4, 4)}, 0);  // [W_r; V_r]
    StateDict sd = Value::dict();
    sd["mlp"]["fc1"] = fused_factory(2, r, local);
    save(sd, dir, comm);
  });
  const StateDict plain = load_plain_tensors(dir);
  EXPECT_TRUE(at::equal(plain.at("fc1.w").as_tensor(), W));
  EXPECT_TRUE(at::equal(plain.at("fc1.v").as_tensor(), V));
  run_ranks(1, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["mlp"]["fc1"] = fused_factory(1, 0, at::zeros({16, 3}));
    const at::Tensor got = load(request, dir, comm).state_dict.at("mlp").at("fc1").as_tensor();
    EXPECT_TRUE(at::equal(got, at::cat({W, V}, 0)));  // not the interleaved tp=2 layout
  });
}

// A tensor with no elements has nothing to store, yet is listed: loads ask
// for it, metadata and digests show it.
TEST(Reshard, TensorsWithoutElementsAreListedAndLoad) {
  TempDir tmp("reshard-empty");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["empty"] = ShardedTensor::from_rank_offsets("empty", at::empty({0, 4}), {}, ReplicaId{comm.rank()});
    sd["rows"] = ShardedTensor::from_rank_offsets("rows", at::empty({0, 3}), {{0, comm.rank(), 2}});
    save(sd, dir, comm);
  });
  const StateDict meta = load_tensors_metadata(dir);
  EXPECT_EQ(meta.at("empty").as_sharded_tensor().global_shape, (Shape{0, 4}));
  EXPECT_EQ(meta.at("rows").as_sharded_tensor().global_shape, (Shape{0, 3}));
  EXPECT_EQ(digest_checkpoint(dir).size(), 2u);
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["empty"] = ShardedTensor::from_rank_offsets("empty", at::empty({0, 4}), {});
    const LoadResult out = load(sd, dir, comm);
    EXPECT_EQ(out.state_dict.at("empty").as_tensor().sizes(), (at::IntArrayRef{0, 4}));
  });
}

}  // namespace
}  // namespace distckpt
