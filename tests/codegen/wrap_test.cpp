// wrap_lines(): generated code fitted to a column limit (40 here, so the
// cases stay short; the generator uses .clang-format's 120).
#include "emit/wrap.h"

#include <gtest/gtest.h>

namespace distckpt::gen {
namespace {

std::string wrap40(const std::string& text) { return wrap_lines(text, 40); }

TEST(Wrap, ShortLinesStayAsTheyAre) {
  const std::string text = "int a;\n\n  // short\nint b;";  // no newline at the end either
  EXPECT_EQ(wrap40(text), text);
}

TEST(Wrap, CommentsReflowWithAHangingIndent) {
  EXPECT_EQ(wrap40("  // alpha beta gamma delta epsilon zeta eta theta\n"),
            "  // alpha beta gamma delta epsilon zeta\n"
            "  //     eta theta\n");
}

TEST(Wrap, CommentsKeepBracketedGroupsTogether) {
  EXPECT_EQ(wrap40("// tensor w [a, b] split(0 by tp) fused(q: a, k: b)\n"),
            "// tensor w [a, b] split(0 by tp)\n"
            "//     fused(q: a, k: b)\n");
}

TEST(Wrap, CodeBreaksAfterACommaAlignedWithItsBracket) {
  EXPECT_EQ(wrap40("  call(first_argument, second_argument, third);\n"),
            "  call(first_argument, second_argument,\n"
            "       third);\n");
}

TEST(Wrap, AssignmentsBreakAfterTheEqualsSignWhenTheValueThenFits) {
  EXPECT_EQ(wrap40("  const std::string name = \"abc\" + f(i) + \".\";\n"),
            "  const std::string name =\n"
            "      \"abc\" + f(i) + \".\";\n");
}

TEST(Wrap, CodeBreaksAfterABracketWhenNoCommaFits) {
  // The commas inside the string literal are no break points.
  EXPECT_EQ(wrap40("    value = function_name(\"a, b, c, d, e\", x);\n"),
            "    value = function_name(\n"
            "        \"a, b, c, d, e\", x);\n");
}

TEST(Wrap, OneLineFunctionBodiesGetTheirOwnLines) {
  EXPECT_EQ(wrap40("  bool holds_x() const { return x_.has_value(); }\n"),
            "  bool holds_x() const {\n"
            "    return x_.has_value();\n"
            "  }\n");
}

TEST(Wrap, TrailingCommentsMoveAbove) {
  EXPECT_EQ(wrap40("  int64_t x;  // a comment that is far too long here\n"),
            "  // a comment that is far too long here\n"
            "  int64_t x;\n");
}

TEST(Wrap, PreprocessorLinesRawStringsAndUnbreakableLinesStay) {
  const std::string text =
      "#include \"a_very_long_header_name_that_goes_on_and_on.h\"\n"
      "const char* k = R\"s(line one, which, is, long, enough, to, wrap\n"
      "second, raw, line, also, long, enough, to, wrap)s\";\n"
      "  an_identifier_that_is_simply_far_too_long_to_fit;\n";
  EXPECT_EQ(wrap40(text), text);
}

}  // namespace
}  // namespace distckpt::gen
