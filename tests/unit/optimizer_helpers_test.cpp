// Optimizer helpers: PyTorch-format state dicts of LibTorch's Adam/AdamW and
// Megatron's conversion of optimizer state into sharded state.
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <sstream>
#include <type_traits>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/optim/optimizer_state.h"
#include "distckpt/optim/torch_optim.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

// Three parameters: w [4, 3] and b [4] in group 0, e [5, 2] in group 1 (so ids
// run over groups). Values are fixed, so two calls give equal parameters.
std::vector<at::Tensor> make_params() {
  return {at::arange(12, at::kFloat).reshape({4, 3}).div(10).requires_grad_(), at::linspace(-1, 1, 4).requires_grad_(),
          at::arange(10, at::kFloat).reshape({5, 2}).sub(4).div(3).requires_grad_()};
}

// Deterministic gradients that differ per parameter and per step.
void step(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params, int n, int first = 0) {
  for (int s = first; s < first + n; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      p.mutable_grad() = at::sin(p.detach() * (s + 1) + static_cast<double>(i));
    }
    opt.step();
  }
}

// Groups {w, b} and {e}. `tuned` sets hyper-parameters of its own on each
// group; otherwise LibTorch's defaults, to check that a load restores them.
template <typename Opt, typename Options>
Opt make_optimizer(const std::vector<at::Tensor>& params, bool amsgrad, bool tuned = true) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]});
  Options second = tuned ? Options(0.05).weight_decay(0.1) : Options();
  groups.emplace_back(std::vector<at::Tensor>{params[2]}, std::make_unique<Options>(second.amsgrad(amsgrad)));
  Options first = tuned ? Options(0.01).betas(std::make_tuple(0.8, 0.95)).eps(1e-6) : Options();
  return Opt(std::move(groups), first.amsgrad(amsgrad));
}

// The optimizer's own state of `param`; LibTorch 1.x keys it by the printed
// TensorImpl address, 2.x by the address itself.
template <typename ParamState>
const ParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& param) {
  using Key = typename std::decay_t<decltype(opt.state())>::key_type;
  Key key;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    key = out.str();
  } else {
    key = param.unsafeGetTensorImpl();
  }
  const auto it = opt.state().find(key);
  if (it == opt.state().end()) throw std::runtime_error("the optimizer has no state for this param");
  return static_cast<const ParamState&>(*it->second);
}

TEST(OptimizerHelpersTorch, AdamStateDictHoldsTheOptimizerTensors) {
  const auto params = make_params();
  auto opt = make_optimizer<torch::optim::Adam, torch::optim::AdamOptions>(params, false);
  EXPECT_EQ(optimizer_state_dict(opt).at("state").size(), 0u);  // not stepped: no state yet
  step(opt, params, 2);
  const StateDict sd = optimizer_state_dict(opt);

  ASSERT_EQ(sd.at("state").size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& s = state_of<torch::optim::AdamParamState>(opt, params[i]);
    const Value& entry = sd.at("state").at(std::to_string(i));
    EXPECT_EQ(entry.at("step").as_int(), 2);
    // The optimizer's tensors themselves, as in PyTorch.
    EXPECT_TRUE(entry.at("exp_avg").as_tensor().is_same(s.exp_avg()));
    EXPECT_TRUE(entry.at("exp_avg_sq").as_tensor().is_same(s.exp_avg_sq()));
    EXPECT_FALSE(entry.contains("max_exp_avg_sq"));
  }
  const Value& g0 = sd.at("param_groups")[0];
  const Value& g1 = sd.at("param_groups")[1];
  EXPECT_TRUE(g0.at("params").equals(List{Value(0), Value(1)}));
  EXPECT_TRUE(g1.at("params").equals(List{Value(2)}));
  EXPECT_DOUBLE_EQ(g0.at("lr").as_float(), 0.01);
  EXPECT_DOUBLE_EQ(g0.at("betas")[0].as_float(), 0.8);
  EXPECT_DOUBLE_EQ(g0.at("betas")[1].as_float(), 0.95);
  EXPECT_DOUBLE_EQ(g0.at("eps").as_float(), 1e-6);
  EXPECT_DOUBLE_EQ(g0.at("weight_decay").as_float(), 0.0);
  EXPECT_FALSE(g0.at("amsgrad").as_bool());
  EXPECT_DOUBLE_EQ(g1.at("lr").as_float(), 0.05);
  EXPECT_DOUBLE_EQ(g1.at("weight_decay").as_float(), 0.1);
}

