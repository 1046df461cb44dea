// Optimizer state through the generated GPT layout: entries sharded like
// their parameters, ZeRO-1 flat ranges over dp that tile every chunk, fused
// parameters chunked the same way, and a bitwise round trip into a fresh Adam.
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <array>
#include <optional>

#include "distckpt/layout/from_global.h"
#include "distckpt/optim/torch_optim.h"
#include "gpt.shard.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

struct Trained {
  std::unique_ptr<gpt::Model> model;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Adam> adam;
};

// Adam over `params` in two param groups as Megatron forms them (1-D norms
// and biases apart from the weights, so each layer's tensor of one stack is
// in the same group), amsgrad on in the groups `amsgrad` says.
std::unique_ptr<torch::optim::Adam> adam_in_two_groups(const std::vector<at::Tensor>& params,
                                                       std::array<bool, 2> amsgrad) {
  std::array<std::vector<at::Tensor>, 2> members;
  for (const at::Tensor& p : params) members[p.dim() == 1 ? 0 : 1].push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < 2; ++g) {
    groups.emplace_back(
        members[g], std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(0.01).amsgrad(amsgrad[g])));
  }
  return std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(0.01));
}

// dp rank `dp_rank` of 2 (tp = pp = 1), one Adam step with grad = param;
// with `amsgrad`, Adam has two param groups with those amsgrad flags.
Trained trained(int64_t dp_rank, const std::optional<std::array<bool, 2>>& amsgrad = std::nullopt) {
  gpt::Config c;
  c.hidden = 16;
  c.ffn = 24;
  c.vocab = 40;
  c.layers = 2;
  c.heads = 4;
  c.kv_groups = 2;
  Trained t{std::make_unique<gpt::Model>(c, gpt::Mesh{{0, 1}, {0, 1}, {dp_rank, 2}, {0, 1}}), {}, nullptr};
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [name, entry] : t.model->metadata_state_dict().as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;
    at::Tensor p = layout::local_from_global(entry, [](const std::string& key, const Shape& shape) {
                     return testing::global_tensor(key, shape);
                   }).requires_grad_(true);
    named.emplace_back(name, p);
    t.params.push_back(p);
  }
  t.model->bind(named);
  for (int64_t l = 0; l < t.model->decoder_layers_local_count(); ++l) {
    t.model->decoder_layers(l).self_attention_core_attention__extra_state("x");
  }
  t.adam = amsgrad ? adam_in_two_groups(t.params, *amsgrad)
                   : std::make_unique<torch::optim::Adam>(t.params, torch::optim::AdamOptions(0.01));
  for (auto& p : t.params) p.mutable_grad() = p.detach().clone();
  t.adam->step();
  return t;
}

TEST(GeneratedOptimizer, ZeroRangesTileEveryChunkAcrossDpRanks) {
  Trained r0 = trained(0), r1 = trained(1);
  const StateDict s0 = gpt::Adam(*r0.model).state_dict(*r0.adam), s1 = gpt::Adam(*r1.model).state_dict(*r1.adam);
  EXPECT_EQ(s0.at("optimizer").at("step").as_int(), 1);
  // Every element's exp_avg is written by exactly one of the two dp ranks.
  int64_t total = 0;
  for (const at::Tensor& p : r0.params) total += p.numel();
  int64_t covered = 0;
  for (const StateDict* s : {&s0, &s1}) {
    for (const auto& [param, entries] : s->at("optimizer").at("state").as_dict()) {
      if (!entries.contains("exp_avg")) continue;
      const Value& e = entries.at("exp_avg");
      if (e.kind() == Kind::kShardedTensor) {
        const ShardedTensor& t = e.as_sharded_tensor();
        ASSERT_TRUE(t.flattened_range) << param;
        EXPECT_EQ(t.key.rfind("optimizer.state.exp_avg.", 0), 0u) << t.key;
        EXPECT_TRUE(t.is_main_replica());  // dp ranks hold different ranges: no replica over dp
        covered += t.flattened_range->size();
      } else {  // fused QKV / fc1: the factory splits its flat range over the parts
        const Value parts = e.as_factory().build_subtree();
        for (const auto& [part, piece] : parts.as_dict()) covered += piece.as_sharded_tensor().flattened_range->size();
      }
    }
  }
  EXPECT_EQ(covered, total);  // every element's state is written exactly once
}

