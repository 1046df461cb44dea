// Tensor-aware state dicts over a real Gloo group: the fully parallel
// algorithm keeps each replicated shard once (cached distribution) and
// to_state_dict brings the others back; strict handling; layout checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "distckpt/comm/process_group.h"
#include "distckpt/core/errors.h"
#include "distckpt/local/tensor_aware_state_dict.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// TP=2 x DP=2 over 4 ranks (rank = dp * 2 + tp): "qkv" rows split over tp and
// replicated over dp; "norm" replicated everywhere; "fc" flattened (ZeRO)
// over dp inside each tp shard; a per-rank object; common values; a
// non-persistent value; a factory that stores a tensor as two halves.
StateDict model(int rank, bool with_data = true) {
  const int tp = rank % 2, dp = rank / 2;
  auto data = [&](at::Tensor t) { return with_data ? t : at::zeros_like(t); };
  StateDict sd = Value::dict();
  sd["qkv"] = ShardedTensor::from_rank_offsets("qkv", data(global_tensor("qkv", {8, 16}).narrow(0, 4 * tp, 4)),
                                               {{0, tp, 2}}, {dp});
  sd["norm"] = ShardedTensor::from_rank_offsets("norm", data(global_tensor("norm", {16})), {}, {rank});
  const at::Tensor fc_rows = global_tensor("fc", {4, 6}).narrow(0, 2 * tp, 2).flatten();
  sd["fc"] = ShardedTensor::from_rank_offsets_flat("fc", data(fc_rows.narrow(0, 6 * dp, 6)), {2, 6}, {{0, tp, 2}},
                                                   FlatRange{6 * dp, 6 * dp + 6});
  sd["rng"] = ShardedObject{"rng", "rng-" + std::to_string(rank), {4}, {rank}};
  sd["iteration"] = 42;
  sd["handle"] = LocalNonPersistentObject(Value(std::string("runtime-only")));
  ShardedTensorFactory f;
  f.key = "emb";
  f.data = data(global_tensor("emb", {4, 4}));
  f.replica_id = ReplicaId{rank};
  f.build = [](const std::string& key, const at::Tensor& t, const ReplicaId& replica, const std::optional<FlatRange>&) {
    Value halves = Value::dict();
    halves["a"] = ShardedTensor::from_global_offset(key + ".a", t.narrow(0, 0, 2), {2, 4}, {0, 0}, replica);
    halves["b"] = ShardedTensor::from_global_offset(key + ".b", t.narrow(0, 2, 2), {2, 4}, {0, 0}, replica);
    return halves;
  };
  f.merge = [](const Value& loaded) { return at::cat({loaded.at("a").as_tensor(), loaded.at("b").as_tensor()}); };
  sd["emb"] = f;
  return sd;
}

void expect_model_values(const LoadResult& r, int rank) {
  const int tp = rank % 2, dp = rank / 2;
  const StateDict& sd = r.state_dict;
  EXPECT_TRUE(at::equal(sd.at("qkv").as_tensor(), global_tensor("qkv", {8, 16}).narrow(0, 4 * tp, 4)));
  EXPECT_TRUE(at::equal(sd.at("norm").as_tensor(), global_tensor("norm", {16})));
  EXPECT_TRUE(at::equal(sd.at("fc").as_tensor(),
                        global_tensor("fc", {4, 6}).narrow(0, 2 * tp, 2).flatten().narrow(0, 6 * dp, 6)));
  EXPECT_EQ(sd.at("rng").as_string(), "rng-" + std::to_string(rank));
  EXPECT_EQ(sd.at("iteration").as_int(), 42);
  EXPECT_EQ(sd.at("handle").as_string(), "runtime-only");
  EXPECT_TRUE(at::equal(sd.at("emb").as_tensor(), global_tensor("emb", {4, 4})));
}

TEST(TensorAware, AtomicKeepsEverythingAndFillsTheRequest) {
  run_ranks(4, [](Communicator& comm) {
    const TensorAwareStateDict tasd =
        TensorAwareStateDict::from_state_dict(model(comm.rank()), comm, TensorAwareAlgo::kAtomic);
    for (const LocalTensorEntry& e : tasd.state().tensors) EXPECT_TRUE(e.held) << e.meta.key;
    const StateDict request = model(comm.rank(), /*with_data=*/false);
    const LoadResult r = tasd.to_state_dict(request, comm);
    expect_model_values(r, comm.rank());
    // Filled in place: the request's own tensor holds the values.
    EXPECT_TRUE(at::equal(request.at("qkv").as_sharded_tensor().data,
                          global_tensor("qkv", {8, 16}).narrow(0, 4 * (comm.rank() % 2), 4)));
  });
}

