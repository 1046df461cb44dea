// The parser's working state: the syntax tree so far plus the statements
// being built. The grammar is LL(1) on keywords (after a statement's first
// word every step is a must<>), so actions never fire for input that is later
// backtracked over; a syntax error abandons the half-built statement instead.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tao/pegtl.hpp>
#include <utility>
#include <vector>

#include "diagnostics.h"
#include "syntax/ast.h"

namespace distckpt::gen {

struct ParseState {
  explicit ParseState(Diagnostics& diagnostics_in) : diagnostics(diagnostics_in) {}

  Diagnostics& diagnostics;
  ast::Schema schema;

  // One slot per kind of statement; its first word's action resets it.
  ast::LayoutDecl layout;
  ast::Config config;
  ast::Param param;
  ast::Mesh mesh;
  ast::Tensor tensor;
  ast::Object object;
  ast::Common common;
  ast::Transient transient;
  ast::Optimizer optimizer;
  ast::Mapping mapping;
  ast::MapEntry map_entry;
  std::optional<ast::Name> map_part;                     // of the fused part whose external name comes next
  ast::Name part_name;                                   // of the fused part whose extent comes next
  std::vector<std::unique_ptr<ast::Stack>> open_stacks;  // innermost last
  std::optional<ast::Condition> condition;               // not yet attached to its statement
  // Expressions are built bottom-up: operands wait here for their operator.
  std::vector<ast::ExprPtr> operands;
  std::vector<std::pair<char, Loc>> operators;
  // Nesting the parser, the checker and the AST's destructors recurse on:
  // bounded so that no input can overflow the stack.
  static constexpr int kMaxNesting = 200;
  int open_parens = 0;

  // For recover<> (syntax_recovery.h).
  std::size_t mark() const { return open_stacks.size(); }
  void abandon(std::size_t open_stack_count, const tao::pegtl::parse_error& error) {
    const auto& pos = error.positions().front();
    diagnostics.error(Loc{static_cast<int>(pos.line), static_cast<int>(pos.column)}, std::string(error.message()));
    open_stacks.resize(open_stack_count);
    condition.reset();
    operands.clear();
    operators.clear();
    open_parens = 0;
  }

  // A finished tensor, object or stack joins the innermost open stack, or
  // the top level.
  template <typename Item>
  void add_to_block(Item item) {
    if (open_stacks.empty()) {
      schema.items.emplace_back(std::move(item));
    } else {
      open_stacks.back()->body.emplace_back(std::move(item));
    }
  }

  ast::ExprPtr pop_operand() {
    ast::ExprPtr top = std::move(operands.back());
    operands.pop_back();
    return top;
  }
};

template <typename Input>
Loc loc_of(const Input& in) {
  const auto pos = in.position();
  return Loc{static_cast<int>(pos.line), static_cast<int>(pos.column)};
}

// A token's text without the whitespace and comments it swallowed.
template <typename Input>
std::string word_of(const Input& in) {
  const std::string_view text = in.string_view();
  std::size_t n = 0;
  while (n < text.size()) {
    const char c = text[n];
    const bool name_char =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (!name_char) break;
    ++n;
  }
  return std::string(text.substr(0, n));
}

// A mapping key as written, `decoder.layers[layer].w`: the key text without
// the brackets, and each index name with the length of the text before it.
template <typename Input>
ast::MapKey map_key_of(const Input& in) {
  const std::string_view text = in.string_view();
  const Loc at = loc_of(in);
  ast::MapKey key{{}, {}, at};
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '[') {
      const std::size_t close = text.find(']', i);
      const Loc loc{at.line, at.col + static_cast<int>(i) + 1};
      key.indices.push_back(ast::MapIndex{{std::string(text.substr(i + 1, close - i - 1)), loc}, key.text.size()});
      i = close;
    } else if (c == '.' || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      key.text += c;
    } else {
      break;
    }
  }
  return key;
}

// A string literal's contents (the grammar admits no escapes).
template <typename Input>
std::string string_of(const Input& in) {
  const std::string_view text = in.string_view();
  return std::string(text.substr(1, text.find('"', 1) - 1));
}

template <typename Input>
ast::Name name_of(const Input& in) {
  return ast::Name{word_of(in), loc_of(in)};
}

// Integers are non-negative and fit in 63 bits (docs/SCHEMA.md).
template <typename Input>
ast::Int int_of(const Input& in) {
  const std::string digits = word_of(in);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t value = 0;
  for (const char c : digits) {
    const int64_t digit = c - '0';
    if (value > (kMax - digit) / 10) {
      throw tao::pegtl::parse_error(fmt::format("integer {} does not fit in 63 bits", digits), in);
    }
    value = value * 10 + digit;
  }
  return ast::Int{value, loc_of(in)};
}

}  // namespace distckpt::gen
