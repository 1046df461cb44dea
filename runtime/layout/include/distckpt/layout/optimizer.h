// GENERATED-CODE SUPPORT: called by the optimizer classes distckpt-gen emits;
// it changes together with the generator.
//
// Optimizer state laid out like the model's parameters, from a schema's
// `optimizer` block: every state tensor is sharded exactly like its parameter
// (key "optimizer.state.<state>.<parameter key>", fused tensors chunked the
// same way), and with `distributed over dp * cp` each rank of that group
// writes only the contiguous flat range it owns (ZeRO-1), so a save never
// gathers. Each mesh (dense, experts) has its own distribution, as each has
// its own data-parallel group.
//
// The optimizer side is PyTorch's optimizer state-dict format
// ({"state": {"<id>": {...}}, "param_groups": [...]}, see distckpt/optim),
// so any optimizer that can produce and consume it plugs in.
#pragma once

#include <string>
#include <vector>

#include "distckpt/layout/builder.h"

namespace distckpt::layout {

struct OptimizerSpec {
  std::string name;                  // "adam"
  std::vector<std::string> states;   // per-parameter state tensors ("exp_avg", "exp_avg_sq")
  std::vector<std::string> scalars;  // per-optimizer scalars ("step")
  // ZeRO-1 per mesh; a mesh without one keeps full state, written by its main replicas.
  std::vector<Distribution> distributed;
  const Distribution* distribution_of(int mesh) const;
};

// The optimizer's parameters in state-dict id order (group by group).
template <typename Optimizer>
std::vector<at::Tensor> parameters_in_order(const Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

// {"optimizer": {"state": {parameter name: {state: entry}}, "step": n,
// "param_groups": [...]}} for the optimizer's parameters `params` (state-dict
// id order), each bound to `model`. The states of a parameter are the
// schema's, plus max_exp_avg_sq where its param group has amsgrad on (groups
// may differ, as in PyTorch); a load asks for exactly those, so any other
// state tensor of the optimizer is a UsageError.
StateDict sharded_optimizer_state(const Builder& model, const OptimizerSpec& spec, const StateDict& torch_state,
                                  const std::vector<at::Tensor>& params);

// What to ask load() for: the states sharded_optimizer_state() saves for each
// of `params`, whole (an optimizer like torch::optim::Adam keeps full local
// state), whatever layout wrote them. `torch_state` is the live optimizer's
// state dict: only its param groups are read.
StateDict optimizer_load_request(const Builder& model, const OptimizerSpec& spec, const StateDict& torch_state,
                                 const std::vector<at::Tensor>& params);

// The loaded "optimizer" sub-tree back in PyTorch format for `params`, with
// the hyper-parameters (param_groups) of the live optimizer's `current` state.
StateDict torch_optimizer_state(const Builder& model, const OptimizerSpec& spec, const Value& loaded,
                                const std::vector<at::Tensor>& params, const StateDict& current);

}  // namespace distckpt::layout
