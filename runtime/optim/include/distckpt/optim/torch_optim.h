// PyTorch-format state dicts for LibTorch's Adam and AdamW, so their state can
// go through optim_state_to_sharding_state (distckpt/optim/optimizer_state.h)
// into a distributed checkpoint and back.
//
// Format (that of torch.optim.Optimizer.state_dict()):
//   {"state": {"<id>": {"step": int, "exp_avg": tensor, "exp_avg_sq": tensor,
//                       "max_exp_avg_sq": tensor (amsgrad only)}},
//    "param_groups": [{"lr": float, "betas": [float, float], "eps": float,
//                      "weight_decay": float, "amsgrad": bool, "params": [<id>, ...]}]}
// An id is a parameter's position over all param groups in order. Parameters
// the optimizer has no state for yet (never stepped) have no "state" entry.
#pragma once

#include "distckpt/core/state_dict.h"

namespace torch::optim {
class Adam;
class AdamW;
}  // namespace torch::optim

namespace distckpt {

// The optimizer's state. The tensors are the optimizer's own (not copies), as
// in PyTorch: they follow later steps; clone them for a snapshot.
StateDict optimizer_state_dict(const torch::optim::Adam& opt);
StateDict optimizer_state_dict(const torch::optim::AdamW& opt);

// Restores every parameter's state (a tensor with the parameter's dtype, device
// and strides is adopted as PyTorch does, others are copied into that layout; step) and the group hyper-parameters
// (lr, betas, eps, weight_decay). Parameters are matched by position, like
// PyTorch's load_state_dict; state the dict has no entry for is dropped, and
// state of an id no group lists is ignored. "step" may be a one-element tensor
// (what a load returns); a parameter without one takes state["common_step"]
// when there is one (Megatron's exclude_keys={"step"} idiom).
// Throws UsageError, leaving the optimizer untouched, when the number of groups or
// of parameters differs, a tensor's shape differs from its parameter's (naming
// the id and both shapes), or amsgrad differs between a group and the dict.
void load_optimizer_state_dict(torch::optim::Adam& opt, const StateDict& state_dict);
void load_optimizer_state_dict(torch::optim::AdamW& opt, const StateDict& state_dict);

}  // namespace distckpt
