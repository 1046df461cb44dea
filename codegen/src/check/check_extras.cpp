// Common values, transient entries and optimizers: the declarations outside
// the tensor blocks.
#include <fmt/format.h>

#include <map>
#include <unordered_map>

#include "check/checker_context.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {

void check_commons_and_transients(CheckContext& ctx, const ast::Schema& schema) {
  // Keys share the state dict with tensors and objects (claim_key); their
  // setters are members of Model (check_member_names).
  for (const ast::Item& item : schema.items) {
    if (const auto* common = std::get_if<ast::Common>(&item)) {
      CommonDecl decl{common->key.text, common->type, accessor_name(common->key.text), common->key.loc};
      ctx.claim_key(decl.key, KeyUse{decl.loc, {}, false, false, 0});
      ctx.layout.commons.push_back(std::move(decl));
    } else if (const auto* transient = std::get_if<ast::Transient>(&item)) {
      TransientDecl decl{transient->key.text, accessor_name(transient->key.text), transient->key.loc};
      ctx.claim_key(decl.key, KeyUse{decl.loc, {}, false, false, 0});
      ctx.layout.transients.push_back(std::move(decl));
    }
  }
}

void check_optimizers(CheckContext& ctx, const ast::Schema& schema) {
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
    for (const ast::Name& state : optimizer->states) declare(state, decl.states);
    for (const ast::Name& scalar : optimizer->scalars) declare(scalar, decl.scalars);
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
    ctx.layout.optimizers.push_back(std::move(decl));
  }
}

}  // namespace distckpt::gen
