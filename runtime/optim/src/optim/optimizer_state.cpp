// Megatron-Core's optimizer.py helpers: find the model's sharded entry of each
// optimizer parameter and shard the optimizer's state like it.
#include "distckpt/optim/optimizer_state.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <charconv>
#include <optional>
#include <tuple>
#include <vector>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"

namespace distckpt {
namespace {

// Identity of a tensor's memory, for parameters that reach the model state
// dict as a different TensorImpl than the optimizer holds (e.g. `param.data()`
// or a detached alias): same first element, same layout, same element type.
using ViewKey = std::tuple<const void*, std::vector<int64_t>, std::vector<int64_t>, int>;

std::optional<ViewKey> view_key(const at::Tensor& t) {
  // Tensors without memory (empty, or no storage at all) all share a null data
  // pointer; they would alias each other, so only the TensorImpl identifies them.
  if (!t.has_storage() || t.numel() == 0) return std::nullopt;
  const void* ptr = t.data_ptr();
  if (ptr == nullptr) return std::nullopt;
  return ViewKey{ptr, t.sizes().vec(), t.strides().vec(), static_cast<int>(t.scalar_type())};
}

Shape shape_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

// The shape an optimizer tensor must have to share a ShardedTensor's placement:
// the shape of the data it holds (the flat slice for flattened ranges).
Shape expected_shape(const ShardedTensor& st) {
  if (st.data.defined()) return shape_of(st.data);
  if (st.flattened_range) return Shape{st.flattened_range->size()};
  return st.local_shape;
}

void check_shape(const std::string& model_key, const Shape& model_shape, const std::string& optim_key,
                 const at::Tensor& optimizer_tensor) {
  const Shape got = shape_of(optimizer_tensor);
  if (got != model_shape) {
    throw ShardingError(
        fmt::format("optimizer tensor '{}' has shape {} but the model parameter '{}' whose sharding it takes "
                    "has shape {}; optimizer state must have the shape of the parameter's local shard",
                    optim_key, to_string(got), model_key, to_string(model_shape)));
  }
}

// "<id>" keys of the PyTorch state dict are decimal param ids.
int64_t parse_param_id(const std::string& text) {
  int64_t id = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, id);
  if (text.empty() || ec != std::errc() || ptr != end || id < 0) {
    throw UsageError(
        fmt::format("optimizer state key '{}' is not a param id; \"state\" must be keyed by the decimal "
                    "position of each parameter over all param groups",
                    text));
  }
  return id;
}

// A short list of the ids that do have a sharded parameter, for messages.
std::string known_ids(const std::map<int64_t, Value>& id_to_sharded_param) {
  constexpr size_t kShown = 16;
  std::vector<int64_t> ids;
  for (const auto& entry : id_to_sharded_param) {
    if (ids.size() == kShown) break;
    ids.push_back(entry.first);
  }
  if (ids.empty()) return "none";
  const std::string more =
      id_to_sharded_param.size() > kShown ? fmt::format(", ... ({} in all)", id_to_sharded_param.size()) : "";
  return fmt::format("{}{}", fmt::join(ids, ", "), more);
}

// A per-parameter value that is not laid out like the parameter: a plain
// scalar ("step": an int in LibTorch, a 0-dim tensor in PyTorch >= 1.12).
bool is_scalar_state(const Value& v, const Value& model_param) {
  switch (v.kind()) {
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
      return true;
    case Kind::kTensor: {
      const at::Tensor* data = model_param.kind() == Kind::kShardedTensor ? &model_param.as_sharded_tensor().data
                               : model_param.kind() == Kind::kFactory     ? &model_param.as_factory().data
                                                                          : nullptr;
      return v.as_tensor().defined() && v.as_tensor().dim() == 0 && (data == nullptr || data->dim() != 0);
    }
    default:
      return false;
  }
}

// The scalar as a one-element tensor (a view of a 0-dim tensor, so a load
// fills the caller's tensor in place).
at::Tensor scalar_tensor(const Value& v) {
  switch (v.kind()) {
    case Kind::kBool:
      return at::full({1}, v.as_bool(), at::TensorOptions().dtype(at::kBool));
    case Kind::kInt:
      return at::full({1}, v.as_int(), at::TensorOptions().dtype(at::kLong));
    case Kind::kFloat:
      return at::full({1}, v.as_float(), at::TensorOptions().dtype(at::kDouble));
    default:
      return v.as_tensor().view({1});
  }
}

// Where a parameter's scalar state is stored: its prepended (stacked) axes,
// then one element; written by the rank that holds the parameter's first
// element as its main replica, so each parameter's value is saved once
// whatever the tp/dp/ZeRO layout, and every rank holding the parameter
// loads it back.
struct ScalarPlacement {
  Shape global_shape, global_offset;
  int64_t prepend_axis_num = 0;
  bool writer = false;
};

bool holds_first_element(const ShardedTensor& st) {
  for (size_t axis = static_cast<size_t>(st.prepend_axis_num); axis < st.global_offset.size(); ++axis) {
    if (st.global_offset[axis] != 0) return false;
  }
  return true;
}

ScalarPlacement placement_of(const ShardedTensor& st, bool writer) {
  const auto p = static_cast<size_t>(st.prepend_axis_num);
  ScalarPlacement placement;
  placement.global_shape.assign(st.global_shape.begin(), st.global_shape.begin() + p);
  placement.global_offset.assign(st.global_offset.begin(), st.global_offset.begin() + p);
  placement.global_shape.push_back(1);
  placement.global_offset.push_back(0);
  placement.prepend_axis_num = st.prepend_axis_num;
  placement.writer = writer;
  return placement;
}

ScalarPlacement scalar_placement(const Value& model_param) {
  if (model_param.kind() == Kind::kShardedTensor) {
    const ShardedTensor& st = model_param.as_sharded_tensor();
    const bool first =
        st.is_main_replica() && holds_first_element(st) && (!st.flattened_range || st.flattened_range->start == 0);
    return placement_of(st, first);
  }
  // A factory decides its placement in build: its parts sit at the offsets
  // of the whole, so the first element is held where every part starts at 0.
  const ShardedTensorFactory& factory = model_param.as_factory();
  const std::vector<const Value*> parts = nested_values(factory.build_subtree());
  const ShardedTensor* first_part = nullptr;
  bool all_at_start = true;
  for (const Value* part : parts) {
    if (part->kind() != Kind::kShardedTensor) continue;
    if (first_part == nullptr) first_part = &part->as_sharded_tensor();
    all_at_start = all_at_start && holds_first_element(part->as_sharded_tensor());
  }
  if (first_part == nullptr) {
    throw ShardingError(
        fmt::format("the factory of '{}' builds no ShardedTensor, so the placement of its "
                    "optimizer scalars (such as \"step\") cannot be derived",
                    factory.key));
  }
  const bool first = is_main_replica(factory.replica_id) && all_at_start &&
                     (!factory.flattened_range || factory.flattened_range->start == 0);
  return placement_of(*first_part, first);
}

Value make_sharded_scalar_state(const Value& model_param, const Value& scalar, const std::string& prefix) {
  const std::string model_key =
      model_param.kind() == Kind::kShardedTensor ? model_param.as_sharded_tensor().key : model_param.as_factory().key;
  const ScalarPlacement where = scalar_placement(model_param);
  ShardedTensor st =
      ShardedTensor::from_global_offset(prefix + "." + model_key, scalar_tensor(scalar), where.global_shape,
                                        where.global_offset, ReplicaId{where.writer ? 0 : 1}, where.prepend_axis_num);
  return Value(std::move(st));
}

}  // namespace

