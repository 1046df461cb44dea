// Optimizer state saved sharded like its parameters: two ranks each hold a
// row shard of a [4, 3] weight and its Adam state; one rank loads it whole.
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <set>
#include <string>
#include <vector>

#include "distckpt/optim/optimizer_state.h"
#include "distckpt/optim/torch_optim.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;

TEST(OptimizerHelpersSave, RowShardedAdamStateLoadsWholeOnOneRank) {
  TempDir tmp("optim");
  const std::string dir = tmp.path() + "/ckpt";
  const at::Tensor weight = global_tensor("w", {4, 3}).div(100);
  // Each rank's state after two steps, kept (cloned) to compare with the load.
  std::vector<at::Tensor> exp_avg(2), exp_avg_sq(2);

  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    at::Tensor param = weight.narrow(0, 2 * r, 2).clone().requires_grad_();
    torch::optim::Adam opt(std::vector<at::Tensor>{param}, torch::optim::AdamOptions(0.1));
    for (int s = 0; s < 2; ++s) {
      param.mutable_grad() = at::cos(param.detach() * (s + 1) + r);  // differs per rank and step
      opt.step();
    }

    StateDict sd = Value::dict();
    sd["model"]["w"] = ShardedTensor::from_rank_offsets("w", param, {{0, r, 2}});
    StateDict optim = optimizer_state_dict(opt);
    exp_avg[r] = optim.at("state").at("0").at("exp_avg").as_tensor().clone();
    exp_avg_sq[r] = optim.at("state").at("0").at("exp_avg_sq").as_tensor().clone();
    optim_state_to_sharding_state(optim, param_id_to_sharded_param(sd, opt.param_groups()[0].params()));
    sd["optimizer"] = optim;
    save(sd, dir, comm);
  });

  const at::Tensor whole_exp_avg = at::cat({exp_avg[0], exp_avg[1]});
  const at::Tensor whole_exp_avg_sq = at::cat({exp_avg_sq[0], exp_avg_sq[1]});
  run_ranks(1, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["optimizer"]["state"]["0"]["exp_avg"] =
        ShardedTensor::from_rank_offsets("optimizer.state.exp_avg.w", at::zeros({4, 3}), {});
    request["optimizer"]["state"]["0"]["exp_avg_sq"] =
        ShardedTensor::from_rank_offsets("optimizer.state.exp_avg_sq.w", at::zeros({4, 3}), {});
    request["optimizer"]["state"]["0"]["step"] =
        ShardedTensor::from_rank_offsets("optimizer.state.step.w", at::zeros({1}, at::kLong), {});
    // The requesting rank's own param ids (non-persistent: not in the checkpoint).
    request["optimizer"]["param_groups"] = List{Value::dict()};
    request["optimizer"]["param_groups"][0]["params"] = LocalNonPersistentObject(Value(List{Value(0)}));
    const StateDict loaded = load(request, dir, comm).state_dict;
    const Value& state = loaded.at("optimizer").at("state").at("0");
    EXPECT_TRUE(at::equal(state.at("exp_avg").as_tensor(), whole_exp_avg));
    EXPECT_TRUE(at::equal(state.at("exp_avg_sq").as_tensor(), whole_exp_avg_sq));
    // The parameter's own step, written once (by the rank holding row 0).
    EXPECT_EQ(state.at("step").as_tensor().item<int64_t>(), 2);

    // The resharded state (with the common param_groups) fits an optimizer
    // over the whole [4, 3] weight.
    at::Tensor whole = at::zeros({4, 3}).requires_grad_();
    torch::optim::Adam opt(std::vector<at::Tensor>{whole});
    load_optimizer_state_dict(opt, loaded.at("optimizer"));
    const StateDict restored = optimizer_state_dict(opt);
    EXPECT_TRUE(at::equal(restored.at("state").at("0").at("exp_avg").as_tensor(), whole_exp_avg));
    EXPECT_DOUBLE_EQ(restored.at("param_groups")[0].at("lr").as_float(), 0.1);
  });
}

// Pipeline stages with different parameter counts, in both directions (the
// last stage usually holds more: the final norm and the output layer). Ids
// are per stage, so neither the param_groups' ids nor the per-parameter
// "step" may be common state (the coordinator's alone): every stage's state
// comes back exactly, and Adam resumes bitwise as if never interrupted.
struct PipelineCase {
  std::vector<int> params_per_stage;  // stage 0 is the coordinator
  bool megatron_common_step;          // exclude_keys={"step"} + state["common_step"]
};

class PipelineOptimizerState : public ::testing::TestWithParam<PipelineCase> {};

std::vector<at::Tensor> stage_params(int stage, int count, double scale) {
  std::vector<at::Tensor> params;
  for (int i = 0; i < count; ++i) {
    params.push_back(global_tensor(fmt::format("stage{}.p{}", stage, i), {3 + i, 2}).mul(scale).requires_grad_());
  }
  return params;
}

