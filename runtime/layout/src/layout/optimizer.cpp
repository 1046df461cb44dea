#include "distckpt/layout/optimizer.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "distckpt/core/errors.h"

namespace distckpt::layout {
namespace {

constexpr const char* kPrefix = "optimizer.state";

// Optimizer parameter id -> model slot, by tensor identity.
std::vector<size_t> slots_of(const Builder& model, const std::vector<at::Tensor>& params) {
  std::unordered_map<const void*, size_t> by_impl;
  for (size_t s = 0; s < model.tensor_slot_count(); ++s) {
    if (model.bound_tensor(s).defined()) by_impl.emplace(model.bound_tensor(s).unsafeGetTensorImpl(), s);
  }
  std::vector<size_t> slots;
  for (size_t id = 0; id < params.size(); ++id) {
    auto it = by_impl.find(params[id].unsafeGetTensorImpl());
    if (it == by_impl.end()) {
      throw UsageError(
          fmt::format("optimizer parameter {} (shape {}) is not bound to the layout: bind the module's "
                      "parameters to the model before asking for its optimizer state",
                      id, to_string(Shape(params[id].sizes().begin(), params[id].sizes().end()))));
    }
    slots.push_back(it->second);
  }
  return slots;
}

// Per optimizer parameter id, the state tensors saved and loaded for it: the
// schema's, plus max_exp_avg_sq where its param group has amsgrad on.
// PyTorch keeps amsgrad per group, so groups may differ.
std::vector<std::vector<std::string>> state_names_by_id(const OptimizerSpec& spec, const StateDict& torch_state,
                                                        size_t param_count) {
  std::vector<std::vector<std::string>> names(param_count, spec.states);
  const Value& groups = torch_state.at("param_groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const Value& group = groups[g];
    if (!group.contains("amsgrad") || !group.at("amsgrad").as_bool()) continue;
    if (!group.contains("params")) {
      throw UsageError(
          fmt::format("optimizer state dict: param group {} has amsgrad on but no \"params\" list, so its "
                      "parameters cannot be told apart from the other groups'",
                      g));
    }
    for (const Value& id : group.at("params").as_list()) {
      if (id.as_int() < 0 || static_cast<uint64_t>(id.as_int()) >= param_count) {
        throw UsageError(
            fmt::format("optimizer state dict: param group {} lists param id {}, but the optimizer's "
                        "parameters are ids 0 to {}",
                        g, id.as_int(), static_cast<int64_t>(param_count) - 1));
      }
      names[static_cast<size_t>(id.as_int())].push_back("max_exp_avg_sq");
    }
  }
  return names;
}

}  // namespace

const Distribution* OptimizerSpec::distribution_of(int mesh) const {
  for (const Distribution& d : distributed) {
    if (d.mesh == mesh) return &d;
  }
  return nullptr;
}

StateDict sharded_optimizer_state(const Builder& model, const OptimizerSpec& spec, const StateDict& torch_state,
                                  const std::vector<at::Tensor>& params) {
  const std::vector<size_t> slots = slots_of(model, params);
  // Each distribution's ranges cover only the slots of its own mesh.
  std::vector<std::optional<FlatRange>> owned(model.tensor_slot_count());
  for (const Distribution& d : spec.distributed) {
    const std::vector<std::optional<FlatRange>> ranges = model.distributed_ranges(d);
    for (size_t slot = 0; slot < owned.size(); ++slot) {
      if (ranges[slot]) owned[slot] = ranges[slot];
    }
  }
  // Exactly what a load asks for is saved: a state the schema does not
  // declare would be written but never restored.
  const std::vector<std::vector<std::string>> names_by_id = state_names_by_id(spec, torch_state, params.size());
  Value state = Value::dict();
  std::optional<int64_t> step;
  for (const auto& [id_text, param_state] : torch_state.at("state").as_dict()) {
    const size_t id = std::stoul(id_text);
    const size_t slot = slots.at(id);
    const std::vector<std::string>& names = names_by_id.at(id);
    for (const std::string& name : spec.states) {
      if (!param_state.contains(name)) {
        throw UsageError(
            fmt::format("the schema's optimizer {} declares state '{}' but the optimizer has none for '{}'", spec.name,
                        name, model.parameter_name(slot)));
      }
    }
    // A parameter with nothing of this rank's to save (ZeRO: another rank owns
    // all of it) is left out, not left as None, which the common state check
    // would see differ from the ranks that do save it.
    Value entries = Value::dict();
    for (const auto& [name, value] : param_state.as_dict()) {
      if (value.kind() != Kind::kTensor) {
        if (name == "step") {
          if (step && *step != value.as_int()) {
            throw UsageError(
                fmt::format("optimizer parameters are at different steps ({} and {}); save after a full step", *step,
                            value.as_int()));
          }
          step = value.as_int();
        }
        continue;
      }
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        throw UsageError(
            fmt::format("the optimizer has state '{}' for '{}', which the schema's optimizer {} does not "
                        "declare, so a load would not restore it; add it to its `state` line",
                        name, model.parameter_name(slot), spec.name));
      }
      const std::string prefix = std::string(kPrefix) + "." + name;
      const Distribution* distribution = spec.distribution_of(model.slot_mesh(slot));
      if (distribution == nullptr) {
        entries[name] = model.derived_entry(slot, prefix, value.as_tensor(), std::nullopt, nullptr);
      } else if (owned[slot]) {  // ZeRO-1: only the owned flat range, no gathering
        const FlatRange r = *owned[slot];
        entries[name] =
            model.derived_entry(slot, prefix, value.as_tensor().reshape(-1).slice(0, r.start, r.stop), r, distribution);
      }
    }
    if (entries.size() > 0) state[model.parameter_name(slot)] = std::move(entries);
  }
  StateDict out = Value::dict();
  Value& optimizer = out["optimizer"];
  optimizer["state"] = std::move(state);
  optimizer["step"] = step.value_or(0);
  optimizer["param_groups"] = torch_state.at("param_groups");
  return out;
}

