// Optimizer blocks: the states and scalar of LibTorch's Adam and AdamW, which
// the generated class restores, and ZeRO groups over axes the mesh's tensors
// are replicated on.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "check/checker_context.h"
#include "check/names.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {
namespace {

// A tensor with the mesh axes that split or place it: its splits, its
// stacks' axes, the stage axis of stage(first|last).
struct PlacedTensor {
  const TensorDecl* decl;
  std::string key;
  std::vector<std::pair<int, const char*>> axes;  // (axis, how: "split over")
};

void collect_placed(const Block& block, const std::string& prefix,
                    const std::vector<std::pair<int, const char*>>& enclosing, std::vector<PlacedTensor>& out) {
  for (const TensorDecl& t : block.tensors) {
    PlacedTensor placed{&t, prefix + t.key, enclosing};
    for (const Split& split : t.splits) {
      for (const int axis : split.axes) placed.axes.emplace_back(axis, "split over");
    }
    if (t.stage != Stage::kAll && t.stage_axis >= 0) placed.axes.emplace_back(t.stage_axis, "placed by stage() on");
    out.push_back(std::move(placed));
  }
  for (const auto& stack : block.stacks) {
    std::vector<std::pair<int, const char*>> axes = enclosing;
    if (stack->axis >= 0) axes.emplace_back(stack->axis, "stacked over");
    if (stack->stage != Stage::kAll && stack->stage_axis >= 0)
      axes.emplace_back(stack->stage_axis, "placed by stage() on");
    collect_placed(stack->body, prefix + stack->key + ".", axes, out);
  }
}

// LibTorch's Adam and AdamW, which the generated optimizer class saves and
// restores, keep these per-parameter tensors and this one scalar.
// (max_exp_avg_sq, under amsgrad, is saved without being declared.)
constexpr std::array<std::string_view, 2> kAdamStates = {"exp_avg", "exp_avg_sq"};
constexpr std::string_view kAdamScalar = "step";

// A ZeRO group shards state that its ranks hold identical copies of: an axis
// that splits or places a tensor of the mesh would give ranks holding
// different parts one flat partition, and half the state would be lost.
void check_distributed_axis(CheckContext& ctx, const ast::Name& axis_name, int axis, int mesh,
                            const std::vector<PlacedTensor>& placed) {
  for (const PlacedTensor& t : placed) {
    if (t.decl->mesh != mesh) continue;
    for (const auto& [placing, how] : t.axes) {
      if (placing != axis) continue;
      ctx.diag
          .error(axis_name.loc,
                 fmt::format("the distributed optimizer cannot shard over '{}': tensor '{}' is {} it, so ranks "
                             "along '{}' hold different parts of it; distribute over axes the tensors are "
                             "replicated on (dp, cp)",
                             axis_name.text, t.key, how, axis_name.text))
          .note(t.decl->loc, "tensor declared here");
      return;
    }
  }
}

// Flat ranges of a fused tensor cut across its parts unless they are
// stacked along dim 0 (layout::fused_build).
void check_fused_distributed(CheckContext& ctx, const OptimizerDecl& decl, const std::vector<PlacedTensor>& placed) {
  for (const OptimizerDecl::Distribution& d : decl.distributions) {
    for (const PlacedTensor& t : placed) {
      if (t.decl->mesh != d.mesh || t.decl->fused.empty() || t.decl->splits.empty() || t.decl->splits[0].dim == 0) {
        continue;
      }
      ctx.diag
          .error(t.decl->loc, fmt::format("tensor '{}' is fused along dim {}, but optimizer '{}' distributes its state "
                                          "in flat ranges, which need the parts along dim 0; split it on dim 0 or "
                                          "keep its mesh's state whole",
                                          t.key, t.decl->splits[0].dim, decl.name))
          .note(d.loc, "distributed here");
    }
  }
}

}  // namespace

