// Diagnostics::render(): sorted by position, "file:line:col: error: msg",
// the source line and a caret under the column (tabs kept so it lines up).
#include "diagnostics.h"

#include <gtest/gtest.h>

#include "frontend_test_util.h"

namespace distckpt::gen {
namespace {

TEST(Diagnostics, RendersSortedWithSourceLineAndCaret) {
  Diagnostics d("gpt.shard", "layout gpt;\nmesh tp, tq;\ntensor w [1];\n");
  d.warning(Loc{3, 8}, "second");
  d.error(Loc{2, 10}, "first");
  d.error(Loc{3, 8}, "same position: kept in report order");
  EXPECT_TRUE(d.has_errors());
  EXPECT_EQ(d.render(),
            "gpt.shard:2:10: error: first\n"
            "mesh tp, tq;\n"
            "         ^\n"
            "gpt.shard:3:8: warning: second\n"
            "tensor w [1];\n"
            "       ^\n"
            "gpt.shard:3:8: error: same position: kept in report order\n"
            "tensor w [1];\n"
            "       ^\n");
}

TEST(Diagnostics, NotesFollowTheirErrorWhereverTheyPoint) {
  Diagnostics d("t.shard", "layout t;\ntensor w [1];\ntensor x [1];\ntensor w [2];\n");
  d.error(Loc{4, 8}, "duplicate key 'w'").note(Loc{2, 8}, "first declared here");
  d.error(Loc{3, 8}, "between");
  EXPECT_EQ(d.render(),
            "t.shard:3:8: error: between\n"
            "tensor x [1];\n"
            "       ^\n"
            "t.shard:4:8: error: duplicate key 'w'\n"
            "tensor w [2];\n"
            "       ^\n"
            "t.shard:2:8: note: first declared here\n"
            "tensor w [1];\n"
            "       ^\n");
  ASSERT_EQ(d.all().size(), 2u);  // notes are not diagnostics of their own
  EXPECT_EQ(d.all()[0].notes.at(0).severity, Diagnostic::Severity::kNote);
}

TEST(Diagnostics, WarningsAloneAreNotErrors) {
  Diagnostics d("a.shard", "layout a;\n");
  EXPECT_FALSE(d.has_errors());
  d.warning(Loc{1, 1}, "w");
  EXPECT_FALSE(d.has_errors());
  EXPECT_EQ(d.all().size(), 1u);
}

TEST(Diagnostics, TabsInTheSourceLineStayInTheCaretLine) {
  Diagnostics d("t.shard", "layout t;\n\ttensor\tx [1];\n");
  d.error(Loc{2, 9}, "at x");
  EXPECT_EQ(d.render(), "t.shard:2:9: error: at x\n\ttensor\tx [1];\n\t      \t^\n");
}

TEST(Diagnostics, CrlfLinesAndPositionsPastTheText) {
  Diagnostics d("t.shard", "layout t;\r\nmesh tp;\r\n");
  d.error(Loc{2, 6}, "crlf");
  d.error(Loc{3, 1}, "at end of file");
  d.error(Loc{0, 0}, "no position");
  EXPECT_EQ(d.render(),
            "t.shard: error: no position\n"
            "t.shard:2:6: error: crlf\nmesh tp;\n     ^\n"
            "t.shard:3:1: error: at end of file\n\n^\n");
}

TEST(Diagnostics, RenderedCheckerErrors) {
  // The error of docs/SCHEMA.md, on line 12 as there.
  const std::string source =
      "layout gpt;\nconfig {\n  hidden: int;\n  layers: int;\n}\nmesh tp, pp, dp;\n\n\n\n"
      "stack decoder.layers[layers] over pp {\n  tensor input_layernorm.weight [hidden];\n"
      "  tensor self_attention.linear_proj.weight [hidden, hidden] split(1 by tq);\n}\n";
  const testing::Compiled c = testing::compile(source);
  EXPECT_FALSE(c.layout.has_value());
  EXPECT_EQ(c.diagnostics.render(),
            "test.shard:12:72: error: unknown mesh axis 'tq' (mesh axes: tp, pp, dp)\n"
            "  tensor self_attention.linear_proj.weight [hidden, hidden] split(1 by tq);\n"
            "                                                                       ^\n");

  const testing::Compiled syntax = testing::compile("layout t;\n\ttensor a [1] split(0 by tp)\n\ttensor b [1];\n");
  EXPECT_EQ(syntax.diagnostics.render(),
            "test.shard:3:2: error: expected ';' after the tensor declaration (found reserved word 'tensor')\n"
            "\ttensor b [1];\n"
            "\t^\n");

  const testing::Compiled cycle =
      testing::compile("layout t;\nconfig { a: int = b; b: int = a; spare: int; }\ntensor w [a];\n");
  EXPECT_EQ(cycle.diagnostics.render(),
            "test.shard:2:10: error: config default cycle: a -> b -> a\n"
            "config { a: int = b; b: int = a; spare: int; }\n"
            "         ^\n"
            "test.shard:2:34: warning: config parameter 'spare' is never used\n"
            "config { a: int = b; b: int = a; spare: int; }\n"
            "                                 ^\n");
}

}  // namespace
}  // namespace distckpt::gen
