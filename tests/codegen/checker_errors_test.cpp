// Checker errors that an annotated schema cannot express. Every other error
// class is a file in errors/, checked by annotated_errors_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "frontend_test_util.h"

namespace distckpt::gen {
namespace {

using testing::compile;
using ::testing::ElementsAre;
using testing::errors_of;

// An empty file has no line to annotate.
TEST(CheckerErrors, EmptySchemaHasNoLayout) {
  EXPECT_THAT(errors_of(""),
              ElementsAre("1:1: missing 'layout NAME;': a schema starts by naming its layout (e.g. 'layout gpt;')"));
}

// Valid schemas are no error cases: complementary conditions may share a
// key, also when one comes from an enclosing stack.
TEST(CheckerErrors, ComplementaryConditionsShareAKey) {
  const auto ok = compile(
      "layout t;\nconfig { n: int; p: int; }\nmesh pp;\n"
      "stack s[n] over pp when p { tensor w [1]; }\ntensor s.w [2] unless p;\n"
      "tensor x [1] when p;\ntensor x [1] unless p;\n");
  EXPECT_TRUE(ok.layout.has_value()) << ok.diagnostics.render();
}

// After a syntax error the checker does not run: the whole count matters.
TEST(CheckerErrors, SyntaxErrorsStopBeforeTheChecker) {
  const auto c = compile(
      "layout t;\nconfig { a: int; a: int; }\nmesh tp;\n"
      "tensor w [b] split(0 by pp) dtype(f32);\nunused_warning_is_not_an_error;\n");
  EXPECT_FALSE(c.layout.has_value());
  // (The last line is a syntax error, so the checker did not run.)
  EXPECT_EQ(c.diagnostics.all().size(), 1u);
}

}  // namespace
}  // namespace distckpt::gen
