// Blocks: the members of one generated class (the top level or a stack
// body). Registers full keys, checks objects and stacks, and recurses into
// stack bodies with the stack's key prefix, axis and condition. (Their C++
// names are checked once the layout is complete: check_member_names.cpp.)
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "check/checker_context.h"
#include "check/names.h"
#include "ir/cpp_names.h"
#include "ir/expr.h"

namespace distckpt::gen {

void BlockChecker::check_enclosing_axes(int mesh, Loc loc, const std::string& what) {
  for (const EnclosingStack& stack : scope_.stacks) {
    if (stack.axis >= 0 && !ctx_.on_mesh(stack.axis, mesh) && ctx_.reported_enclosing.emplace(stack.key, mesh).second) {
      ctx_.check_axis_on_mesh(stack.axis, mesh, loc, fmt::format("{} (through its stack '{}')", what, stack.key),
                              /*enclosing=*/true);
    }
  }
}

std::vector<Condition> BlockChecker::conditions_with(const Condition& own) const {
  std::vector<Condition> all = scope_.conditions;
  if (own.param >= 0) all.push_back(own);
  return all;
}

void BlockChecker::add(const ast::Tensor& tensor) {
  TensorDecl decl = check_tensor(ctx_, tensor, scope_);
  const std::string full_key = scope_.key_prefix + decl.key;
  check_enclosing_axes(decl.mesh, tensor.meshes.empty() ? decl.loc : tensor.meshes.front().loc,
                       "tensor '" + full_key + "'");
  ctx_.claim_key(full_key, KeyUse{decl.loc, conditions_with(decl.condition), true, !decl.tied_key.empty(),
                                  decl.shape.size(), decl.shape});
  block_.order.push_back(Member{Member::Kind::kTensor, block_.tensors.size()});
  block_.tensors.push_back(std::move(decl));
}

void BlockChecker::add(const ast::Object& object) {
  ObjectDecl decl;
  decl.key = object.key.text;
  decl.accessor = accessor_name(decl.key);
  decl.loc = object.key.loc;
  const std::string full_key = scope_.key_prefix + decl.key;
  decl.mesh = scope_.mesh;
  if (object.mesh) {
    if (const std::optional<int> mesh = ctx_.resolve_mesh(*object.mesh)) decl.mesh = *mesh;
  }
  check_enclosing_axes(decl.mesh, object.mesh ? object.mesh->loc : decl.loc, "object '" + full_key + "'");
  std::unordered_map<int, Loc> seen;
  for (const ast::Name& name : object.per_axes) {
    const std::optional<int> axis = ctx_.resolve_axis(name);
    if (!axis) continue;
    if (const EnclosingStack* stack = scope_.stack_over(*axis)) {
      ctx_.diag.error(name.loc, fmt::format("mesh axis '{}' already places the enclosing stack '{}'; object '{}' "
                                            "cannot also be per({})",
                                            name.text, stack->key, full_key, name.text));
      continue;
    }
    if (!ctx_.check_axis_on_mesh(*axis, decl.mesh, name.loc, "object '" + full_key + "'")) continue;
    const auto [it, fresh] = seen.emplace(*axis, name.loc);
    if (!fresh) {
      ctx_.diag
          .error(name.loc, fmt::format("mesh axis '{}' appears twice in per(...) of object '{}'", name.text, full_key))
          .note(it->second, "first given here");
      continue;
    }
    decl.per_axes.push_back(*axis);
  }
  decl.condition = ctx_.resolve_condition(object.condition);
  ctx_.claim_key(full_key, KeyUse{decl.loc, conditions_with(decl.condition), false, false, 0, {}});
  block_.order.push_back(Member{Member::Kind::kObject, block_.objects.size()});
  block_.objects.push_back(std::move(decl));
}

void BlockChecker::add(const ast::Stack& stack) {
  auto decl = std::make_shared<StackDecl>();
  decl->key = stack.key.text;
  decl->accessor = accessor_name(decl->key);
  decl->loc = stack.key.loc;
  const std::string full_key = scope_.key_prefix + decl->key;
  // Element classes are all nested in Model: named after the full key.
  decl->class_name = class_name(full_key);

  // A stack may be empty (an optional block such as multi-token prediction).
  decl->count = ctx_.resolve(*stack.count);
  std::optional<int64_t> count;
  if (decl->count) count = ctx_.evaluate(*decl->count);
  if (count && *count < 0) {
    ctx_.diag.error(decl->count->loc, fmt::format("the element count of stack '{}' is {}; it must not be negative",
                                                  full_key, ctx_.describe_value(*decl->count, *count)));
  }

  decl->mesh = scope_.mesh;
  if (stack.mesh) {
    if (const std::optional<int> mesh = ctx_.resolve_mesh(*stack.mesh)) decl->mesh = *mesh;
  }
  const std::string what = "stack '" + full_key + "'";
  check_enclosing_axes(decl->mesh, stack.mesh ? stack.mesh->loc : decl->loc, what);

  if (stack.stage) {
    check_stage_stack(*decl, *stack.stage, full_key);
  } else if (const std::optional<int> axis = ctx_.resolve_axis(stack.axis)) {
    if (const EnclosingStack* outer = scope_.stack_over(*axis)) {
      ctx_.diag.error(stack.axis.loc, fmt::format("stack '{}' is spread over '{}', which already places the "
                                                  "enclosing stack '{}'; a nested stack needs another axis",
                                                  full_key, stack.axis.text, outer->key));
    }
    ctx_.check_axis_on_mesh(*axis, decl->mesh, stack.axis.loc, what);
    decl->axis = *axis;
  }
  check_virtual(*decl, stack, full_key);

  // Uneven placement: counts on the first/last stage, each non-negative,
  // together no more than the stack holds.
  int64_t placed = 0;
  bool placed_known = true;
  const auto placement = [&](const ast::ExprPtr& expr, const char* which) -> ExprPtr {
    if (!expr) return nullptr;
    ExprPtr resolved = ctx_.resolve(*expr);
    const std::optional<int64_t> value = resolved ? ctx_.evaluate(*resolved) : std::nullopt;
    if (value && *value < 0) {
      ctx_.diag.error(expr->loc, fmt::format("{}(...) of stack '{}' is {}; it must not be negative", which, full_key,
                                             ctx_.describe_value(*resolved, *value)));
    }
    placed_known = placed_known && value && *value >= 0 && !__builtin_add_overflow(placed, *value, &placed);
    return resolved;
  };
  decl->first_count = placement(stack.first_count, "first");
  decl->last_count = placement(stack.last_count, "last");
  if (count && *count >= 0 && placed_known && placed > *count) {
    ctx_.diag.error(decl->loc, fmt::format("stack '{}' places {} elements on its first and last stage but has only {}",
                                           full_key, placed, *count));
  }

  decl->as_keys = stack.storage && stack.storage->as_keys;
  decl->condition = ctx_.resolve_condition(stack.condition);

  Scope inner = scope_;
  inner.key_prefix = full_key + ".";
  inner.mesh = decl->mesh;
  inner.stacks.push_back(EnclosingStack{full_key, decl->axis});
  if (decl->condition.param >= 0) inner.conditions.push_back(decl->condition);
  BlockChecker body(ctx_, std::move(inner));
  for (const ast::BlockItem& item : stack.body) {
    std::visit(
        [&](const auto& member) {
          using T = std::decay_t<decltype(member)>;
          if constexpr (std::is_same_v<T, std::unique_ptr<ast::Stack>>) {
            body.add(*member);
          } else {
            body.add(member);
          }
        },
        item);
  }
  decl->body = body.finish();

  block_.order.push_back(Member{Member::Kind::kStack, block_.stacks.size()});
  block_.stacks.push_back(std::move(decl));
}

// `stage(first|last)` on a stack: every element on that (virtual) stage of
// the layer axis, like a stage(...) tensor.
void BlockChecker::check_stage_stack(StackDecl& decl, const ast::Stage& stage, const std::string& full_key) {
  const char* which = stage.last ? "last" : "first";
  decl.stage = stage.last ? Stage::kLast : Stage::kFirst;
  if (!scope_.top_level()) {
    ctx_.diag.error(stage.loc, fmt::format("stage({}) applies only to top-level stacks; stack '{}' is inside stack "
                                           "'{}', which already places it",
                                           which, full_key, scope_.stacks.back().key));
  } else if (ctx_.layer_axes.size() != 1) {
    ctx_.diag.error(stage.loc, fmt::format("stage({}) on stack '{}' needs exactly one top-level stack of layers "
                                           "spread over a mesh axis",
                                           which, full_key));
  } else {
    decl.stage_axis = ctx_.layer_axes.front();
    ctx_.check_axis_on_mesh(decl.stage_axis, decl.mesh, stage.loc, "stack '" + full_key + "'");
  }
}

// virtual(n) and layout(P): model chunks of a top-level stack of layers.
void BlockChecker::check_virtual(StackDecl& decl, const ast::Stack& stack, const std::string& full_key) {
  const auto top_level_only = [&](Loc loc, const char* what) {
    if (scope_.top_level()) return true;
    ctx_.diag.error(
        loc, fmt::format("{} applies only to a top-level stack of layers; stack '{}' is nested", what, full_key));
    return false;
  };
  if (stack.chunks && top_level_only(stack.chunks_loc, "virtual(...)")) {
    decl.chunks = ctx_.resolve(*stack.chunks);
    if (decl.chunks) {
      ctx_.check_extent(*decl.chunks, fmt::format("the number of virtual stages of stack '{}'", full_key));
    }
    if (const StackDecl* earlier = ctx_.layout.chunked_stack) {
      ctx_.diag
          .error(stack.chunks_loc, fmt::format("stack '{}' is the second stack with virtual(...); model chunks "
                                               "come from one stack of layers",
                                               full_key))
          .note(earlier->loc, "first given here");
    } else {
      ctx_.layout.chunked_stack = &decl;
    }
  }
  if (stack.layout && top_level_only(stack.layout->loc, "layout(...)")) {
    if (const std::optional<int> param = ctx_.resolve_list_param(*stack.layout)) decl.layout_param = *param;
  }
}

namespace {

// Both shapes, when every extent of both is known.
std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> known_shapes(const CheckContext& ctx,
                                                                                  const std::vector<ExprPtr>& a,
                                                                                  const std::vector<ExprPtr>& b) {
  const auto known = [&](const std::vector<ExprPtr>& shape) -> std::optional<std::vector<int64_t>> {
    std::vector<int64_t> out;
    for (const ExprPtr& extent : shape) {
      const std::optional<int64_t> value = extent ? ctx.known_value(*extent) : std::nullopt;
      if (!value) return std::nullopt;
      out.push_back(*value);
    }
    return out;
  };
  std::optional<std::vector<int64_t>> x = known(a), y = known(b);
  if (!x || !y) return std::nullopt;
  return std::make_pair(std::move(*x), std::move(*y));
}

bool any_param(const std::vector<ExprPtr>& shape) {
  for (const ExprPtr& extent : shape) {
    if (extent && uses_params(*extent)) return true;
  }
  return false;
}

}  // namespace

void resolve_ties(CheckContext& ctx) {
  for (const PendingTie& tie : ctx.ties) {
    const std::string& key = tie.target.text;
    const std::vector<KeyUse>* uses = ctx.key_uses(key);
    const KeyUse* main = nullptr;
    bool tied_tensor = false;
    if (uses) {
      for (const KeyUse& use : *uses) {
        if (use.tensor && !use.tied && !main) main = &use;
        tied_tensor = tied_tensor || (use.tensor && use.tied);
      }
    }
    if (main == nullptr && tied_tensor) {
      ctx.diag.error(tie.target.loc,
                     fmt::format("tied({}): '{}' is itself tied; tie to the key of the main copy", key, key));
    } else if (main == nullptr) {
      const std::string hint = did_you_mean(key, ctx.tensor_keys());
      ctx.diag.error(tie.target.loc, fmt::format("tied({}): no tensor has the key '{}'{}", key, key, hint));
    } else if (main->rank != tie.rank) {
      ctx.diag.error(tie.target.loc, fmt::format("tied({}): tensor '{}' has rank {} but '{}' has rank {}; a tied "
                                                 "tensor has the rank of its main copy",
                                                 key, tie.tensor_key, tie.rank, key, main->rank));
    } else if (const auto shapes = known_shapes(ctx, tie.shape, main->shape);
               shapes && shapes->first != shapes->second) {
      ctx.diag.error(
          tie.target.loc,
          fmt::format("tied({}): tensor '{}' has shape [{}] but '{}' has shape [{}]{}; a tied tensor has "
                      "the shape of its main copy",
                      key, tie.tensor_key, fmt::join(shapes->first, ", "), key, fmt::join(shapes->second, ", "),
                      any_param(tie.shape) || any_param(main->shape) ? " with the config defaults" : ""));
    }
  }
}

}  // namespace distckpt::gen