// Save after 2 steps, load into a fresh optimizer over equal parameters, then
// take 2 more steps on both: parameters and state stay bitwise identical.
template <typename Opt, typename Options, typename ParamState>
void expect_round_trip(bool amsgrad) {
  const auto params = make_params();
  auto opt = make_optimizer<Opt, Options>(params, amsgrad);
  step(opt, params, 2);
  // The state dict aliases opt's tensors; a checkpoint load yields tensors of
  // its own, so the fresh optimizer gets clones (else both would step the same
  // moments). exp_avg of param 1 comes back as double, to be converted.
  StateDict sd = map_outplace(optimizer_state_dict(opt), [](const Value& v) {
    return v.kind() == Kind::kTensor ? Value(v.as_tensor().clone()) : v;
  });
  EXPECT_EQ(sd.at("state").at("1").contains("max_exp_avg_sq"), amsgrad);
  sd.at("state").at("1").at("exp_avg") = sd.at("state").at("1").at("exp_avg").as_tensor().to(at::kDouble);

  std::vector<at::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
  auto fresh = make_optimizer<Opt, Options>(copies, amsgrad, /*tuned=*/false);
  load_optimizer_state_dict(fresh, sd);
  EXPECT_DOUBLE_EQ(static_cast<const Options&>(fresh.param_groups()[0].options()).lr(), 0.01);
  EXPECT_DOUBLE_EQ(static_cast<const Options&>(fresh.param_groups()[1].options()).weight_decay(), 0.1);
  // A tensor laid out like its parameter is adopted (as PyTorch 2's .to()
  // does); another dtype is copied into the parameter's.
  EXPECT_TRUE(
      state_of<ParamState>(fresh, copies[0]).exp_avg().is_same(sd.at("state").at("0").at("exp_avg").as_tensor()));
  EXPECT_EQ(state_of<ParamState>(fresh, copies[1]).exp_avg().scalar_type(), at::kFloat);

  step(opt, params, 2, 2);
  step(fresh, copies, 2, 2);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::equal(params[i], copies[i])) << "param " << i;
    const auto& a = state_of<ParamState>(opt, params[i]);
    const auto& b = state_of<ParamState>(fresh, copies[i]);
    EXPECT_EQ(a.step(), 4);
    EXPECT_EQ(b.step(), 4);
    EXPECT_TRUE(at::equal(a.exp_avg(), b.exp_avg())) << "param " << i;
    EXPECT_TRUE(at::equal(a.exp_avg_sq(), b.exp_avg_sq())) << "param " << i;
    if (amsgrad) {
      EXPECT_TRUE(at::equal(a.max_exp_avg_sq(), b.max_exp_avg_sq())) << "param " << i;
    }
  }
}

TEST(OptimizerHelpersTorch, AdamRoundTripGivesIdenticalNextSteps) {
  expect_round_trip<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(false);
}
TEST(OptimizerHelpersTorch, AdamAmsgradRoundTrip) {
  expect_round_trip<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(true);
}
TEST(OptimizerHelpersTorch, AdamWRoundTrip) {
  expect_round_trip<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(false);
}
TEST(OptimizerHelpersTorch, AdamWAmsgradRoundTrip) {
  expect_round_trip<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(true);
}

TEST(OptimizerHelpersTorch, LoadErrorsNameTheMismatch) {
  const auto params = make_params();
  auto opt = make_optimizer<torch::optim::Adam, torch::optim::AdamOptions>(params, false);
  step(opt, params, 2);
  const StateDict sd = optimizer_state_dict(opt);
  const auto others = make_params();

  torch::optim::Adam one_group(others);
  EXPECT_TRUE(throws_with<UsageError>([&] { load_optimizer_state_dict(one_group, sd); },
                                      "has 2 param groups but the optimizer has 1"));
  auto target = make_optimizer<torch::optim::Adam, torch::optim::AdamOptions>(others, false);
  StateDict fewer = sd;
  fewer.at("param_groups")[0].at("params") = List{Value(0)};
  EXPECT_TRUE(throws_with<UsageError>([&] { load_optimizer_state_dict(target, fewer); },
                                      "param group 0 has 1 params but the optimizer's group has 2"));
  StateDict wrong_shape = sd;
  wrong_shape.at("state").at("1").at("exp_avg") = at::zeros({3});
  EXPECT_TRUE(throws_with<UsageError>([&] { load_optimizer_state_dict(target, wrong_shape); },
                                      "\"exp_avg\" of param id 1 has shape [3] but the parameter has shape [4]"));
  auto amsgrad = make_optimizer<torch::optim::Adam, torch::optim::AdamOptions>(others, true);
  EXPECT_TRUE(throws_with<UsageError>([&] { load_optimizer_state_dict(amsgrad, sd); },
                                      "param group 0 was saved with amsgrad=false"));
  // A failed load changed nothing.
  EXPECT_TRUE(target.state().empty());
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdamOptions&>(target.param_groups()[1].options()).lr(), 0.05);
}

