// PyTorch-format state dicts for LibTorch's Adam and AdamW. Both optimizers
// have the same options and per-parameter state, so one template serves both.
#include "distckpt/optim/torch_optim.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <charconv>
#include <optional>
#include <sstream>
#include <type_traits>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

// Megatron's single step for every parameter (saved with exclude_keys={"step"}).
constexpr const char* kCommonStep = "common_step";

// The key of a parameter in Optimizer::state(). LibTorch 1.x keys the map by
// the printed TensorImpl address (c10::guts::to_string, an ostringstream),
// LibTorch 2.x by the address itself; the map's key type says which.
template <typename StateMap>
typename StateMap::key_type state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

std::string shape_str(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

// A named entry of a dict in the state dict, with a message saying where it was expected.
const Value& field(const Value& dict, const std::string& name, const std::string& where) {
  if (!dict.is_dict() || !dict.contains(name)) {
    throw UsageError(fmt::format("optimizer state dict: {} has no \"{}\" entry", where, name));
  }
  return dict.at(name);
}

int64_t parse_id(const std::string& text) {
  int64_t id = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, id);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw UsageError(fmt::format("optimizer state dict: state key '{}' is not a param id", text));
  }
  return id;
}

// PyTorch >= 1.12 saves "step" as a one-element tensor; distckpt saves an int.
int64_t read_step(const Value& step, int64_t id) {
  if (step.kind() == Kind::kTensor && step.as_tensor().numel() == 1) return step.as_tensor().item<int64_t>();
  if (step.kind() == Kind::kInt) return step.as_int();
  throw UsageError(fmt::format("optimizer state dict: \"step\" of param id {} is a {}, expected an int", id,
                               kind_name(step.kind())));
}

// Hyper-parameters of one group, read and checked before anything is changed.
struct GroupHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

template <typename Optimizer, typename Options, typename ParamState>
StateDict state_dict_of(const Optimizer& opt) {
  using StateMap = std::decay_t<decltype(opt.state())>;
  Dict state;
  List groups;
  int64_t next_id = 0;  // ids run over all groups, as in PyTorch
  for (const auto& group : opt.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    List ids;
    for (const at::Tensor& param : group.params()) {
      const int64_t id = next_id++;
      ids.push_back(id);
      const auto it = opt.state().find(state_key<StateMap>(param));
      if (it == opt.state().end()) continue;  // not stepped yet: no state, like PyTorch
      const auto& s = static_cast<const ParamState&>(*it->second);
      Value entry = Value::dict();
      entry["step"] = s.step();
      entry["exp_avg"] = s.exp_avg();
      entry["exp_avg_sq"] = s.exp_avg_sq();
      if (options.amsgrad() && s.max_exp_avg_sq().defined()) entry["max_exp_avg_sq"] = s.max_exp_avg_sq();
      state[std::to_string(id)] = std::move(entry);
    }
    Value g = Value::dict();
    g["lr"] = options.lr();
    g["betas"] = List{Value(std::get<0>(options.betas())), Value(std::get<1>(options.betas()))};
    g["eps"] = options.eps();
    g["weight_decay"] = options.weight_decay();
    g["amsgrad"] = options.amsgrad();
    g["params"] = Value(std::move(ids));
    groups.push_back(std::move(g));
  }
  StateDict sd = Value::dict();
  sd["state"] = Value(std::move(state));
  sd["param_groups"] = Value(std::move(groups));
  return sd;
}

// A state tensor laid out like its parameter (the way LibTorch creates state:
// zeros_like(param, Preserve)), shape checked.
at::Tensor restore_tensor(const Value& entry, const std::string& name, const at::Tensor& param, int64_t id) {
  const std::string where =
      fmt::format("the state of param id {}", id);  // named: no temporary beside a returned reference
  const Value& v = field(entry, name, where);
  if (v.kind() != Kind::kTensor) {
    throw UsageError(fmt::format("optimizer state dict: \"{}\" of param id {} is a {}, expected a tensor", name, id,
                                 kind_name(v.kind())));
  }
  const at::Tensor& src = v.as_tensor();
  if (!src.sizes().equals(param.sizes())) {
    throw UsageError(
        fmt::format("optimizer state dict: \"{}\" of param id {} has shape {} but the parameter has shape {}; "
                    "was the state saved for a different model or parallel layout?",
                    name, id, shape_str(src), shape_str(param)));
  }
  // Like PyTorch (value.to(param's dtype and device)): a tensor that already
  // matches is adopted, not copied, so loading state costs no second copy.
  if (src.scalar_type() == param.scalar_type() && src.device() == param.device() && src.strides() == param.strides() &&
      !src.requires_grad()) {
    return src;
  }
  at::NoGradGuard no_grad;
  return at::empty_like(param, at::MemoryFormat::Preserve).copy_(src);
}

