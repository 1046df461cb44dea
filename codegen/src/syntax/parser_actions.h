// PEGTL actions that turn matched grammar rules into the syntax tree. Each
// statement's first word resets its slot in ParseState, the parts fill it,
// and the rule of the whole statement moves it into its block.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <tao/pegtl.hpp>
#include <utility>

#include "syntax/grammar.h"
#include "syntax/parse_state.h"

namespace distckpt::gen {

template <typename Rule>
struct action : tao::pegtl::nothing<Rule> {};

// The action of one rule: `in` is the matched input, `s` the ParseState.
// (Variadic so that braced initializers may contain commas.)
#define DISTCKPT_ACTION(rule, ...)                      \
  template <>                                           \
  struct action<grammar::rule> {                        \
    template <typename Input>                           \
    static void apply(const Input& in, ParseState& s) { \
      __VA_ARGS__;                                      \
    }                                                   \
  }

// ---- expressions ----------------------------------------------------------

DISTCKPT_ACTION(int_literal, {
  auto e = std::make_unique<ast::Expr>();
  const ast::Int value = int_of(in);
  e->kind = ast::Expr::Kind::kInt;
  e->value = value.value;
  e->loc = value.loc;
  s.operands.push_back(std::move(e));
});
DISTCKPT_ACTION(param_ref, {
  auto e = std::make_unique<ast::Expr>();
  e->kind = ast::Expr::Kind::kName;
  e->name = word_of(in);
  e->loc = loc_of(in);
  s.operands.push_back(std::move(e));
});
DISTCKPT_ACTION(mul_op, s.operators.emplace_back(in.peek_char(), loc_of(in)));
DISTCKPT_ACTION(add_op, s.operators.emplace_back(in.peek_char(), loc_of(in)));

// `lhs op rhs` is complete once its right operand is: folding here, one
// operator at a time, makes both levels left-associative.
struct fold_binary {
  template <typename Input>
  static void apply(const Input& in, ParseState& s) {
    auto e = std::make_unique<ast::Expr>();
    e->kind = ast::Expr::Kind::kBinary;
    e->rhs = s.pop_operand();
    e->lhs = s.pop_operand();
    e->op = s.operators.back().first;
    s.operators.pop_back();
    e->loc = e->lhs->loc;
    e->depth = 1 + std::max(e->lhs->depth, e->rhs->depth);
    if (e->depth > ParseState::kMaxNesting) {
      throw tao::pegtl::parse_error(
          fmt::format("the expression nests more than {} operations; simplify it", ParseState::kMaxNesting), in);
    }
    s.operands.push_back(std::move(e));
  }
};
template <>
struct action<grammar::mul_tail> : fold_binary {};
DISTCKPT_ACTION(open_paren, {
  if (++s.open_parens > ParseState::kMaxNesting) {
    throw tao::pegtl::parse_error(
        fmt::format("more than {} nested parentheses; simplify the expression", ParseState::kMaxNesting), in);
  }
});
// A parenthesized operation starts at its '(' (a lone name keeps its own place).
DISTCKPT_ACTION(paren_expr, {
  --s.open_parens;
  if (s.operands.back()->kind == ast::Expr::Kind::kBinary) s.operands.back()->loc = loc_of(in);
});
template <>
struct action<grammar::add_tail> : fold_binary {};

// ---- conditions -----------------------------------------------------------

DISTCKPT_ACTION(when_word, s.condition = ast::Condition{false, {}, loc_of(in)});
DISTCKPT_ACTION(unless_word, s.condition = ast::Condition{true, {}, loc_of(in)});
DISTCKPT_ACTION(condition_param, s.condition->param = name_of(in));

// ---- layout, config, mesh -------------------------------------------------

DISTCKPT_ACTION(layout_word, s.layout = ast::LayoutDecl{loc_of(in), {}});
DISTCKPT_ACTION(layout_name, s.layout.name = name_of(in));
DISTCKPT_ACTION(layout_decl, s.schema.items.emplace_back(std::move(s.layout)));

DISTCKPT_ACTION(config_word, s.config = ast::Config{loc_of(in), {}});
DISTCKPT_ACTION(param_name, s.param = ast::Param{name_of(in), false, nullptr});
DISTCKPT_ACTION(param_list, s.param.list = true);
DISTCKPT_ACTION(param_default, s.param.default_value = s.pop_operand());
DISTCKPT_ACTION(param, s.config.params.push_back(std::move(s.param)));
DISTCKPT_ACTION(config, s.schema.items.emplace_back(std::move(s.config)));

DISTCKPT_ACTION(mesh_word, s.mesh = ast::Mesh{loc_of(in), std::nullopt, {}});
DISTCKPT_ACTION(mesh_name, s.mesh.name = name_of(in));
DISTCKPT_ACTION(mesh_axis, s.mesh.axes.push_back(name_of(in)));
DISTCKPT_ACTION(mesh, s.schema.items.emplace_back(std::move(s.mesh)));

// ---- tensor ---------------------------------------------------------------

DISTCKPT_ACTION(tensor_word, {
  s.tensor = ast::Tensor{};
  s.tensor.loc = loc_of(in);
});
DISTCKPT_ACTION(tensor_key, s.tensor.key = name_of(in));
DISTCKPT_ACTION(shape_dim, s.tensor.shape.push_back(s.pop_operand()));
DISTCKPT_ACTION(split_dim, s.tensor.splits.push_back(ast::Split{int_of(in), {}}));
DISTCKPT_ACTION(split_axis, s.tensor.splits.back().axes.push_back(name_of(in)));
DISTCKPT_ACTION(pad_dim, s.tensor.pads.push_back(int_of(in)));
DISTCKPT_ACTION(stage_word, s.tensor.stages.push_back(ast::Stage{false, loc_of(in)}));
DISTCKPT_ACTION(stage_last, s.tensor.stages.back().last = true);
DISTCKPT_ACTION(fused_word, s.tensor.fused.push_back(ast::Fused{{}, loc_of(in)}));
DISTCKPT_ACTION(part_name, s.part_name = name_of(in));
DISTCKPT_ACTION(part_extent, s.tensor.fused.back().parts.push_back(ast::FusedPart{s.part_name, s.pop_operand()}));
DISTCKPT_ACTION(tied_key, s.tensor.tied.push_back(name_of(in)));
DISTCKPT_ACTION(dtype_name, s.tensor.dtypes.push_back(name_of(in)));
DISTCKPT_ACTION(tensor_mesh, s.tensor.meshes.push_back(name_of(in)));
DISTCKPT_ACTION(tensor, {
  s.tensor.condition = std::exchange(s.condition, std::nullopt);
  s.add_to_block(std::move(s.tensor));
});

// ---- object ---------------------------------------------------------------

DISTCKPT_ACTION(object_word, s.object = ast::Object{loc_of(in), {}, {}, std::nullopt, std::nullopt});
DISTCKPT_ACTION(object_mesh, s.object.mesh = name_of(in));
DISTCKPT_ACTION(object_key, s.object.key = name_of(in));
DISTCKPT_ACTION(per_axis, s.object.per_axes.push_back(name_of(in)));
DISTCKPT_ACTION(object, {
  s.object.condition = std::exchange(s.condition, std::nullopt);
  s.add_to_block(std::move(s.object));
});

// ---- stack ----------------------------------------------------------------

DISTCKPT_ACTION(stack_word, {
  if (s.open_stacks.size() >= ParseState::kMaxNesting) {
    throw tao::pegtl::parse_error(fmt::format("more than {} nested stacks", ParseState::kMaxNesting), in);
  }
  s.open_stacks.push_back(std::make_unique<ast::Stack>());
  s.open_stacks.back()->loc = loc_of(in);
});
DISTCKPT_ACTION(stack_key, s.open_stacks.back()->key = name_of(in));
DISTCKPT_ACTION(stack_count, s.open_stacks.back()->count = s.pop_operand());
DISTCKPT_ACTION(stack_axis, s.open_stacks.back()->axis = name_of(in));
DISTCKPT_ACTION(stack_stage_word, s.open_stacks.back()->stage = ast::Stage{false, loc_of(in)});
DISTCKPT_ACTION(stack_stage_last, s.open_stacks.back()->stage->last = true);
DISTCKPT_ACTION(virtual_word, s.open_stacks.back()->chunks_loc = loc_of(in));
DISTCKPT_ACTION(virtual_count, s.open_stacks.back()->chunks = s.pop_operand());
DISTCKPT_ACTION(stack_layout_param, s.open_stacks.back()->layout = name_of(in));
DISTCKPT_ACTION(stack_mesh, s.open_stacks.back()->mesh = name_of(in));
DISTCKPT_ACTION(first_count, s.open_stacks.back()->first_count = s.pop_operand());
DISTCKPT_ACTION(last_count, s.open_stacks.back()->last_count = s.pop_operand());
DISTCKPT_ACTION(storage_axis, s.open_stacks.back()->storage = ast::Storage{false, loc_of(in)});
DISTCKPT_ACTION(storage_keys, s.open_stacks.back()->storage = ast::Storage{true, loc_of(in)});
// The header's condition is complete at '{'; the body has conditions of its own.
DISTCKPT_ACTION(stack_open, s.open_stacks.back()->condition = std::exchange(s.condition, std::nullopt));
DISTCKPT_ACTION(stack, {
  std::unique_ptr<ast::Stack> done = std::move(s.open_stacks.back());
  s.open_stacks.pop_back();
  s.add_to_block(std::move(done));
});

// ---- common, transient ----------------------------------------------------

DISTCKPT_ACTION(common_word, s.common = ast::Common{loc_of(in), {}, CommonDecl::Type::kInt});
DISTCKPT_ACTION(common_key, s.common.key = name_of(in));
DISTCKPT_ACTION(common_int, s.common.type = CommonDecl::Type::kInt);
DISTCKPT_ACTION(common_float, s.common.type = CommonDecl::Type::kFloat);
DISTCKPT_ACTION(common_string, s.common.type = CommonDecl::Type::kString);
DISTCKPT_ACTION(common_bool, s.common.type = CommonDecl::Type::kBool);
DISTCKPT_ACTION(common, s.schema.items.emplace_back(std::move(s.common)));

DISTCKPT_ACTION(transient_word, s.transient = ast::Transient{loc_of(in), {}});
DISTCKPT_ACTION(transient_key, s.transient.key = name_of(in));
DISTCKPT_ACTION(transient, s.schema.items.emplace_back(std::move(s.transient)));

// ---- optimizer ------------------------------------------------------------

DISTCKPT_ACTION(optimizer_word, {
  s.optimizer = ast::Optimizer{};
  s.optimizer.loc = loc_of(in);
});
DISTCKPT_ACTION(optimizer_name, s.optimizer.name = name_of(in));
DISTCKPT_ACTION(state_name, s.optimizer.states.push_back(name_of(in)));
DISTCKPT_ACTION(scalar_name, s.optimizer.scalars.push_back(name_of(in)));
DISTCKPT_ACTION(distributed_word,
                s.optimizer.distributed.push_back(ast::Optimizer::Distributed{loc_of(in), {}, nullptr, std::nullopt}));
DISTCKPT_ACTION(distributed_axis, s.optimizer.distributed.back().axes.push_back(name_of(in)));
DISTCKPT_ACTION(instances_count, s.optimizer.distributed.back().instances = s.pop_operand());
DISTCKPT_ACTION(distributed_mesh, s.optimizer.distributed.back().mesh = name_of(in));
DISTCKPT_ACTION(optimizer, s.schema.items.emplace_back(std::move(s.optimizer)));

// ---- mapping --------------------------------------------------------------

DISTCKPT_ACTION(mapping_word, {
  s.mapping = ast::Mapping{};
  s.mapping.loc = loc_of(in);
});
DISTCKPT_ACTION(mapping_name, s.mapping.name = name_of(in));
DISTCKPT_ACTION(map_key, {
  s.map_entry = ast::MapEntry{};
  s.map_part.reset();
  s.map_entry.key = map_key_of(in);
});
DISTCKPT_ACTION(map_whole, s.map_entry.whole = true);
DISTCKPT_ACTION(map_parts, s.map_entry.whole = false);
DISTCKPT_ACTION(map_part, s.map_part = name_of(in));
DISTCKPT_ACTION(external_name, {
  s.map_entry.targets.push_back(ast::MapTarget{std::exchange(s.map_part, std::nullopt), string_of(in), loc_of(in)});
});
DISTCKPT_ACTION(map_entry, s.mapping.entries.push_back(std::move(s.map_entry)));
DISTCKPT_ACTION(skip_key, s.mapping.skips.push_back(name_of(in)));
DISTCKPT_ACTION(mapping, s.schema.items.emplace_back(std::move(s.mapping)));

#undef DISTCKPT_ACTION

}  // namespace distckpt::gen