// A model sharded state dict over the parameters: w through a view of the
// same memory (detach), b directly, e through a factory; an unrelated tensor
// with equal values to w must not match (it comes last in key order, where a
// match would win).
StateDict model_state(const std::vector<at::Tensor>& p, bool with_b = true) {
  StateDict sd = Value::dict();
  sd["layer"]["w"] = ShardedTensor::from_rank_offsets("layer.w", p[0].detach(), {{0, 1, 2}}, {1});
  if (with_b) sd["layer"]["b"] = ShardedTensor::from_rank_offsets("layer.b", p[1], {{0, 1, 2}});
  ShardedTensorFactory f;
  f.key = "emb";
  f.data = p[2];
  f.replica_id = {0, 1};
  f.build = [](const std::string& key, const at::Tensor& data, const ReplicaId& replica,
               const std::optional<FlatRange>&) {
    Value parts = Value::dict();  // rows split in two tensors of their own
    parts["a"] = ShardedTensor::from_rank_offsets(key + ".a", data.narrow(0, 0, 2), {}, replica);
    parts["b"] = ShardedTensor::from_rank_offsets(key + ".b", data.narrow(0, 2, 3), {}, replica);
    return parts;
  };
  f.merge = [](const Value& loaded) { return at::cat({loaded.at("a").as_tensor(), loaded.at("b").as_tensor()}); };
  sd["emb"] = Value(std::move(f));
  sd["z_copy"] = ShardedTensor::from_rank_offsets("copy", p[0].detach().clone(), {});
  sd["iteration"] = 3;
  return sd;
}

TEST(OptimizerHelpersShardedState, ParamIdsMatchModelEntriesByIdentity) {
  const auto params = make_params();
  const auto map = param_id_to_sharded_param(model_state(params), params);
  ASSERT_EQ(map.size(), 3u);
  EXPECT_EQ(map.at(0).as_sharded_tensor().key, "layer.w");
  EXPECT_EQ(map.at(1).as_sharded_tensor().key, "layer.b");
  EXPECT_EQ(map.at(2).as_factory().key, "emb");
  const auto partial = param_id_to_sharded_param(model_state(params, false), params);
  EXPECT_EQ(partial.size(), 2u);
  EXPECT_EQ(partial.count(1), 0u);  // b is not in the model: absent, like Megatron
}

TEST(OptimizerHelpersShardedState, ParamToIdMapAndTheEmptyMapWarning) {
  const auto params = make_params();
  std::vector<at::Tensor> listed = params;
  listed.push_back(params[0]);  // listed twice: keeps its first id
  const auto ids = get_optim_param_to_id_map(listed);
  ASSERT_EQ(ids.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(ids.at(params[i].unsafeGetTensorImpl()), int64_t(i));

  testing::LogCapture log;
  std::vector<at::Tensor> copies;
  for (const at::Tensor& p : params) copies.push_back(p.detach().clone());
  EXPECT_TRUE(param_id_to_sharded_param(model_state(params), copies).empty());
  EXPECT_NE(log.joined().find("none of the optimizer's 3 parameters is held by the model sharded state dict"),
            std::string::npos)
      << log.joined();
}

TEST(OptimizerHelpersShardedState, MakeShardedOptimizerTensor) {
  const auto params = make_params();
  const StateDict model = model_state(params);
  const Value st = make_sharded_optimizer_tensor(model.at("layer").at("w"), at::ones({4, 3}, at::kDouble),
                                                 "optimizer.state.exp_avg");
  EXPECT_EQ(st.as_sharded_tensor().key, "optimizer.state.exp_avg.layer.w");
  EXPECT_EQ(st.as_sharded_tensor().dtype, at::kDouble);  // the optimizer tensor's own precision
  EXPECT_EQ(st.as_sharded_tensor().global_shape, (Shape{8, 3}));
  EXPECT_EQ(st.as_sharded_tensor().global_offset, (Shape{4, 0}));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] { make_sharded_optimizer_tensor(model.at("layer").at("b"), at::zeros({5}), "optimizer.state.exp_avg"); },
      "'optimizer.state.exp_avg.layer.b' has shape [5] but the model parameter 'layer.b'"));
  // A factory keeps build/merge: the optimizer tensor is built under its own key.
  const at::Tensor moment = at::randn({5, 2});
  const Value f = make_sharded_optimizer_tensor(model.at("emb"), moment, "optimizer.state.exp_avg_sq");
  const Value built = f.as_factory().build_subtree();
  EXPECT_EQ(built.at("b").as_sharded_tensor().key, "optimizer.state.exp_avg_sq.emb.b");
  EXPECT_EQ(built.at("b").as_sharded_tensor().replica_id, (ReplicaId{0, 1}));
  EXPECT_TRUE(at::equal(built.at("a").as_sharded_tensor().data, moment.narrow(0, 0, 2)));
  EXPECT_TRUE(throws_with<UsageError>([&] { make_sharded_optimizer_tensor(Value(1), moment, "p"); },
                                      "the model entry is a int"));
}

