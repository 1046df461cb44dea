// evaluate() and to_source(): exact integer arithmetic with partial
// knowledge, minimal parentheses, and the round trip
// parse(to_source(e)) == e through the whole front end.
#include <gtest/gtest.h>

#include <memory>

#include "frontend_test_util.h"

namespace distckpt::gen {
namespace {

ExprPtr constant(int64_t v) {
  auto e = std::make_shared<Expr>();
  e->op = Expr::Op::kConst;
  e->value = v;
  return e;
}

ExprPtr param(int index) {
  auto e = std::make_shared<Expr>();
  e->op = Expr::Op::kParam;
  e->param = index;
  return e;
}

ExprPtr binary(Expr::Op op, ExprPtr lhs, ExprPtr rhs) {
  auto e = std::make_shared<Expr>();
  e->op = op;
  e->lhs = std::move(lhs);
  e->rhs = std::move(rhs);
  return e;
}

bool same_tree(const Expr& a, const Expr& b) {
  if (a.op != b.op || a.value != b.value || a.param != b.param) return false;
  if (!a.lhs) return !b.lhs && !b.rhs;
  return b.lhs && b.rhs && same_tree(*a.lhs, *b.lhs) && same_tree(*a.rhs, *b.rhs);
}

// The default of parameter `x` in a schema declaring a, b, c before it.
std::optional<Layout> layout_with_default(const std::string& text) {
  auto compiled = testing::compile("layout t;\nconfig { a: int; b: int; c: int; x: int = " + text +
                                   "; }\n"
                                   "tensor w [a, b, c, x];\n");
  EXPECT_TRUE(compiled.layout.has_value()) << text << "\n" << compiled.diagnostics.render();
  return compiled.layout;
}

TEST(Expr, EvaluatesWithKnownParameters) {
  using Op = Expr::Op;
  const std::vector<std::optional<int64_t>> values = {12, std::nullopt, 0};
  std::string error;
  EXPECT_EQ(evaluate(*binary(Op::kSub, binary(Op::kMul, param(0), constant(3)), constant(40)), values, &error), -4);
  EXPECT_EQ(evaluate(*binary(Op::kDiv, param(0), constant(4)), values, &error), 3);
  EXPECT_TRUE(error.empty());
  // An unknown parameter makes the value unknown, without an error.
  EXPECT_EQ(evaluate(*binary(Op::kAdd, param(0), param(1)), values, &error), std::nullopt);
  EXPECT_TRUE(error.empty());
  EXPECT_EQ(evaluate(*binary(Op::kDiv, param(0), constant(5)), values, &error), std::nullopt);
  EXPECT_EQ(error, "'12 / 5' is not an exact division");
  // A known zero divisor fails even when the dividend is unknown.
  EXPECT_EQ(evaluate(*binary(Op::kDiv, param(1), param(2)), values, &error), std::nullopt);
  EXPECT_EQ(error, "division by zero in '? / 0'");
  EXPECT_EQ(evaluate(*binary(Op::kMul, constant(INT64_MAX), constant(2)), values, &error), std::nullopt);
  EXPECT_EQ(error, "'9223372036854775807 * 2' overflows a 64-bit integer");
  EXPECT_EQ(evaluate(*binary(Op::kDiv, constant(INT64_MIN), constant(-1)), values), std::nullopt);
  // The first failure wins, wherever it is in the tree.
  EXPECT_EQ(evaluate(*binary(Op::kAdd, param(1), binary(Op::kDiv, constant(7), constant(2))), values, &error),
            std::nullopt);
  EXPECT_EQ(error, "'7 / 2' is not an exact division");
}

TEST(Expr, PrintsMinimalParentheses) {
  using Op = Expr::Op;
  const std::vector<ConfigParam> params = {{"a", nullptr, {}}, {"b", nullptr, {}}, {"c", nullptr, {}}};
  const ExprPtr a = param(0), b = param(1), c = param(2);
  EXPECT_EQ(to_source(*binary(Op::kSub, binary(Op::kSub, a, b), c), params), "a - b - c");
  EXPECT_EQ(to_source(*binary(Op::kSub, a, binary(Op::kSub, b, c)), params), "a - (b - c)");
  EXPECT_EQ(to_source(*binary(Op::kAdd, a, binary(Op::kAdd, b, c)), params), "a + (b + c)");
  EXPECT_EQ(to_source(*binary(Op::kAdd, a, binary(Op::kMul, b, c)), params), "a + b * c");
  EXPECT_EQ(to_source(*binary(Op::kMul, binary(Op::kAdd, a, b), c), params), "(a + b) * c");
  EXPECT_EQ(to_source(*binary(Op::kDiv, a, binary(Op::kMul, b, constant(2))), params), "a / (b * 2)");
  EXPECT_EQ(to_source(*binary(Op::kMul, binary(Op::kDiv, a, b), c), params), "a / b * c");
  EXPECT_EQ(to_source(*constant(0), params), "0");
}

TEST(Expr, ToSourceRoundTripsThroughTheParser) {
  for (const std::string text :
       {"7", "a", "a - b - c", "a - (b - c)", "(a + b) * (c - 1)", "a / (b * c) + 2", "((a))", "(a + b) + c",
        "a * (b / c)", "2 * (a - (b + c) * 3) / c", "9223372036854775807 - a"}) {
    const std::optional<Layout> first = layout_with_default(text);
    ASSERT_TRUE(first.has_value());
    const Expr& parsed = *first->params[3].default_value;
    const std::string printed = to_source(parsed, first->params);
    const std::optional<Layout> second = layout_with_default(printed);
    ASSERT_TRUE(second.has_value());
    EXPECT_TRUE(same_tree(parsed, *second->params[3].default_value)) << text << " printed as " << printed;
    EXPECT_EQ(to_source(*second->params[3].default_value, second->params), printed);
  }
  // Redundant parentheses disappear; needed ones stay.
  EXPECT_EQ(
      to_source(*layout_with_default("((a)) + (b * c)")->params[3].default_value, layout_with_default("a")->params),
      "a + b * c");
}

TEST(Expr, ExpressionLocationsPointAtTheirFirstToken) {
  const std::optional<Layout> l = layout_with_default("a * (b + c)");
  ASSERT_TRUE(l.has_value());
  const Expr& e = *l->params[3].default_value;
  EXPECT_EQ(e.loc.line, 2);
  EXPECT_EQ(e.loc.col, 43);            // `a`
  EXPECT_EQ(e.rhs->loc.col, 47);       // `(b + c)` starts at its parenthesis
  EXPECT_EQ(e.rhs->lhs->loc.col, 48);  // `b`
  EXPECT_EQ(e.rhs->rhs->loc.col, 52);
}

}  // namespace
}  // namespace distckpt::gen