StateDict optimizer_load_request(const Builder& model, const OptimizerSpec& spec, const StateDict& torch_state,
                                 const std::vector<at::Tensor>& params) {
  const std::vector<size_t> slots = slots_of(model, params);
  const std::vector<std::vector<std::string>> names_by_id = state_names_by_id(spec, torch_state, params.size());
  Value state = Value::dict();
  for (size_t id = 0; id < params.size(); ++id) {
    const size_t slot = slots[id];
    const at::Tensor& param = params[id];
    Value& entries = state[model.parameter_name(slot)];
    for (const std::string& name : names_by_id[id]) {
      entries[name] =
          model.derived_entry(slot, std::string(kPrefix) + "." + name,
                              at::empty(param.sizes(), param.options().requires_grad(false)), std::nullopt, nullptr);
    }
  }
  StateDict out = Value::dict();
  out["optimizer"]["state"] = std::move(state);
  return out;
}

StateDict torch_optimizer_state(const Builder& model, const OptimizerSpec& spec, const Value& loaded,
                                const std::vector<at::Tensor>& params, const StateDict& current) {
  const std::vector<size_t> slots = slots_of(model, params);
  const Value& state = loaded.at("state");
  StateDict out = Value::dict();
  Value& torch_state = out["state"];
  torch_state = Value::dict();
  for (size_t id = 0; id < params.size(); ++id) {
    const std::string& name = model.parameter_name(slots[id]);
    if (!state.contains(name)) {
      throw UsageError(fmt::format("the loaded optimizer {} state has nothing for parameter '{}'", spec.name, name));
    }
    Value& entry = torch_state[std::to_string(id)];
    for (const auto& [state_name, tensor] : state.at(name).as_dict()) entry[state_name] = tensor;
    entry["step"] = loaded.at("step").as_int();
  }
  out["param_groups"] = current.at("param_groups");
  return out;
}

}  // namespace distckpt::layout