// The batched rounds are cut alike on every rank: different batches are
// refused on every rank instead of leaving ranks in rounds that never meet.
TEST(TensorAware, RoundsWithDifferentBatchesFailEveryRankAlike) {
  std::vector<std::string> messages(4);
  run_ranks(4, [&](Communicator& comm) {
    TensorAwareStateDict tasd =
        TensorAwareStateDict::from_state_dict(model(comm.rank()), comm, TensorAwareAlgo::kFullyParallel);
    ToStateDictOptions options;
    options.exchange = LoadExchange::kAllGather;
    options.exchange_batch_bytes = comm.rank() == 3 ? 128 : 64;
    try {
      tasd.to_state_dict(model(comm.rank(), false), comm, options);
    } catch (const UsageError& e) {
      messages[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("pass the same value on every rank"), std::string::npos) << m;
  }
}

TEST(TensorAware, FullyParallelKeepsEachReplicatedShardOnceAndExchanges) {
  for (const LoadExchange mode : {LoadExchange::kBroadcast, LoadExchange::kAllGather}) {
    std::vector<std::vector<std::string>> kept_keys(4);
    std::vector<uint64_t> kept_bytes(4);
    run_ranks(4, [&](Communicator& comm) {
      TensorAwareStateDict tasd =
          TensorAwareStateDict::from_state_dict(model(comm.rank()), comm, TensorAwareAlgo::kFullyParallel);
      for (const LocalTensorEntry& e : tasd.state().tensors) {
        if (e.held) kept_keys[static_cast<size_t>(comm.rank())].push_back(e.meta.key);
      }
      kept_bytes[static_cast<size_t>(comm.rank())] = tasd.kept_bytes();
      // Through the hollow form and back, as a local checkpoint does.
      std::vector<at::Tensor> tensors = tasd.pop_tensors();
      TensorAwareStateDict back = TensorAwareStateDict::deserialize_hollow(tasd.serialize_hollow(), "test");
      back.insert_tensors(std::move(tensors));
      ToStateDictOptions options;
      options.exchange = mode;
      options.exchange_batch_bytes = 64;  // several rounds
      expect_model_values(back.to_state_dict(model(comm.rank(), false), comm, options), comm.rank());
    });
    // Each distinct shard is kept by exactly one rank: qkv x2 (tp), norm x1,
    // fc x4 (tp x dp, not replicated), emb.a, emb.b.
    std::map<std::string, int> count;
    for (const auto& keys : kept_keys) {
      for (const std::string& k : keys) ++count[k];
    }
    EXPECT_EQ(count["qkv"], 2) << load_exchange_name(mode);
    EXPECT_EQ(count["norm"], 1);
    EXPECT_EQ(count["fc"], 4);
    EXPECT_EQ(count["emb.a"], 1);
    EXPECT_EQ(count["emb.b"], 1);
    uint64_t total = 0;
    for (uint64_t b : kept_bytes) total += b;
    EXPECT_EQ(total, (8 * 16 + 16 + 4 * 6 + 16) * 4u);  // every byte once
  }
}

TEST(TensorAware, DistributionIsCachedWhileTheStructureHolds) {
  run_ranks(4, [](Communicator& comm) {
    auto cache = ShardDistributionCache::create();
    std::vector<bool> first;
    for (int i = 0; i < 3; ++i) {
      const auto tasd =
          TensorAwareStateDict::from_state_dict(model(comm.rank()), comm, TensorAwareAlgo::kFullyParallel, cache);
      std::vector<bool> held;
      for (const LocalTensorEntry& e : tasd.state().tensors) held.push_back(e.held);
      if (i == 0) first = held;
      EXPECT_EQ(held, first);
    }
    EXPECT_EQ(cache->computed(), 1u);
    EXPECT_EQ(cache->reused(), 2u);
    // A new key on one rank changes the structure: computed again everywhere.
    StateDict changed = model(comm.rank());
    if (comm.rank() == 3) changed["extra"] = ShardedTensor::from_rank_offsets("extra", at::ones({2}), {}, {0});
    if (comm.rank() != 3)
      changed["extra_" + std::to_string(comm.rank())] =
          ShardedTensor::from_rank_offsets("extra_" + std::to_string(comm.rank()), at::ones({2}), {}, {0});
    TensorAwareStateDict::from_state_dict(changed, comm, TensorAwareAlgo::kFullyParallel, cache);
    EXPECT_EQ(cache->computed(), 2u);
  });
}

TEST(TensorAware, StrictHandlingAndLayoutChecks) {
  run_ranks(2, [](Communicator& comm) {
    StateDict saved = Value::dict();
    saved["w"] = ShardedTensor::from_rank_offsets("w", at::ones({2, 3}), {{0, comm.rank(), 2}});
    saved["old"] = ShardedTensor::from_rank_offsets("old", at::ones({3}), {}, {comm.rank()});
    const TensorAwareStateDict tasd = TensorAwareStateDict::from_state_dict(saved, comm);

    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({2, 3}), {{0, comm.rank(), 2}});
    request["new"] = ShardedTensor::from_rank_offsets("new", at::zeros({3}), {}, {comm.rank()});
    ToStateDictOptions options;
    options.strict = StrictHandling::kReturnAll;
    const LoadResult r = tasd.to_state_dict(request, comm, options);
    EXPECT_EQ(r.unexpected_keys, (std::set<std::string>{"new"}));
    EXPECT_EQ(r.missing_keys, (std::set<std::string>{"old"}));
    EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(), at::ones({2, 3})));
    EXPECT_FALSE(r.state_dict.contains("new"));

    options.strict = StrictHandling::kRaiseUnexpected;
    EXPECT_TRUE(
        throws_with<KeyMismatchError>([&] { tasd.to_state_dict(request, comm, options); }, "local checkpoint of rank"));
    // Another layout (w split into 4 instead of 2): a clear error on every rank.
    StateDict other = Value::dict();
    other["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({1, 3}), {{0, comm.rank(), 4}});
    EXPECT_TRUE(throws_with<ShardingError>([&] { tasd.to_state_dict(other, comm); }, "layout they were saved with"));
  });
}