using Groups = std::optional<std::array<bool, 2>>;

// Two dp ranks save their model and ZeRO-1 Adam state into `dir`.
void save_trained(const std::string& dir, const Groups& amsgrad) {
  run_ranks(2, [&](Communicator& comm) {
    Trained t = trained(comm.rank(), amsgrad);
    t.model->iteration(1).consumed_samples(0);
    StateDict sd = t.model->state_dict();
    merge(sd, gpt::Adam(*t.model).state_dict(*t.adam));
    save(sd, dir, comm, t.model->save_options());
  });
}

struct Restored {
  StateDict want, got;  // the optimizer state dicts: of a trained Adam, of a fresh one loaded from `dir`
  std::vector<at::Tensor> params;
};

// One process loads `dir` into a fresh Adam (no state) through the generated layout.
Restored restore_into_fresh(const std::string& dir, const Groups& amsgrad) {
  Restored out;
  run_ranks(1, [&](Communicator& comm) {
    Trained reference = trained(0, amsgrad);  // what the state must be
    Trained fresh = trained(0, amsgrad);
    fresh.adam = amsgrad ? adam_in_two_groups(fresh.params, *amsgrad)
                         : std::make_unique<torch::optim::Adam>(fresh.params, torch::optim::AdamOptions(0.01));
    const gpt::Adam layout(*fresh.model);
    StateDict request = fresh.model->state_dict();
    merge(request, layout.load_request(*fresh.adam));
    layout.load_state_dict(*fresh.adam, load(request, dir, comm).state_dict);
    out = Restored{optimizer_state_dict(*reference.adam), optimizer_state_dict(*fresh.adam), fresh.params};
  });
  return out;
}

TEST(GeneratedOptimizer, SavedZeroStateLoadsBackIntoFreshAdamsBitwise) {
  TempDir tmp("gen-optim");
  const std::string dir = tmp.path() + "/ckpt";
  testing::LogCapture log;
  save_trained(dir, std::nullopt);
  // A parameter whose whole flat range another rank owns has no entry here,
  // so the ranks' common state agrees (it once warned on every ZeRO save).
  EXPECT_EQ(log.joined(), "");
  const Restored r = restore_into_fresh(dir, std::nullopt);
  ASSERT_EQ(r.got.at("state").size(), r.params.size());
  for (const auto& [id, state] : r.want.at("state").as_dict()) {
    for (const char* name : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(at::equal(r.got.at("state").at(id).at(name).as_tensor(), state.at(name).as_tensor())) << id << name;
    }
    EXPECT_EQ(r.got.at("state").at(id).at("step").as_int(), 1);
  }
}

// amsgrad is per param group in PyTorch: max_exp_avg_sq is saved for the
// groups that have it on and restored into exactly those, whichever comes first.
TEST(GeneratedOptimizer, MixedAmsgradGroupsRoundTripBitwise) {
  for (const std::array<bool, 2> amsgrad : {std::array<bool, 2>{false, true}, std::array<bool, 2>{true, false}}) {
    TempDir tmp("gen-amsgrad");
    const std::string dir = tmp.path() + "/ckpt";
    save_trained(dir, amsgrad);
    const Restored r = restore_into_fresh(dir, amsgrad);
    ASSERT_EQ(r.got.at("state").size(), r.params.size());
    size_t with_max = 0;
    for (const auto& [id, state] : r.want.at("state").as_dict()) {
      const Value& restored = r.got.at("state").at(id);
      ASSERT_EQ(restored.contains("max_exp_avg_sq"), state.contains("max_exp_avg_sq")) << id;
      for (const auto& [name, value] : state.as_dict()) {
        if (value.kind() != Kind::kTensor) continue;
        EXPECT_TRUE(at::equal(restored.at(name).as_tensor(), value.as_tensor())) << id << name;
      }
      with_max += state.contains("max_exp_avg_sq") ? 1 : 0;
    }
    const auto norms = static_cast<size_t>(
        std::count_if(r.params.begin(), r.params.end(), [](const at::Tensor& p) { return p.dim() == 1; }));
    ASSERT_GT(norms, 0u);
    ASSERT_LT(norms, r.params.size());
    EXPECT_EQ(with_max, amsgrad[0] ? norms : r.params.size() - norms);
  }
}

}  // namespace
}  // namespace distckpt