std::map<const c10::TensorImpl*, int64_t> get_optim_param_to_id_map(const std::vector<at::Tensor>& optimizer_params) {
  std::map<const c10::TensorImpl*, int64_t> by_impl;
  for (size_t i = 0; i < optimizer_params.size(); ++i) {
    if (optimizer_params[i].defined())
      by_impl.emplace(optimizer_params[i].unsafeGetTensorImpl(), static_cast<int64_t>(i));
  }
  return by_impl;
}

std::map<int64_t, Value> param_id_to_sharded_param(const StateDict& model_sharded_state_dict,
                                                   const std::vector<at::Tensor>& optimizer_params) {
  // Index the optimizer's parameters once (O(n log n)) instead of comparing
  // every model entry with every parameter. A parameter listed twice keeps its
  // first id, the one PyTorch's state dict would use.
  const std::map<const c10::TensorImpl*, int64_t> by_impl = get_optim_param_to_id_map(optimizer_params);
  std::map<ViewKey, int64_t> by_view;
  for (size_t i = 0; i < optimizer_params.size(); ++i) {
    const at::Tensor& p = optimizer_params[i];
    if (!p.defined()) continue;
    if (auto key = view_key(p)) by_view.emplace(std::move(*key), static_cast<int64_t>(i));
  }

  std::map<int64_t, Value> result;
  for (const Value* leaf : nested_values(model_sharded_state_dict)) {
    const at::Tensor* data = nullptr;
    if (leaf->kind() == Kind::kShardedTensor) data = &leaf->as_sharded_tensor().data;
    if (leaf->kind() == Kind::kFactory) data = &leaf->as_factory().data;
    if (data == nullptr || !data->defined()) continue;  // objects, plain values, metadata only

    std::optional<int64_t> id;
    if (auto it = by_impl.find(data->unsafeGetTensorImpl()); it != by_impl.end()) {
      id = it->second;
    } else if (auto key = view_key(*data)) {
      if (auto v = by_view.find(*key); v != by_view.end()) id = v->second;
    }
    // Not every model entry is optimized (buffers, frozen weights): skip those.
    // Assignment, not emplace: a later entry of a tied parameter wins, as in Megatron.
    if (id) result[*id] = *leaf;
  }
  if (result.empty() && !optimizer_params.empty()) {
    log_message(LogLevel::kWarning,
                fmt::format("param_id_to_sharded_param: none of the optimizer's {} parameters is held by the model "
                            "sharded state dict (matched by identity, not value); the optimizer state cannot be "
                            "sharded. Build the optimizer over the model's own parameter tensors",
                            optimizer_params.size()));
  }
  return result;
}