// Megatron's defaults and knobs: fully parallel unless asked otherwise, the
// distribution within a parallelization group (here two data-parallel groups
// {0, 1} and {2, 3}), and the algorithm chosen again at to_state_dict.
TEST(TensorAware, FullyParallelByDefaultWithinAParallelizationGroup) {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  const at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3});
  std::vector<int> held(4, 0);
  run_ranks(4, [&](Communicator& comm) {
    const int rank = comm.rank();
    const auto group = communicator_from_store(
        c10::make_intrusive<c10d::PrefixStore>("dp" + std::to_string(rank / 2), store), rank % 2, 2);
    const auto replicated = [&](bool with_data) {
      StateDict sd;
      sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w.clone() : at::zeros({2, 3}), {}, {rank});
      return sd;
    };
    const TensorAwareStateDict plain = TensorAwareStateDict::from_state_dict(replicated(true), comm);
    EXPECT_EQ(plain.algorithm(), TensorAwareAlgo::kFullyParallel);
    const TensorAwareStateDict grouped = TensorAwareStateDict::from_state_dict(
        replicated(true), comm, TensorAwareAlgo::kFullyParallel, nullptr, group.get());
    held[rank] = grouped.state().tensors[0].held ? 1 : 0;
    comm.barrier();
    EXPECT_EQ(held[0] + held[1], 1);  // one copy per group
    EXPECT_EQ(held[2] + held[3], 1);

    ToStateDictOptions options;
    options.parallelization_group = group.get();
    const LoadResult r = grouped.to_state_dict(replicated(false), comm, options);
    EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(), w));

    // Atomic at to_state_dict: only what this rank kept.
    options.algo = TensorAwareAlgo::kAtomic;
    const auto atomic_load = [&] { grouped.to_state_dict(replicated(false), comm, options); };
    // Every rank raises the class the failing ranks saw.
    EXPECT_TRUE(throws_with<ShardingError>(atomic_load, "this rank did not keep ShardedTensor(key='w'"));
    const TensorAwareStateDict atomic =
        TensorAwareStateDict::from_state_dict(replicated(true), comm, TensorAwareAlgo::kAtomic);
    EXPECT_TRUE(at::equal(atomic.to_state_dict(replicated(false), comm, options).state_dict.at("w").as_tensor(), w));
    options.algo = TensorAwareAlgo::kFullyParallel;  // nothing to exchange: every shard is here
    EXPECT_TRUE(at::equal(atomic.to_state_dict(replicated(false), comm, options).state_dict.at("w").as_tensor(), w));
  });
}

// Groups of unequal sizes ({0, 1} and {2}): every rank reaches the same
// steps; the rank alone in its group keeps everything it holds.
TEST(TensorAware, ParallelizationGroupsOfUnequalSizes) {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  const at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3});
  run_ranks(3, [&](Communicator& comm) {
    const int rank = comm.rank();
    const int group_size = rank < 2 ? 2 : 1;
    const auto group = communicator_from_store(
        c10::make_intrusive<c10d::PrefixStore>("g" + std::to_string(rank / 2), store), rank % 2, group_size);
    StateDict sd;
    sd["w"] = ShardedTensor::from_rank_offsets("w", w.clone(), {}, {rank});
    const TensorAwareStateDict tasd =
        TensorAwareStateDict::from_state_dict(sd, comm, TensorAwareAlgo::kFullyParallel, nullptr, group.get());
    if (rank == 2) {
      EXPECT_TRUE(tasd.state().tensors[0].held);
    }
    ToStateDictOptions options;
    options.parallelization_group = group.get();
    StateDict request;
    request["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({2, 3}), {}, {rank});
    EXPECT_TRUE(at::equal(tasd.to_state_dict(request, comm, options).state_dict.at("w").as_tensor(), w));
  });
}

}  // namespace
}  // namespace distckpt
