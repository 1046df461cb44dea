// Optimizer state as sharded state: Megatron-Core's
// dist_checkpointing/optimizer.py helpers. An optimizer's per-parameter
// tensors (Adam's exp_avg, exp_avg_sq, ...) are sharded exactly like the
// parameter they belong to, so they take the model parameter's ShardedTensor
// (or factory) with a key of their own and reshard with it on load.
//
// The optimizer state dict is in PyTorch's format (see distckpt/optim/torch_optim.h):
//   {"state": {"<id>": {"exp_avg": tensor, "exp_avg_sq": tensor, "step": int, ...}},
//    "param_groups": [{"lr": ..., "params": [<id>, ...], ...}]}
// where an id is the position of the parameter over all param groups in order.
//
// Nothing here depends on torch::optim: any optimizer whose state can be put
// in that format works.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"

namespace c10 {
struct TensorImpl;
}

namespace distckpt {

// Megatron's get_optim_param_to_id_map: each parameter (by TensorImpl) to its
// id, the position over all param groups in order; a parameter listed twice
// keeps its first id.
std::map<const c10::TensorImpl*, int64_t> get_optim_param_to_id_map(const std::vector<at::Tensor>& optimizer_params);

// Maps optimizer param ids (positions in `optimizer_params`, the parameters of
// all param groups in order) to the model's ShardedTensor or
// ShardedTensorFactory that holds the same tensor. "Same" is identity, not
// value: the same TensorImpl, or a tensor viewing the same memory (data
// pointer, sizes, strides and dtype). Parameters with no sharded entry in the
// model are absent from the map, like in Megatron; when several model entries
// hold the same parameter (tied weights), the last one in key order wins, also
// like Megatron. O(n log n) in the number of parameters and entries. Logs a
// warning when no parameter matches (the optimizer was built over other
// tensors than the model state dict holds, e.g. copies).
std::map<int64_t, Value> param_id_to_sharded_param(const StateDict& model_sharded_state_dict,
                                                   const std::vector<at::Tensor>& optimizer_params);

// The optimizer tensor sharded like `model_param` (a ShardedTensor or a
// ShardedTensorFactory): same placement and replica id, key
// `prefix + "." + model key`, data `optimizer_tensor` (its dtype may differ,
// e.g. fp32 moments of a bf16 parameter). Throws ShardingError naming both keys
// and shapes when the optimizer tensor's shape differs from the model data's.
// A factory is copied with key and data replaced; its build and merge are
// reused (build receives the new key).
Value make_sharded_optimizer_tensor(const Value& model_param, const at::Tensor& optimizer_tensor,
                                    const std::string& prefix);

// Turns a PyTorch-format optimizer state dict into a sharded state dict, in
// place, as Megatron does: every tensor in state["<id>"] becomes
// make_sharded_optimizer_tensor(model entry of <id>, tensor,
// "optimizer.state." + name); names in `exclude_keys` are dropped.
// Per-parameter scalars ("step": an int, a bool, a float, or a 0-dim tensor
// as PyTorch >= 1.12 keeps it) become one-element ShardedTensors keyed
// "optimizer.state.<name>.<model key>", over the parameter's stacked axes,
// written by the rank holding the parameter's first element: each
// parameter's own value comes back on every rank holding it, whatever the
// pipeline stage (Megatron keeps them as common state, which is the
// coordinator's alone and keyed by rank-local ids). After a load they are
// one-element tensors, which load_optimizer_state_dict reads. Megatron's
// idiom, exclude_keys={"step"} with state["common_step"] added afterwards as
// common state, also loads: that step then applies to every parameter. Any
// other non-tensor value is a UsageError naming it (exclude it or convert it).
// Each param_groups[i]["params"] becomes a LocalNonPersistentObject: ids are
// per-rank (pipeline stages hold different parameters), so a load puts back
// the requesting rank's own lists while the hyper-parameters are common.
// Throws UsageError naming the id when a param id in "state" has no entry in
// `id_to_sharded_param`; the state dict is unchanged when anything throws.
void optim_state_to_sharding_state(Value& optim_state_dict, const std::map<int64_t, Value>& id_to_sharded_param,
                                   const std::set<std::string>& exclude_keys = {});

}  // namespace distckpt