TEST(OptimizerHelpersShardedState, OptimStateToShardingState) {
  const auto params = make_params();
  auto opt = make_optimizer<torch::optim::Adam, torch::optim::AdamOptions>(params, false);
  step(opt, params, 2);
  StateDict sd = optimizer_state_dict(opt);
  const Value groups_before = sd.at("param_groups");
  optim_state_to_sharding_state(sd, param_id_to_sharded_param(model_state(params), params), {"exp_avg_sq"});

  const Value& w = sd.at("state").at("0");
  const ShardedTensor& exp_avg = w.at("exp_avg").as_sharded_tensor();
  EXPECT_EQ(exp_avg.key, "optimizer.state.exp_avg.layer.w");
  EXPECT_EQ(exp_avg.replica_id, (ReplicaId{1}));
  EXPECT_EQ(exp_avg.local_shape, (Shape{4, 3}));
  EXPECT_EQ(exp_avg.global_shape, (Shape{8, 3}));
  EXPECT_TRUE(exp_avg.data.is_same(state_of<torch::optim::AdamParamState>(opt, params[0]).exp_avg()));
  // Scalars are the parameter's own, not common state: one element, written
  // by the holder of the parameter's first element as main replica (w's is
  // replica 1 here, so not by this rank).
  const ShardedTensor& step = w.at("step").as_sharded_tensor();
  EXPECT_EQ(step.key, "optimizer.state.step.layer.w");
  EXPECT_EQ(step.global_shape, (Shape{1}));
  EXPECT_EQ(step.replica_id, (ReplicaId{1}));
  EXPECT_EQ(step.data.item<int64_t>(), 2);
  EXPECT_EQ(sd.at("state").at("2").at("step").as_sharded_tensor().key, "optimizer.state.step.emb");
  EXPECT_FALSE(w.contains("exp_avg_sq"));  // excluded: dropped, as in Megatron
  EXPECT_EQ(sd.at("state").at("1").at("exp_avg").as_sharded_tensor().key, "optimizer.state.exp_avg.layer.b");
  EXPECT_EQ(sd.at("state").at("2").at("exp_avg").as_factory().key, "optimizer.state.exp_avg.emb");
  // The params lists are per rank: non-persistent; the hyper-parameters stay.
  const Value& group = sd.at("param_groups")[0];
  ASSERT_EQ(group.at("params").kind(), Kind::kNonPersistent);
  EXPECT_TRUE(group.at("params").as_non_persistent().unwrap().equals(groups_before[0].at("params")));
  EXPECT_TRUE(group.at("lr").equals(groups_before[0].at("lr")));

  // b has optimizer state but no model entry: an error naming its id, nothing changed.
  StateDict plain = optimizer_state_dict(opt);
  const auto partial = param_id_to_sharded_param(model_state(params, false), params);
  EXPECT_TRUE(throws_with<UsageError>([&] { optim_state_to_sharding_state(plain, partial); },
                                      "optimizer state of param id 1 matches no sharded parameter"));
  EXPECT_EQ(plain.at("state").at("0").at("exp_avg").kind(), Kind::kTensor);
}

}  // namespace
}  // namespace distckpt
