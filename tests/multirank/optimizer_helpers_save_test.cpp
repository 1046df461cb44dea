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

}  // namespace
}  // namespace distckpt
