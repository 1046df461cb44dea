// The checker's driver: the schema-level rules (one layout, first; one
// mesh), then the passes of checker_context.h in dependency order.
#include "check/checker.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "check/checker_context.h"
#include "check/cpp_identifiers.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {
namespace {

void check_layout_decls(CheckContext& ctx, const ast::Schema& schema) {
  const ast::LayoutDecl* first = nullptr;
  for (const ast::Item& item : schema.items) {
    const auto* layout = std::get_if<ast::LayoutDecl>(&item);
    if (layout == nullptr) continue;
    if (first != nullptr) {
      ctx.diag.error(layout->loc, "more than one 'layout' declaration; a schema describes one layout")
          .note(first->loc, "first declared here");
      continue;
    }
    first = layout;
    if (&item != &schema.items.front()) {
      ctx.diag.error(layout->loc,
                     fmt::format("'layout {};' must be the first declaration of the schema", layout->name.text));
    }
  }
  if (first == nullptr) {
    ctx.diag.error(Loc{1, 1}, "missing 'layout NAME;': a schema starts by naming its layout (e.g. 'layout gpt;')");
    return;
  }
  ctx.layout.name = first->name.text;
  const std::string problem = identifier_problem(first->name.text, CppScope::kNamespace);
  if (!problem.empty()) {
    ctx.diag.error(first->name.loc, fmt::format("layout '{}' becomes the C++ namespace '{}'{}; rename it",
                                                first->name.text, first->name.text, problem));
  }
}

// Several meshes decompose the same ranks (MoE parallel folding): the first
// may be unnamed (the default mesh), the others are named.
void check_mesh_decls(CheckContext& ctx, const ast::Schema& schema) {
  std::map<std::string, Loc> names;
  std::map<std::string, std::pair<std::string, Loc>> constants;  // C++ constant -> (mesh, where)
  const ast::Mesh* first = nullptr;
  for (const ast::Item& item : schema.items) {
    const auto* mesh = std::get_if<ast::Mesh>(&item);
    if (mesh == nullptr) continue;
    if (first != nullptr && !mesh->name) {
      ctx.diag
          .error(mesh->loc,
                 "a second mesh must be named, as in 'mesh experts: etp, ep, edp, pp;'; only the first "
                 "(default) mesh may be unnamed")
          .note(first->loc, "first mesh declared here");
      continue;
    }
    if (first == nullptr) first = mesh;
    const std::string name = mesh->name ? mesh->name->text : "default";
    const Loc loc = mesh->name ? mesh->name->loc : mesh->loc;
    const auto [it, fresh] = names.emplace(name, loc);
    if (!fresh) {
      ctx.diag.error(loc, fmt::format("duplicate mesh '{}'", name)).note(it->second, "first declared here");
      continue;
    }
    const std::string constant = mesh_constant(name);
    const auto [same, unique] = constants.emplace(constant, std::make_pair(name, loc));
    if (!unique) {
      ctx.diag
          .error(loc, fmt::format("mesh '{}' and mesh '{}' both become the C++ constant '{}'; rename one of them", name,
                                  same->second.first, constant))
          .note(same->second.second, "first declared here");
      continue;
    }
    ctx.declare_mesh(*mesh);
  }
}

// Parameters of every config block, in declaration order.
void check_config_decls(CheckContext& ctx, const ast::Schema& schema) {
  std::vector<const ast::Param*> params;
  for (const ast::Item& item : schema.items) {
    if (const auto* config = std::get_if<ast::Config>(&item)) {
      for (const ast::Param& param : config->params) params.push_back(&param);
    }
  }
  ctx.declare_params(params);
}

// stage(first|last) refers to the axis the top-level stacks spread layers
// over; known before any tensor is checked, wherever the stacks appear.
void find_layer_axes(CheckContext& ctx, const ast::Schema& schema) {
  for (const ast::Item& item : schema.items) {
    const auto* stack = std::get_if<std::unique_ptr<ast::Stack>>(&item);
    if (stack == nullptr || (*stack)->stage) continue;
    const std::optional<int> axis = ctx.find_axis((*stack)->axis.text);
    if (axis && std::find(ctx.layer_axes.begin(), ctx.layer_axes.end(), *axis) == ctx.layer_axes.end()) {
      ctx.layer_axes.push_back(*axis);
    }
  }
}

void check_top_block(CheckContext& ctx, const ast::Schema& schema) {
  BlockChecker top(ctx, Scope{});
  for (const ast::Item& item : schema.items) {
    if (const auto* tensor = std::get_if<ast::Tensor>(&item)) {
      top.add(*tensor);
    } else if (const auto* object = std::get_if<ast::Object>(&item)) {
      top.add(*object);
    } else if (const auto* stack = std::get_if<std::unique_ptr<ast::Stack>>(&item)) {
      top.add(**stack);
    }
  }
  ctx.layout.body = top.finish();
  // Model chunks come from the virtual stack alone: another stack spread
  // over the same axis would have no chunk to live in.
  if (const StackDecl* chunked = ctx.layout.chunked_stack) {
    for (const auto& stack : ctx.layout.body.stacks) {
      if (stack.get() != chunked && stack->axis >= 0 && stack->axis == chunked->axis) {
        ctx.diag
            .error(stack->loc, fmt::format("stack '{}' is spread over '{}' next to stack '{}', which has virtual "
                                           "pipeline stages; make it part of that stack or place it with "
                                           "stage(first|last)",
                                           stack->key, ctx.layout.mesh_axes[stack->axis], chunked->key))
            .note(chunked->loc, "virtual stages declared here");
      }
    }
  }
}

}  // namespace

std::optional<Layout> check_schema(const ast::Schema& schema, Diagnostics& diagnostics) {
  CheckContext ctx(diagnostics);
  const bool had_errors = diagnostics.has_errors();
  check_layout_decls(ctx, schema);
  check_mesh_decls(ctx, schema);
  check_config_decls(ctx, schema);
  find_layer_axes(ctx, schema);
  check_top_block(ctx, schema);
  resolve_ties(ctx);
  check_commons_and_transients(ctx, schema);
  check_optimizers(ctx, schema);
  check_mappings(ctx, schema);
  check_class_names(ctx);
  check_member_names(ctx);
  ctx.warn_unused_params();
  if (had_errors || diagnostics.has_errors()) return std::nullopt;
  return std::move(ctx.layout);
}

}  // namespace distckpt::gen
