// Megatron-Core's optimizer.py helpers: find the model's sharded entry of each
// optimizer parameter and shard the optimizer's state like it.
#include "distckpt/optim/optimizer_state.h"

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
    throw Error(
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
  throw Error(
      fmt::format("make_sharded_optimizer_tensor(prefix '{}'): the model entry is a {}, but only a "
                  "ShardedTensor or a ShardedTensorFactory describes how a parameter is sharded",
                  prefix, kind_name(model_param.kind())));
}

void optim_state_to_sharding_state(Value& optim_state_dict, const std::map<int64_t, Value>& id_to_sharded_param,
                                   const std::set<std::string>& exclude_keys) {
  if (!optim_state_dict.is_dict() || !optim_state_dict.contains("state") || !optim_state_dict.at("state").is_dict()) {
    throw Error(
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
      throw Error(
          fmt::format("optimizer state of param id {} matches no sharded parameter of the model (ids with "
                      "one: {}); build the map with param_id_to_sharded_param over the optimizer's "
                      "parameters, and make sure the model sharded state dict holds every optimized tensor",
                      id, known_ids(id_to_sharded_param)));
    }
    if (!param_state.is_dict()) {
      throw Error(fmt::format("optimizer state of param id {} is a {}, expected a dict of named values", id,
                              kind_name(param_state.kind())));
    }
    Dict& named = param_state.as_dict();
    for (auto it = named.begin(); it != named.end();) {
      if (exclude_keys.count(it->first) != 0) {
        it = named.erase(it);
        continue;
      }
      // Scalars such as "step" have no sharding: they stay common state.
      if (it->second.kind() == Kind::kTensor) {
        it->second =
            make_sharded_optimizer_tensor(model->second, it->second.as_tensor(), "optimizer.state." + it->first);
      }
      ++it;
    }
  }
  std::optional<Value> groups;
  if (optim_state_dict.contains("param_groups")) {
    groups = optim_state_dict.at("param_groups");
    if (!groups->is_list()) {
      throw Error(fmt::format("optim_state_to_sharding_state: \"param_groups\" is a {}, expected a list of dicts",
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