template <typename Optimizer, typename Options, typename ParamState>
void load_into(Optimizer& opt, const StateDict& sd) {
  using StateMap = std::decay_t<decltype(opt.state())>;
  auto& groups = opt.param_groups();
  const std::string root = "the root";
  const Value& saved_groups = field(sd, "param_groups", root);
  if (!saved_groups.is_list() || saved_groups.size() != groups.size()) {
    throw UsageError(fmt::format("optimizer state dict has {} param groups but the optimizer has {}",
                                 saved_groups.is_list() ? fmt::to_string(saved_groups.size()) : "no list of",
                                 groups.size()));
  }

  // Pass 1: match saved ids to parameters by position (PyTorch's rule), check
  // the groups and read their hyper-parameters; nothing changes yet.
  std::map<int64_t, std::pair<const at::Tensor*, bool /*amsgrad*/>> params_by_id;
  std::vector<GroupHyper> hyper;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Value& saved = saved_groups[g];
    const std::string where = fmt::format("param group {}", g);
    const Value& ids = field(saved, "params", where);
    const auto& params = groups[g].params();
    if (!ids.is_list() || ids.size() != params.size()) {
      throw UsageError(
          fmt::format("optimizer state dict: param group {} has {} params but the optimizer's group has {}", g,
                      ids.is_list() ? fmt::to_string(ids.size()) : "no list of", params.size()));
    }
    const auto& options = static_cast<const Options&>(groups[g].options());
    const bool amsgrad = field(saved, "amsgrad", where).as_bool();
    if (amsgrad != options.amsgrad()) {
      throw UsageError(
          fmt::format("optimizer state dict: param group {} was saved with amsgrad={} but the optimizer's group has "
                      "amsgrad={}; the max_exp_avg_sq state exists only with amsgrad, so both must agree",
                      g, amsgrad, options.amsgrad()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t id = ids[i].as_int();
      if (!params_by_id.emplace(id, std::make_pair(&params[i], amsgrad)).second) {
        throw UsageError(fmt::format("optimizer state dict: param id {} is listed twice in \"param_groups\"", id));
      }
    }
    const Value& betas = field(saved, "betas", where);
    if (!betas.is_list() || betas.size() != 2) {
      throw UsageError(fmt::format("optimizer state dict: \"betas\" of param group {} must be a list of 2 floats", g));
    }
    hyper.push_back({field(saved, "lr", where).as_float(), betas[0].as_float(), betas[1].as_float(),
                     field(saved, "eps", where).as_float(), field(saved, "weight_decay", where).as_float()});
  }

  // Pass 2: build the new per-parameter states, still without touching the optimizer.
  std::vector<std::pair<typename StateMap::key_type, std::unique_ptr<ParamState>>> restored;
  const Value& state = field(sd, "state", root);
  if (!state.is_dict()) throw UsageError("optimizer state dict: \"state\" must be a dict keyed by param id");
  // Megatron's idiom: steps excluded per parameter, one common step instead.
  std::optional<int64_t> common_step;
  if (state.contains(kCommonStep)) common_step = read_step(state.at(kCommonStep), -1);
  for (const auto& [id_text, entry] : state.as_dict()) {
    if (id_text == kCommonStep) continue;
    const int64_t id = parse_id(id_text);
    const auto found = params_by_id.find(id);
    // State of an id no group lists belongs to no parameter here; PyTorch
    // keeps it unused.
    if (found == params_by_id.end()) continue;
    const at::Tensor& param = *found->second.first;
    const bool amsgrad = found->second.second;
    auto s = std::make_unique<ParamState>();
    if (entry.is_dict() && !entry.contains("step") && common_step) {
      s->step(*common_step);
    } else {
      s->step(read_step(field(entry, "step", fmt::format("the state of param id {}", id)), id));
    }
    s->exp_avg(restore_tensor(entry, "exp_avg", param, id));
    s->exp_avg_sq(restore_tensor(entry, "exp_avg_sq", param, id));
    if (amsgrad) {
      s->max_exp_avg_sq(restore_tensor(entry, "max_exp_avg_sq", param, id));
    } else if (entry.contains("max_exp_avg_sq")) {
      throw UsageError(
          fmt::format("optimizer state dict: param id {} has \"max_exp_avg_sq\" but its group has amsgrad=false", id));
    }
    restored.emplace_back(state_key<StateMap>(param), std::move(s));
  }

  // Pass 3: everything checked; replace the state (like PyTorch's
  // load_state_dict, parameters without saved state start afresh) and options.
  opt.state().clear();
  for (auto& [key, s] : restored) opt.state()[key] = std::move(s);
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& options = static_cast<Options&>(groups[g].options());
    options.lr(hyper[g].lr);
    options.betas(std::make_tuple(hyper[g].beta1, hyper[g].beta2));
    options.eps(hyper[g].eps);
    options.weight_decay(hyper[g].weight_decay);
  }
}

}  // namespace

StateDict optimizer_state_dict(const torch::optim::Adam& opt) {
  return state_dict_of<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(opt);
}

StateDict optimizer_state_dict(const torch::optim::AdamW& opt) {
  return state_dict_of<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt);
}

void load_optimizer_state_dict(torch::optim::Adam& opt, const StateDict& state_dict) {
  load_into<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(opt, state_dict);
}

void load_optimizer_state_dict(torch::optim::AdamW& opt, const StateDict& state_dict) {
  load_into<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt, state_dict);
}

}  // namespace distckpt
