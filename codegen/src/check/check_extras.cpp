// Common values, transient entries and optimizers: the declarations outside
// the tensor blocks.
#include <fmt/format.h>

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
    for (size_t i = 0; i < optimizer->distributed_axes.size(); ++i) {
      const ast::Name& axis = optimizer->distributed_axes[i];
      if (i > 0) {
        ctx.diag
            .error(axis.loc, fmt::format("optimizer '{}' has more than one 'distributed over' line; its state is "
                                         "distributed over one axis",
                                         name.text))
            .note(optimizer->distributed_axes.front().loc, "first given here");
        continue;
      }
      if (const std::optional<int> resolved = ctx.resolve_axis(axis)) decl.distributed_axis = *resolved;
    }
    ctx.layout.optimizers.push_back(std::move(decl));
  }
}

}  // namespace distckpt::gen
