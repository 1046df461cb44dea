// Parser: the syntax tree of the SCHEMA.md example with exact positions,
// keyword boundaries, expression structure, syntax error messages and
// positions, and recovery (every error of a file in one run).
#include "syntax/parser.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <variant>

#include "frontend_test_util.h"

namespace distckpt::gen {
namespace {

using ::testing::ElementsAre;
using testing::kGptSchema;

struct Parsed {
  Diagnostics diagnostics;
  ast::Schema schema;
};

Parsed parse(const std::string& source) {
  Parsed out{Diagnostics("test.shard", source), {}};
  out.schema = parse_schema(source, out.diagnostics);
  return out;
}

std::vector<std::string> syntax_errors(const std::string& source) {
  const Parsed parsed = parse(source);
  std::vector<std::string> out;
  for (const Diagnostic& d : parsed.diagnostics.all())
    out.push_back(fmt::format("{}:{}: {}", d.loc.line, d.loc.col, d.message));
  return out;
}

// Where `needle` starts on 1-based `line` of `source` (its first occurrence).
Loc loc_in(const std::string& source, int line, const std::string& needle) {
  size_t start = 0;
  for (int i = 1; i < line; ++i) start = source.find('\n', start) + 1;
  const size_t end = source.find('\n', start);
  const size_t at = source.substr(start, end - start).find(needle);
  EXPECT_NE(at, std::string::npos) << needle << " not on line " << line;
  return Loc{line, static_cast<int>(at) + 1};
}

void expect_loc(Loc actual, Loc expected) {
  EXPECT_EQ(actual.line, expected.line);
  EXPECT_EQ(actual.col, expected.col);
}

// The expression as a fully parenthesized string: shows the tree's shape.
std::string shape_of(const ast::Expr& e) {
  switch (e.kind) {
    case ast::Expr::Kind::kInt:
      return std::to_string(e.value);
    case ast::Expr::Kind::kName:
      return e.name;
    default:
      return "(" + shape_of(*e.lhs) + " " + e.op + " " + shape_of(*e.rhs) + ")";
  }
}

template <typename T>
const T& item(const ast::Schema& schema, size_t i) {
  return std::get<T>(schema.items.at(i));
}

TEST(Parser, SchemaExampleTree) {
  const std::string src = kGptSchema;
  const Parsed p = parse(src);
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  ASSERT_EQ(p.schema.items.size(), 12u);

  EXPECT_EQ(item<ast::LayoutDecl>(p.schema, 0).name.text, "gpt");
  const auto& config = item<ast::Config>(p.schema, 1);
  ASSERT_EQ(config.params.size(), 8u);
  EXPECT_EQ(config.params[0].name.text, "hidden");
  EXPECT_EQ(config.params[0].default_value, nullptr);
  expect_loc(config.params[6].name.loc, Loc{10, 3});
  EXPECT_EQ(shape_of(*config.params[6].default_value), "(hidden / heads)");
  expect_loc(config.params[6].default_value->rhs->loc, loc_in(src, 10, "heads;"));

  const auto& mesh = item<ast::Mesh>(p.schema, 2);
  ASSERT_EQ(mesh.axes.size(), 3u);
  EXPECT_EQ(mesh.axes[2].text, "dp");
  expect_loc(mesh.axes[1].loc, Loc{14, 10});

  const auto& embedding = item<ast::Tensor>(p.schema, 3);
  EXPECT_EQ(embedding.key.text, "embedding.word_embeddings.weight");
  expect_loc(embedding.key.loc, Loc{16, 8});
  ASSERT_EQ(embedding.shape.size(), 2u);
  expect_loc(embedding.shape[1]->loc, loc_in(src, 16, "hidden"));
  ASSERT_EQ(embedding.splits.size(), 1u);
  EXPECT_EQ(embedding.splits[0].dim.value, 0);
  expect_loc(embedding.splits[0].axes[0].loc, loc_in(src, 16, "tp)"));
  ASSERT_EQ(embedding.pads.size(), 1u);
  ASSERT_EQ(embedding.stages.size(), 1u);
  EXPECT_FALSE(embedding.stages[0].last);
  EXPECT_FALSE(embedding.condition.has_value());

  const auto& stack = *item<std::unique_ptr<ast::Stack>>(p.schema, 4);
  EXPECT_EQ(stack.key.text, "decoder.layers");
  EXPECT_EQ(shape_of(*stack.count), "layers");
  EXPECT_EQ(stack.axis.text, "pp");
  expect_loc(stack.axis.loc, loc_in(src, 18, "pp"));
  EXPECT_FALSE(stack.storage.has_value());
  ASSERT_EQ(stack.body.size(), 6u);
  const auto& qkv = std::get<ast::Tensor>(stack.body[0]);
  EXPECT_EQ(shape_of(*qkv.shape[0]), "((heads + (2 * kv_groups)) * head_dim)");
  ASSERT_EQ(qkv.fused.size(), 1u);
  ASSERT_EQ(qkv.fused[0].parts.size(), 3u);
  EXPECT_EQ(qkv.fused[0].parts[1].name.text, "k");
  expect_loc(qkv.fused[0].parts[1].name.loc, loc_in(src, 20, "k:"));
  EXPECT_EQ(shape_of(*qkv.fused[0].parts[2].extent), "(kv_groups * head_dim)");
  const auto& extra = std::get<ast::Object>(stack.body[5]);
  EXPECT_EQ(extra.key.text, "self_attention.core_attention._extra_state");
  ASSERT_EQ(extra.per_axes.size(), 1u);
  EXPECT_EQ(extra.per_axes[0].text, "tp");

  const auto& untied = item<ast::Tensor>(p.schema, 6);
  ASSERT_TRUE(untied.condition.has_value());
  EXPECT_TRUE(untied.condition->negate);
  EXPECT_EQ(untied.condition->param.text, "tie_embeddings");
  const auto& tied = item<ast::Tensor>(p.schema, 7);
  ASSERT_EQ(tied.tied.size(), 1u);
  EXPECT_EQ(tied.tied[0].text, "embedding.word_embeddings.weight");
  expect_loc(tied.tied[0].loc, Loc{31, 10});
  ASSERT_TRUE(tied.condition.has_value());
  EXPECT_FALSE(tied.condition->negate);

  const auto& adam = item<ast::Optimizer>(p.schema, 8);
  EXPECT_EQ(adam.name.text, "adam");
  ASSERT_EQ(adam.states.size(), 2u);
  EXPECT_EQ(adam.states[1].text, "exp_avg_sq");
  ASSERT_EQ(adam.scalars.size(), 1u);
  ASSERT_EQ(adam.distributed.size(), 1u);
  ASSERT_EQ(adam.distributed[0].axes.size(), 1u);
  EXPECT_EQ(adam.distributed[0].axes[0].text, "dp");
  EXPECT_EQ(item<ast::Common>(p.schema, 10).key.text, "consumed_samples");
  EXPECT_EQ(item<ast::Transient>(p.schema, 11).key.text, "rng_tracker");
}

TEST(Parser, NamedMeshesVirtualStagesStageStacksAndDistributedGroups) {
  const Parsed p = parse(
      "layout t;\nconfig { counts: int[]; }\nmesh experts: etp, ep;\n"
      "stack l[n] over pp virtual(vp * 2) layout(counts) first(1) on experts when x { tensor w [1] on experts; }\n"
      "stack m[k] stage(last) { object o on experts; }\n"
      "optimizer o { distributed over dp * cp instances(2) on experts; }\n");
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  EXPECT_TRUE(item<ast::Config>(p.schema, 1).params.at(0).list);
  const auto& mesh = item<ast::Mesh>(p.schema, 2);
  ASSERT_TRUE(mesh.name.has_value());
  EXPECT_EQ(mesh.name->text, "experts");
  EXPECT_EQ(mesh.axes.size(), 2u);
  const auto& layers = *item<std::unique_ptr<ast::Stack>>(p.schema, 3);
  EXPECT_EQ(layers.axis.text, "pp");
  ASSERT_NE(layers.chunks, nullptr);
  expect_loc(layers.chunks_loc, Loc{4, 20});
  ASSERT_TRUE(layers.layout.has_value());
  EXPECT_EQ(layers.layout->text, "counts");
  ASSERT_NE(layers.first_count, nullptr);
  ASSERT_TRUE(layers.mesh.has_value());
  EXPECT_EQ(layers.mesh->text, "experts");
  ASSERT_TRUE(layers.condition.has_value());
  EXPECT_EQ(std::get<ast::Tensor>(layers.body.at(0)).meshes.at(0).text, "experts");
  const auto& mtp = *item<std::unique_ptr<ast::Stack>>(p.schema, 4);
  ASSERT_TRUE(mtp.stage.has_value());
  EXPECT_TRUE(mtp.stage->last);
  EXPECT_TRUE(mtp.axis.text.empty());
  EXPECT_EQ(std::get<ast::Object>(mtp.body.at(0)).mesh->text, "experts");
  const auto& dist = item<ast::Optimizer>(p.schema, 5).distributed.at(0);
  ASSERT_EQ(dist.axes.size(), 2u);
  EXPECT_EQ(dist.axes[1].text, "cp");
  ASSERT_NE(dist.instances, nullptr);
  EXPECT_EQ(dist.mesh->text, "experts");
}

TEST(Parser, LayoutConstructsSayWhatTheyExpect) {
  EXPECT_THAT(syntax_errors("layout t;\nconfig { c: int[; }\n"),
              ElementsAre("2:17: expected ']' after '[' (a list parameter is 'int[]') (found ';')"));
  EXPECT_THAT(syntax_errors("layout t;\nstack s[2] over pp virtual() { }\n"),
              ElementsAre("2:28: expected the number of virtual stages per stage in virtual(...) (found ')')"));
  EXPECT_THAT(syntax_errors("layout t;\nmesh experts: ;\n"),
              ElementsAre("2:15: expected a mesh axis name (found ';')"));
  EXPECT_THAT(syntax_errors("layout t;\noptimizer o { distributed over dp instances(2) on ; }\n"),
              ElementsAre("2:51: expected a mesh name after 'on' (found ';')"));
}

TEST(Parser, ExpressionsAreLeftAssociativeWithPrecedence) {
  const Parsed p = parse("layout t;\ntensor x [a - b - c, a / b * c, a + b * c - d, (a + b) * (c - 1), 7];");
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  const auto& shape = item<ast::Tensor>(p.schema, 1).shape;
  ASSERT_EQ(shape.size(), 5u);
  EXPECT_EQ(shape_of(*shape[0]), "((a - b) - c)");
  EXPECT_EQ(shape_of(*shape[1]), "((a / b) * c)");
  EXPECT_EQ(shape_of(*shape[2]), "((a + (b * c)) - d)");
  EXPECT_EQ(shape_of(*shape[3]), "((a + b) * (c - 1))");
  EXPECT_EQ(shape[4]->value, 7);
}

TEST(Parser, KeywordsNeedAWordBoundary) {
  const Parsed p =
      parse("layout t;\nmesh stackx, tensor_parallel, pp2;\ntensor layoutx.statex [stacks] split(0 by stackx);");
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  const auto& mesh = item<ast::Mesh>(p.schema, 1);
  ASSERT_EQ(mesh.axes.size(), 3u);
  EXPECT_EQ(mesh.axes[0].text, "stackx");
  EXPECT_EQ(mesh.axes[1].text, "tensor_parallel");
  const auto& tensor = item<ast::Tensor>(p.schema, 2);
  EXPECT_EQ(tensor.key.text, "layoutx.statex");
  EXPECT_EQ(shape_of(*tensor.shape[0]), "stacks");
}

// A reserved word cannot start a name, but after a '.' it is a name like any
// other: model keys use them (`vision.stage.weight`).
TEST(Parser, ReservedWordsAreNotNamesExceptAfterADot) {
  EXPECT_THAT(syntax_errors("layout t;\ntensor state.x [1];\nmesh tp, by;"),
              ElementsAre("2:8: expected the tensor key after 'tensor' (found reserved word 'state')",
                          "3:10: expected a mesh axis name (found reserved word 'by')"));
  const Parsed p = parse(
      "layout t;\ntensor vision.stage.weight [1];\nobject a.per.first;\nstack s.over[2] over pp { tensor w [1]; }");
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  EXPECT_EQ(item<ast::Tensor>(p.schema, 1).key.text, "vision.stage.weight");
  EXPECT_EQ(item<ast::Object>(p.schema, 2).key.text, "a.per.first");
}

TEST(Parser, AllForms) {
  const Parsed p = parse(
      "layout t;  # comment right after\n"
      "stack blocks[n] over pp first(1) last(n - 3) as keys when deep {\n"
      "  stack experts[e] over ep as axis { tensor w [e, 4] split(1 by tp * dp, 0 by ep2) dtype(bool); }\n"
      "  object state_blob;\n"
      "}\n"
      "tensor scalar_like [];\n"
      "common a.b: float; common c: string; common d: bool;\n");
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  const auto& blocks = *item<std::unique_ptr<ast::Stack>>(p.schema, 1);
  EXPECT_EQ(shape_of(*blocks.first_count), "1");
  EXPECT_EQ(shape_of(*blocks.last_count), "(n - 3)");
  ASSERT_TRUE(blocks.storage.has_value());
  EXPECT_TRUE(blocks.storage->as_keys);
  ASSERT_TRUE(blocks.condition.has_value());
  EXPECT_EQ(blocks.condition->param.text, "deep");
  ASSERT_EQ(blocks.body.size(), 2u);
  const auto& experts = *std::get<std::unique_ptr<ast::Stack>>(blocks.body[0]);
  ASSERT_TRUE(experts.storage.has_value());
  EXPECT_FALSE(experts.storage->as_keys);
  EXPECT_EQ(experts.first_count, nullptr);
  const auto& w = std::get<ast::Tensor>(experts.body.at(0));
  ASSERT_EQ(w.splits.size(), 2u);
  ASSERT_EQ(w.splits[0].axes.size(), 2u);
  EXPECT_EQ(w.splits[0].axes[1].text, "dp");
  expect_loc(w.splits[0].axes[1].loc, Loc{3, 70});
  EXPECT_EQ(w.splits[1].dim.value, 0);
  EXPECT_EQ(w.dtypes.at(0).text, "bool");
  EXPECT_FALSE(std::get<ast::Object>(blocks.body[1]).condition.has_value());
  EXPECT_TRUE(item<ast::Tensor>(p.schema, 2).shape.empty());
  EXPECT_EQ(item<ast::Common>(p.schema, 3).type, CommonDecl::Type::kFloat);
  EXPECT_EQ(item<ast::Common>(p.schema, 4).type, CommonDecl::Type::kString);
  EXPECT_EQ(item<ast::Common>(p.schema, 5).type, CommonDecl::Type::kBool);
}

TEST(Parser, PositionsCountATabAsOneColumn) {
  const Parsed p = parse("layout t;\n\ttensor\tx [1]  # tabbed\n\t\t split(0 by\ttp);");
  ASSERT_TRUE(p.diagnostics.all().empty()) << p.diagnostics.render();
  const auto& x = item<ast::Tensor>(p.schema, 1);
  expect_loc(x.key.loc, Loc{2, 9});
  expect_loc(x.splits[0].axes[0].loc, Loc{3, 15});
}

TEST(Parser, MissingSemicolonIsReportedAtTheNextTokenAndTheNextStatementSurvives) {
  const std::string src = "layout t;\ntensor a [1] split(0 by tp)\ntensor b [2];\n";
  const Parsed p = parse(src);
  EXPECT_THAT(syntax_errors(src),
              ElementsAre("3:1: expected ';' after the tensor declaration (found reserved word 'tensor')"));
  ASSERT_EQ(p.schema.items.size(), 2u);  // `a` is dropped, `b` is kept
  EXPECT_EQ(item<ast::Tensor>(p.schema, 1).key.text, "b");
}

TEST(Parser, MisspelledAttributeNamesTheAttributes) {
  EXPECT_THAT(
      syntax_errors("layout t;\ntensor a [1] splt(0 by tp);"),
      ElementsAre("2:14: unknown tensor attribute 'splt' (attributes: split, pad, stage, fused, tied, dtype, on; "
                  "conditions: when, unless)"));
  EXPECT_THAT(
      syntax_errors("layout t;\nstack s[2] ovr pp { }\nobject o pr(tp);"),
      ElementsAre("2:12: expected 'over' and the mesh axis the elements are spread over, or stage(first|last) (found "
                  "'ovr')",
                  "3:10: unknown object option 'pr' (options: per, on; conditions: when, unless)"));
}

// `over AXIS` (or stage(...)) starts every stack header, so first()/last()
// can never come first: the grammar itself rejects that.
TEST(Parser, PlacementNeedsOver) {
  EXPECT_THAT(
      syntax_errors("layout t;\nstack s[8] first(1) { }\n"),
      ElementsAre("2:12: expected 'over' and the mesh axis the elements are spread over, or stage(first|last) (found "
                  "reserved word "
                  "'first')"));
}

TEST(Parser, MisspelledStackOptionAndOddBytes) {
  EXPECT_THAT(
      syntax_errors("layout t;\nstack s[n] over pp frist(1) { }\ntensor \xc3\xa9 [1];\n"),
      ElementsAre("2:20: unknown stack option 'frist' (options: virtual, layout, first, last, as axis, as keys, on; "
                  "conditions: "
                  "when, unless)",
                  "3:8: expected the tensor key after 'tensor' (found byte 0xc3)"));
}

// Every prefix of the example, and the example without any one character,
// goes through the front end: no hang, no crash, every diagnostic in the file.
TEST(Parser, SurvivesEveryTruncationAndDeletion) {
  const std::string full = kGptSchema;
  const int lines = static_cast<int>(std::count(full.begin(), full.end(), '\n')) + 1;
  size_t broken = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    for (const std::string& variant : {full.substr(0, i), full.substr(0, i) + full.substr(i + 1)}) {
      const testing::Compiled p = testing::compile(variant);  // the checker runs too when it parses
      for (const Diagnostic& d : p.diagnostics.all()) {
        EXPECT_GE(d.loc.line, 1);
        EXPECT_LE(d.loc.line, lines);
        EXPECT_GE(d.loc.col, 1);
      }
      broken += p.diagnostics.all().empty() ? 0 : 1;
    }
  }
  EXPECT_GT(broken, full.size());  // most variants are broken, and reported
}

TEST(Parser, ErrorsInsideExpressionsAndLists) {
  EXPECT_THAT(
      syntax_errors("layout t;\n"
                    "tensor a [x + ];\n"
                    "tensor b [(x + 1];\n"
                    "tensor c [x,];\n"
                    "tensor d [1] split(0 by tp *);\n"
                    "tensor e [1] fused(q 1);\n"
                    "tensor f [1] stage(middle);\n"
                    "tensor g [99999999999999999999];\n"),
      ElementsAre("2:15: expected a number, a config parameter or '(' after the operator (found ']')",
                  "3:17: expected ')' to close '(' (found ']')", "4:13: expected a dimension after ',' (found ']')",
                  "5:29: expected a mesh axis in split(...) (found ')')",
                  "6:22: expected ':' after the fused part name (found '1')",
                  "7:20: expected 'first' or 'last' in stage(...) (found 'middle')",
                  "8:11: integer 99999999999999999999 does not fit in 63 bits"));
}

TEST(Parser, RecoversInsideEveryKindOfBlock) {
  const std::string src =
      "layout t;\n"
      "config {\n"
      "  a int;\n"  // 3: missing ':'
      "  b: int;\n"
      "}\n"
      "mesh tp pp;\n"  // 6: missing ','
      "stack s[b] over tp {\n"
      "  tensor x [1] pad(;\n"  // 8: missing dim
      "  tensor y [1];\n"
      "  frobnicate z;\n"  // 10: not a stack item
      "}\n"
      "optimizer adam {\n"
      "  state m like;\n"  // 13: missing 'param'
      "  scalar step;\n"
      "}\n"
      "transient r\n"  // 16: missing ';' (reported on the next line)
      "common it: int;\n";
  const Parsed p = parse(src);
  EXPECT_THAT(syntax_errors(src),
              ElementsAre("3:5: expected ':' after the config parameter name (found reserved word 'int')",
                          "6:9: expected ',' or ';' after the mesh axis (found 'pp')",
                          "8:20: expected a tensor dim (an integer) in pad(...) (found ';')",
                          "10:3: expected 'tensor', 'stack', 'object' or '}' in the stack body (found 'frobnicate')",
                          "13:15: expected 'param' after 'like' (found ';')",
                          "17:1: expected ';' after the transient declaration (found reserved word 'common')"));
  // What parsed cleanly is all there.
  ASSERT_EQ(p.schema.items.size(), 5u);
  EXPECT_EQ(item<ast::Config>(p.schema, 1).params.at(0).name.text, "b");
  const auto& s = *item<std::unique_ptr<ast::Stack>>(p.schema, 2);
  ASSERT_EQ(s.body.size(), 1u);
  EXPECT_EQ(std::get<ast::Tensor>(s.body[0]).key.text, "y");
  EXPECT_EQ(item<ast::Optimizer>(p.schema, 3).scalars.at(0).text, "step");
  EXPECT_EQ(item<ast::Common>(p.schema, 4).key.text, "it");
}

TEST(Parser, UnclosedBlocks) {
  // A block that meets a top-level keyword has lost its '}': reported there,
  // and the statement that follows is still parsed.
  const std::string src = "layout t;\nstack s[2] over pp {\n  tensor x [1];\ncommon it: int;\noptimizer o { scalar s;";
  const Parsed p = parse(src);
  EXPECT_THAT(syntax_errors(src),
              ElementsAre("4:1: expected '}' to close the stack body (found reserved word 'common')",
                          "5:24: expected '}' to close the optimizer block (found end of file)"));
  ASSERT_EQ(p.schema.items.size(), 2u);
  EXPECT_EQ(item<ast::Common>(p.schema, 1).key.text, "it");
}

TEST(Parser, StrayTokensAtTopLevel) {
  EXPECT_THAT(
      syntax_errors("layout t;\n}\ntensr x [1];\ntensor y [1];\n"),
      ElementsAre("2:1: expected a declaration (layout, config, mesh, tensor, stack, object, common, transient, "
                  "optimizer or mapping) (found '}')",
                  "3:1: expected a declaration (layout, config, mesh, tensor, stack, object, common, transient, "
                  "optimizer or mapping) (found 'tensr')"));
}

// Every later pass (and the AST's destructor) recurses on expressions and
// stacks: nesting is bounded, so no schema can overflow the stack.
TEST(Parser, NestingIsBoundedSoNoInputOverflowsTheStack) {
  std::string sum = "1";
  for (int i = 0; i < 100000; ++i) sum += "+1";
  EXPECT_THAT(syntax_errors("layout t;\ntensor w [" + sum + "];\n"),
              ElementsAre("2:410: the expression nests more than 200 operations; simplify it"));
  EXPECT_THAT(syntax_errors("layout t;\ntensor w [" + std::string(30000, '(') + "1" + std::string(30000, ')') + "];\n"),
              ElementsAre("2:211: more than 200 nested parentheses; simplify the expression"));
  std::string stacks = "layout t;\n";
  for (int i = 0; i < 30000; ++i) stacks += "stack s[1] over pp {\n";
  const std::vector<std::string> errors = syntax_errors(stacks);
  ASSERT_FALSE(errors.empty());
  EXPECT_EQ(errors.front(), "202:1: more than 200 nested stacks");
  std::string ok = "layout t;\ntensor w [" + std::string(200, '(') + "1";
  for (int i = 0; i < 199; ++i) ok += "+1";
  EXPECT_TRUE(syntax_errors(ok + std::string(200, ')') + "];\n").empty());
}

TEST(Parser, EmptyInputIsAnEmptySchema) {
  const Parsed p = parse("  # nothing but a comment\n");
  EXPECT_TRUE(p.diagnostics.all().empty());
  EXPECT_TRUE(p.schema.items.empty());
}

}  // namespace
}  // namespace distckpt::gen