void check_optimizers(CheckContext& ctx, const ast::Schema& schema) {
  std::vector<PlacedTensor> placed;
  collect_placed(ctx.layout.body, "", {}, placed);
  std::unordered_map<std::string, Loc> optimizers;
  for (const ast::Item& item : schema.items) {
    const auto* optimizer = std::get_if<ast::Optimizer>(&item);
    if (optimizer == nullptr) continue;
    const ast::Name& name = optimizer->name;
    const auto [it, fresh] = optimizers.emplace(name.text, name.loc);
    if (!fresh) {
      ctx.diag.error(name.loc, fmt::format("duplicate optimizer '{}'", name.text))
          .note(it->second, "first declared here");
    }
    OptimizerDecl decl;
    decl.name = name.text;
    decl.class_name = class_name(name.text);
    decl.loc = name.loc;
    // States and scalars become members of one generated struct: one namespace.
    std::unordered_map<std::string, Loc> members;
    const auto declare = [&](const ast::Name& member, std::vector<std::string>& into) {
      const auto [at, is_new] = members.emplace(member.text, member.loc);
      if (!is_new) {
        ctx.diag
            .error(member.loc,
                   fmt::format("duplicate name '{}' in optimizer '{}'; state and scalar names must be unique",
                               member.text, name.text))
            .note(at->second, "first declared here");
        return;
      }
      into.push_back(member.text);
    };
    for (const ast::Name& state : optimizer->states) {
      if (state.text == "max_exp_avg_sq") {
        ctx.diag.error(state.loc, fmt::format("optimizer '{}': max_exp_avg_sq is saved whenever amsgrad is on; "
                                              "leave it out of the state line",
                                              name.text));
        continue;
      }
      if (std::find(kAdamStates.begin(), kAdamStates.end(), state.text) == kAdamStates.end()) {
        ctx.diag.error(
            state.loc,
            fmt::format("optimizer '{}' has no state '{}': the generated class restores "
                        "LibTorch's Adam and AdamW, whose state is exp_avg and exp_avg_sq "
                        "(max_exp_avg_sq under amsgrad){}",
                        name.text, state.text,
                        did_you_mean(state.text, std::vector<std::string>(kAdamStates.begin(), kAdamStates.end()))));
        continue;
      }
      declare(state, decl.states);
    }
    for (const ast::Name& scalar : optimizer->scalars) {
      if (scalar.text != kAdamScalar) {
        ctx.diag.error(scalar.loc, fmt::format("optimizer '{}' has no scalar '{}': LibTorch's Adam and AdamW keep "
                                               "one, 'step'",
                                               name.text, scalar.text));
        continue;
      }
      declare(scalar, decl.scalars);
    }
    // ZeRO-1 per mesh: each mesh has its own data-parallel group.
    std::map<int, Loc> distributed_meshes;
    for (const ast::Optimizer::Distributed& d : optimizer->distributed) {
      OptimizerDecl::Distribution dist;
      dist.loc = d.loc;
      if (d.mesh) {
        const std::optional<int> mesh = ctx.resolve_mesh(*d.mesh);
        if (!mesh) continue;
        dist.mesh = *mesh;
      }
      const auto [first, fresh] = distributed_meshes.emplace(dist.mesh, d.loc);
      if (!fresh) {
        const std::string mesh = ctx.layout.meshes.empty() ? "default" : ctx.layout.meshes[dist.mesh].name;
        ctx.diag
            .error(d.loc, fmt::format("optimizer '{}' has more than one 'distributed over' line for mesh {}; each "
                                      "mesh's state is distributed over one group (join axes with '*')",
                                      name.text, mesh))
            .note(first->second, "first given here");
        continue;
      }
      std::map<int, Loc> seen;
      for (const ast::Name& axis_name : d.axes) {
        const std::optional<int> axis = ctx.resolve_axis(axis_name);
        if (!axis || !ctx.check_axis_on_mesh(*axis, dist.mesh, axis_name.loc, "the distributed optimizer")) continue;
        check_distributed_axis(ctx, axis_name, *axis, dist.mesh, placed);
        const auto [at, is_new] = seen.emplace(*axis, axis_name.loc);
        if (!is_new) {
          ctx.diag
              .error(axis_name.loc, fmt::format("mesh axis '{}' appears twice in 'distributed over'", axis_name.text))
              .note(at->second, "first given here");
          continue;
        }
        dist.axes.push_back(*axis);
      }
      if (d.instances) {
        dist.instances = ctx.resolve(*d.instances);
        if (dist.instances) ctx.check_extent(*dist.instances, "the number of distributed optimizer instances");
      }
      decl.distributions.push_back(std::move(dist));
    }
    check_fused_distributed(ctx, decl, placed);
    ctx.layout.optimizers.push_back(std::move(decl));
  }
}

}  // namespace distckpt::gen