Value make_sharded_optimizer_tensor(const Value& model_param, const at::Tensor& optimizer_tensor,
                                    const std::string& prefix) {
  if (model_param.kind() == Kind::kShardedTensor) {
    ShardedTensor st = model_param.as_sharded_tensor();
    const std::string key = prefix + "." + st.key;
    if (!optimizer_tensor.defined()) {
      throw ShardingError(fmt::format("optimizer tensor '{}' is undefined", key));
    }
    check_shape(st.key, expected_shape(st), key, optimizer_tensor);
    st.key = key;
    st.data = optimizer_tensor;
    // Optimizer state often has its own precision (fp32 moments of bf16 weights).
    st.dtype = optimizer_tensor.scalar_type();
    st.validate_metadata_integrity();
    return Value(std::move(st));
  }
  if (model_param.kind() == Kind::kFactory) {
    // The factory's build already knows how this parameter is laid out (fused
    // parts, narrowing); it takes the key as an argument, so the copy builds
    // the optimizer tensor's entries under the new key, and merge reassembles it.
    ShardedTensorFactory factory = model_param.as_factory();
    const std::string key = prefix + "." + factory.key;
    if (!optimizer_tensor.defined()) {
      throw ShardingError(fmt::format("optimizer tensor '{}' is undefined", key));
    }
    if (factory.data.defined()) check_shape(factory.key, shape_of(factory.data), key, optimizer_tensor);
    factory.key = key;
    factory.data = optimizer_tensor;
    return Value(std::move(factory));
  }
  throw UsageError(
      fmt::format("make_sharded_optimizer_tensor(prefix '{}'): the model entry is a {}, but only a "
                  "ShardedTensor or a ShardedTensorFactory describes how a parameter is sharded",
                  prefix, kind_name(model_param.kind())));
}

void optim_state_to_sharding_state(Value& optim_state_dict, const std::map<int64_t, Value>& id_to_sharded_param,
                                   const std::set<std::string>& exclude_keys) {
  if (!optim_state_dict.is_dict() || !optim_state_dict.contains("state") || !optim_state_dict.at("state").is_dict()) {
    throw UsageError(
        "optim_state_to_sharding_state needs a PyTorch-format optimizer state dict: a dict whose "
        "\"state\" entry is a dict of per-parameter states keyed by param id");
  }
  // Convert a copy (tensors are shared, not cloned) and swap it in at the
  // end, so an error leaves the caller's state dict as it was.
  Dict converted = optim_state_dict.at("state").as_dict();
  for (auto& [id_text, param_state] : converted) {
    const int64_t id = parse_param_id(id_text);
    const auto model = id_to_sharded_param.find(id);
    if (model == id_to_sharded_param.end()) {
      throw UsageError(
          fmt::format("optimizer state of param id {} matches no sharded parameter of the model (ids with "
                      "one: {}); build the map with param_id_to_sharded_param over the optimizer's "
                      "parameters, and make sure the model sharded state dict holds every optimized tensor",
                      id, known_ids(id_to_sharded_param)));
    }
    if (!param_state.is_dict()) {
      throw UsageError(fmt::format("optimizer state of param id {} is a {}, expected a dict of named values", id,
                                   kind_name(param_state.kind())));
    }
    Dict& named = param_state.as_dict();
    for (auto it = named.begin(); it != named.end();) {
      if (exclude_keys.count(it->first) != 0) {
        it = named.erase(it);
        continue;
      }
      const std::string prefix = "optimizer.state." + it->first;
      if (is_scalar_state(it->second, model->second)) {
        // Not common state: that is the coordinator's alone, and under
        // pipeline parallelism the other stages' parameters have other ids.
        it->second = make_sharded_scalar_state(model->second, it->second, prefix);
      } else if (it->second.kind() == Kind::kTensor) {
        it->second = make_sharded_optimizer_tensor(model->second, it->second.as_tensor(), prefix);
      } else {
        throw UsageError(fmt::format(
            "optimizer state of param id {} holds \"{}\", a {}: per-parameter state is saved as tensors sharded like "
            "the parameter or as scalars; convert it, or leave it out with exclude_keys",
            id, it->first, kind_name(it->second.kind())));
      }
      ++it;
    }
  }
  std::optional<Value> groups;
  if (optim_state_dict.contains("param_groups")) {
    groups = optim_state_dict.at("param_groups");
    if (!groups->is_list()) {
      throw UsageError(fmt::format("optim_state_to_sharding_state: \"param_groups\" is a {}, expected a list of dicts",
                                   kind_name(groups->kind())));
    }
    for (Value& group : groups->as_list()) {
      if (group.is_dict() && group.contains("params")) {
        group.at("params") = Value(LocalNonPersistentObject(group.at("params")));
      }
    }
  }
  optim_state_dict.at("state") = Value(std::move(converted));
  if (groups) optim_state_dict.at("param_groups") = std::move(*groups);
}

}  // namespace distckpt