// Steps `opt` with gradients that depend on the stage, the parameter and the step.
void take_steps(torch::optim::Adam& opt, std::vector<at::Tensor>& params, int stage, int first, int count) {
  for (int s = first; s < first + count; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = at::sin(params[i].detach() * (s + 2) + static_cast<double>(stage + i));
    }
    opt.step();
  }
}

StateDict pipeline_state(int stage, const std::vector<at::Tensor>& params, torch::optim::Adam& opt,
                         bool megatron_common_step) {
  StateDict sd = Value::dict();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = fmt::format("stage{}.p{}", stage, i);
    sd["model"][key] = ShardedTensor::from_rank_offsets(key, params[i], {});
  }
  StateDict optim = optimizer_state_dict(opt);
  const int64_t step = optim.at("state").at("0").at("step").as_int();
  optim_state_to_sharding_state(optim, param_id_to_sharded_param(sd, opt.param_groups()[0].params()),
                                megatron_common_step ? std::set<std::string>{"step"} : std::set<std::string>{});
  if (megatron_common_step) optim["state"]["common_step"] = step;
  sd["optimizer"] = optim;
  return sd;
}

TEST_P(PipelineOptimizerState, EveryStagesStepAndMomentsComeBackAndAdamResumesBitwise) {
  const PipelineCase c = GetParam();
  TempDir tmp("optim-pp");
  const std::string dir = tmp.path() + "/ckpt";
  std::vector<std::vector<at::Tensor>> continued(2);  // parameters after 2 + 3 uninterrupted steps
  std::vector<std::vector<at::Tensor>> saved_exp_avg(2);
  run_ranks(2, [&](Communicator& comm) {
    const int stage = comm.rank();
    std::vector<at::Tensor> params = stage_params(stage, c.params_per_stage[stage], 0.01);
    torch::optim::Adam opt(params, torch::optim::AdamOptions(0.1));
    take_steps(opt, params, stage, 0, 2);
    const StateDict state = optimizer_state_dict(opt);
    for (size_t i = 0; i < params.size(); ++i) {
      saved_exp_avg[stage].push_back(state.at("state").at(std::to_string(i)).at("exp_avg").as_tensor().clone());
    }
    save(pipeline_state(stage, params, opt, c.megatron_common_step), dir, comm);
    take_steps(opt, params, stage, 2, 3);
    for (const at::Tensor& p : params) continued[stage].push_back(p.detach().clone());
  });
  run_ranks(2, [&](Communicator& comm) {
    const int stage = comm.rank();
    // A fresh run: the parameters as saved, an optimizer stepped once (with
    // zero gradients, which leaves them) so it has state entries to describe the request.
    std::vector<at::Tensor> params = stage_params(stage, c.params_per_stage[stage], 0.01);
    std::vector<at::Tensor> before;
    {
      std::vector<at::Tensor> reference = stage_params(stage, c.params_per_stage[stage], 0.01);
      torch::optim::Adam opt(reference, torch::optim::AdamOptions(0.1));
      take_steps(opt, reference, stage, 0, 2);
      for (size_t i = 0; i < params.size(); ++i) {
        at::NoGradGuard no_grad;
        params[i].copy_(reference[i]);
      }
    }
    torch::optim::Adam opt(params, torch::optim::AdamOptions(0.5));
    for (at::Tensor& p : params) p.mutable_grad() = at::zeros_like(p);
    opt.step();
    const LoadResult loaded = load(pipeline_state(stage, params, opt, c.megatron_common_step), dir, comm);
    const Value& groups = loaded.state_dict.at("optimizer").at("param_groups");
    EXPECT_EQ(groups[0].at("params").size(), params.size());  // this rank's own ids
    EXPECT_DOUBLE_EQ(groups[0].at("lr").as_float(), 0.1);     // the saved hyper-parameters
    load_optimizer_state_dict(opt, loaded.state_dict.at("optimizer"));
    const StateDict restored = optimizer_state_dict(opt);
    for (size_t i = 0; i < params.size(); ++i) {
      const Value& state = restored.at("state").at(std::to_string(i));
      EXPECT_TRUE(at::equal(state.at("exp_avg").as_tensor(), saved_exp_avg[stage][i])) << "stage " << stage << " " << i;
      EXPECT_EQ(state.at("step").as_int(), 2) << "stage " << stage << " " << i;
    }
    // Resumed: three more steps give exactly the uninterrupted run's parameters.
    take_steps(opt, params, stage, 2, 3);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(at::equal(params[i].detach(), continued[stage][i])) << "stage " << stage << " param " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(BothDirections, PipelineOptimizerState,
                         ::testing::Values(PipelineCase{{2, 1}, false}, PipelineCase{{1, 2}, false},
                                           PipelineCase{{1, 3}, true}, PipelineCase{{3, 1}, true}),
                         [](const ::testing::TestParamInfo<PipelineCase>& info) {
                           return fmt::format("Stage0With{}Stage1With{}{}", info.param.params_per_stage[0],
                                              info.param.params_per_stage[1],
                                              info.param.megatron_common_step ? "CommonStep" : "");
                         });

}  // namespace
}  // namespace distckpt
