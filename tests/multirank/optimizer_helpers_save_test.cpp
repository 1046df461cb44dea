// Optimizer state saved sharded like its parameters: two ranks each hold a
// row shard of a [4, 3] weight and its Adam state; one rank loads it whole.
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

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
    // The requesting rank's own param ids (non-persistent: not in the checkpoint).
    request["optimizer"]["param_groups"] = List{Value::dict()};
    request["optimizer"]["param_groups"][0]["params"] = LocalNonPersistentObject(Value(List{Value(0)}));
    const StateDict loaded = load(request, dir, comm).state_dict;
    const Value& state = loaded.at("optimizer").at("state").at("0");
    EXPECT_TRUE(at::equal(state.at("exp_avg").as_tensor(), whole_exp_avg));
    EXPECT_TRUE(at::equal(state.at("exp_avg_sq").as_tensor(), whole_exp_avg_sq));
    EXPECT_EQ(state.at("step").as_int(), 2);  // plain value: common state

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

// Pipeline stages with different parameter counts (stage 0: two, stage 1:
// one): each rank's param_groups ids are its own, so they are not saved as
// common state; every stage's Adam state comes back, checked against the
// values saved.
TEST(OptimizerHelpersSave, PipelineStagesWithUnequalParameterCounts) {
  TempDir tmp("optim-pp");
  const std::string dir = tmp.path() + "/ckpt";
  const auto stage_params = [](int stage, double scale) {
    std::vector<at::Tensor> params;
    if (stage == 0) {
      params.push_back(global_tensor("stage0.a", {4, 3}).mul(scale).requires_grad_());
      params.push_back(global_tensor("stage0.b", {4}).mul(scale).requires_grad_());
    } else {
      params.push_back(global_tensor("stage1.c", {2, 2}).mul(scale).requires_grad_());
    }
    return params;
  };
  const auto sharded = [](int stage, const std::vector<at::Tensor>& params, torch::optim::Adam& opt) {
    StateDict sd = Value::dict();
    const char* names[2][2] = {{"stage0.a", "stage0.b"}, {"stage1.c", nullptr}};
    for (size_t i = 0; i < params.size(); ++i) {
      sd["model"][names[stage][i]] = ShardedTensor::from_rank_offsets(names[stage][i], params[i], {});
    }
    StateDict optim = optimizer_state_dict(opt);
    optim_state_to_sharding_state(optim, param_id_to_sharded_param(sd, opt.param_groups()[0].params()));
    sd["optimizer"] = optim;
    return sd;
  };
  std::vector<std::vector<at::Tensor>> saved_exp_avg(2);
  run_ranks(2, [&](Communicator& comm) {
    const int stage = comm.rank();
    std::vector<at::Tensor> params = stage_params(stage, 0.01);
    torch::optim::Adam opt(params, torch::optim::AdamOptions(0.1));
    for (int s = 0; s < 2; ++s) {
      for (at::Tensor& p : params) p.mutable_grad() = at::sin(p.detach() * (s + 2));
      opt.step();
    }
    const StateDict state = optimizer_state_dict(opt);
    for (size_t i = 0; i < params.size(); ++i) {
      saved_exp_avg[stage].push_back(state.at("state").at(std::to_string(i)).at("exp_avg").as_tensor().clone());
    }
    save(sharded(stage, params, opt), dir, comm);
  });
  run_ranks(2, [&](Communicator& comm) {
    const int stage = comm.rank();
    // A fresh run: same stage parameters, its optimizer stepped once so it has
    // state entries to describe the request.
    std::vector<at::Tensor> params = stage_params(stage, 0);
    torch::optim::Adam opt(params, torch::optim::AdamOptions(0.5));
    for (at::Tensor& p : params) p.mutable_grad() = at::zeros_like(p);
    opt.step();
    const LoadResult loaded = load(sharded(stage, params, opt), dir, comm);
    const Value& groups = loaded.state_dict.at("optimizer").at("param_groups");
    EXPECT_EQ(groups[0].at("params").size(), params.size());  // this rank's own ids
    EXPECT_DOUBLE_EQ(groups[0].at("lr").as_float(), 0.1);     // the saved hyper-parameters
    load_optimizer_state_dict(opt, loaded.state_dict.at("optimizer"));
    const StateDict restored = optimizer_state_dict(opt);
    for (size_t i = 0; i < params.size(); ++i) {
      const Value& state = restored.at("state").at(std::to_string(i));
      EXPECT_TRUE(at::equal(state.at("exp_avg").as_tensor(), saved_exp_avg[stage][i])) << "stage " << stage << " " << i;
      EXPECT_EQ(state.at("step").as_int(), 2);
    }
  });
}

}  // namespace
}  // namespace distckpt
