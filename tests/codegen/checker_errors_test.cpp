// Checker, one test per error class: the exact message and the line:col of
// the token it points at. Sources start with `layout t;` on line 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "frontend_test_util.h"

namespace distckpt::gen {
namespace {

using testing::compile;
using ::testing::ElementsAre;
using testing::errors_of;

TEST(CheckerErrors, LayoutDeclaration) {
  EXPECT_THAT(errors_of("mesh tp;\n"),
              ElementsAre("1:1: missing 'layout NAME;': a schema starts by naming its layout (e.g. 'layout gpt;')"));
  EXPECT_THAT(errors_of(""),
              ElementsAre("1:1: missing 'layout NAME;': a schema starts by naming its layout (e.g. 'layout gpt;')"));
  EXPECT_THAT(errors_of("mesh tp;\nlayout t;\n"),
              ElementsAre("2:1: 'layout t;' must be the first declaration of the schema"));
  EXPECT_THAT(
      errors_of("layout a;\n  layout b;\n"),
      ElementsAre("2:3: more than one 'layout' declaration (the first is at 1:1); a schema describes one layout"));
}

TEST(CheckerErrors, MeshDeclaration) {
  EXPECT_THAT(errors_of("layout t;\nmesh tp;\nmesh pp;\n"),
              ElementsAre("3:1: more than one 'mesh' declaration (the first is at 2:1); list every axis in one 'mesh' "
                          "line"));
  EXPECT_THAT(errors_of("layout t;\nmesh tp, pp, tp;\n"),
              ElementsAre("2:14: duplicate mesh axis 'tp' (already declared at 2:6)"));
  // Reported once, at the first use, however many axes are used.
  EXPECT_THAT(errors_of("layout t;\ntensor w [4] split(0 by tp);\nobject o per(dp);\n"),
              ElementsAre("2:25: the schema declares no mesh, but 'tp' is used as a mesh axis; add a 'mesh' "
                          "declaration listing the parallel axes (e.g. 'mesh tp;')"));
}

TEST(CheckerErrors, ConfigParameters) {
  EXPECT_THAT(errors_of("layout t;\nconfig {\n  hidden: int;\n  hidden: int = 2;\n}\ntensor w [hidden];\n"),
              ElementsAre("4:3: duplicate config parameter 'hidden' (first declared at 3:3)"));
  EXPECT_THAT(errors_of("layout t;\nconfig { hidden: int; heads: int; }\ntensor w [hiden / heads, hidden * nope];\n"),
              ElementsAre("3:11: unknown config parameter 'hiden' (did you mean 'hidden'?)",
                          "3:35: unknown config parameter 'nope'; declare it in the config block"));
}

TEST(CheckerErrors, DefaultCycles) {
  EXPECT_THAT(
      errors_of("layout t;\nconfig {\n  a: int = b + 1;\n  b: int = 2 * a;\n  c: int = c;\n}\ntensor w [a, b, c];\n"),
      ElementsAre("3:3: config default cycle: a -> b -> a", "5:3: config default cycle: c -> c"));
}

TEST(CheckerErrors, UnknownMeshAxisEverywhere) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh tp, pp, dp;\n"
                        "tensor w [4] split(0 by tq);\n"
                        "stack s[n] over pq { object o per(dq); }\n"
                        "optimizer adam { distributed over db; }\n"),
              ElementsAre("4:25: unknown mesh axis 'tq' (mesh axes: tp, pp, dp)",
                          "5:17: unknown mesh axis 'pq' (mesh axes: tp, pp, dp)",
                          "5:35: unknown mesh axis 'dq' (mesh axes: tp, pp, dp)",
                          "6:35: unknown mesh axis 'db' (mesh axes: tp, pp, dp)"));
}

TEST(CheckerErrors, SplitsUseEachAxisAndDimOnce) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh tp, pp, dp;\n"
                        "tensor a [4, 4] split(0 by tp, 1 by dp * tp);\n"
                        "tensor b [4, 4] split(0 by tp) split(0 by dp);\n"
                        "tensor c [4, 4] split(2 by tp);\n"
                        "stack s[n] over pp { tensor d [4] split(0 by pp); }\n"),
              ElementsAre("4:42: mesh axis 'tp' splits tensor 'a' twice (first at 4:28); an axis may split at most "
                          "one dim",
                          "5:38: dim 0 of tensor 'b' is split twice; split it over several axes at once, as in "
                          "'split(0 by tp * dp)'",
                          "6:23: split dim 2 is out of range for tensor 'c' of rank 2 (dims 0..1)",
                          "7:46: mesh axis 'pp' already places the enclosing stack 's'; tensor 's.d' cannot also be "
                          "split over it"));
}

TEST(CheckerErrors, KnownExtentsMustDivideAndBePositive) {
  EXPECT_THAT(errors_of("layout t;\nconfig { x: int; a: int = 10; b: int = 3; z: int = 0; }\n"
                        "tensor p [10 / 3, a / b, x / 0, x / z];\n"
                        "tensor q [0, a - 12, 2 * (a / 5 - 2)];\n"),
              ElementsAre("3:11: '10 / 3' is not an exact division",
                          "3:19: 'a / b' is not an exact division (10 / 3 with the config defaults)",
                          "3:26: division by zero in 'x / 0'",
                          "3:33: division by zero in 'x / z' (z = 0 with the config defaults)",
                          "4:11: dim 0 of tensor 'q' is 0; it must be positive",
                          "4:14: dim 1 of tensor 'q' is -2 ('a - 12' with the config defaults); it must be positive",
                          "4:22: dim 2 of tensor 'q' is 0 ('2 * (a / 5 - 2)' with the config defaults); it must be "
                          "positive"));
  EXPECT_THAT(errors_of("layout t;\nconfig {\n  h: int = 7 / 2;\n  big: int = 9223372036854775807 + 1;\n}\n"
                        "tensor w [h, big, (0 - 9223372036854775807 - 1) / (0 - 1)];\n"),
              ElementsAre("3:12: '7 / 2' is not an exact division",
                          "4:14: '9223372036854775807 + 1' overflows a 64-bit integer",
                          "6:19: '(0 - 9223372036854775807 - 1) / (0 - 1)' overflows a 64-bit integer"));
}

TEST(CheckerErrors, DuplicateKeys) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; p: int; }\nmesh pp;\n"
                        "stack s[n] over pp { tensor w [1]; }\n"
                        "tensor s.w [2];\n"
                        "stack k[n] over pp as keys { object o; }\n"
                        "object k.o when p;\n"
                        "tensor x [1] when p;\n"
                        "tensor x [1] when p;\n"),
              ElementsAre("5:8: duplicate key 's.w' (also declared at 4:29); two declarations may share a key only "
                          "under complementary conditions ('when p' / 'unless p')",
                          "7:8: duplicate key 'k.o' (also declared at 6:37); two declarations may share a key only "
                          "under complementary conditions ('when p' / 'unless p')",
                          "9:8: duplicate key 'x' (also declared at 8:8); two declarations may share a key only "
                          "under complementary conditions ('when p' / 'unless p')"));
  // Complementary conditions, also when one comes from an enclosing stack.
  const auto ok = compile(
      "layout t;\nconfig { n: int; p: int; }\nmesh pp;\n"
      "stack s[n] over pp when p { tensor w [1]; }\ntensor s.w [2] unless p;\n"
      "tensor x [1] when p;\ntensor x [1] unless p;\n");
  EXPECT_TRUE(ok.layout.has_value()) << ok.diagnostics.render();
}

TEST(CheckerErrors, DuplicateAccessors) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh pp;\n"
                        "tensor a.b_c [1];\ntensor a_b.c [1];\n"
                        "stack layers[n] over pp { tensor w [1]; }\nobject layers;\n"),
              ElementsAre("5:8: tensor 'a_b.c' and tensor 'a.b_c' (declared at 4:8) both become the C++ name "
                          "'a_b_c'; rename one of them",
                          "7:8: object 'layers' and stack 'layers' (declared at 6:7) both become the C++ name "
                          "'layers'; rename one of them"));
}

TEST(CheckerErrors, Pad) {
  EXPECT_THAT(errors_of("layout t;\ntensor w [4, 4] pad(2);\ntensor v [4] pad(0) pad(0);\n"),
              ElementsAre("2:21: pad(2) is out of range for tensor 'w' of rank 2 (dims 0..1)",
                          "3:25: tensor 'v' has more than one pad(...); give it once"));
}

TEST(CheckerErrors, Stage) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh tp, pp;\n"
                        "stack s[n] over pp { tensor w [1] stage(first); }\n"
                        "tensor e [4] split(0 by pp) stage(last);\n"),
              ElementsAre("4:35: stage(first) applies only to top-level tensors; tensor 's.w' is inside stack 's', "
                          "which already places it",
                          "5:29: stage(last) places tensor 'e' on one stage of 'pp', so it cannot also be split over "
                          "'pp'"));
  EXPECT_THAT(errors_of("layout t;\nmesh pp;\ntensor e [1] stage(first);\n"),
              ElementsAre("3:14: stage(first) needs a stack of layers spread over a mesh axis, but the layout has no "
                          "top-level stack"));
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh pp, vp;\n"
                        "stack a[n] over pp { tensor w [1]; }\nstack b[n] over vp { tensor w [1]; }\n"
                        "tensor e [1] stage(last);\n"),
              ElementsAre("6:14: stage(last) is ambiguous: the top-level stacks are spread over different mesh axes "
                          "(pp, vp); stack the layers over one axis"));
}

TEST(CheckerErrors, Fused) {
  EXPECT_THAT(errors_of("layout t;\nmesh tp;\n"
                        "tensor a [128] split(0 by tp) fused(q: 64, k: 32);\n"
                        "tensor b [4] fused(x: 2, y: 2);\n"
                        "tensor c [4] split(0 by tp) fused(x: 4);\n"
                        "tensor d [4] split(0 by tp) fused(x: 2, x: 2);\n"
                        "tensor e [4] split(0 by tp) fused(x: 4, y: 0);\n"),
              ElementsAre("3:31: fused parts add up to 96 but dim 0 is 128; the parts of tensor 'a' must cover its "
                          "split dim exactly",
                          "4:14: fused(...) on tensor 'b' needs a split: its parts are concatenated along the split "
                          "dim",
                          "5:29: fused(...) on tensor 'c' needs at least two parts",
                          "6:41: duplicate fused part 'x' in tensor 'd' (first at 6:35)",
                          "7:44: the extent of fused part 'y' of tensor 'e' is 0; it must be positive"));
}

TEST(CheckerErrors, Tied) {
  EXPECT_THAT(errors_of("layout t;\nconfig { p: int; }\n"
                        "tensor embedding.weight [8, 4];\n"
                        "tensor out [8, 4] tied(embeding.weight);\n"
                        "tensor out2 [8] tied(embedding.weight);\n"
                        "tensor out3 [8, 4] tied(out) when p;\n"),
              ElementsAre("4:24: tied(embeding.weight): no tensor has the key 'embeding.weight' (did you mean "
                          "'embedding.weight'?)",
                          "5:22: tied(embedding.weight): tensor 'out2' has rank 1 but 'embedding.weight' has rank 2; "
                          "a tied tensor has the rank of its main copy",
                          "6:25: tied(out): 'out' is itself tied; tie to the key of the main copy"));
}

TEST(CheckerErrors, Dtype) {
  EXPECT_THAT(errors_of("layout t;\ntensor w [1] dtype(bfloat);\n"),
              ElementsAre("2:20: unknown dtype 'bfloat' (did you mean 'bfloat16'?); dtypes are float64, float32, "
                          "float16, bfloat16, int64, int32, int16, int8, uint8, bool"));
}

TEST(CheckerErrors, Stacks) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh pp, ep;\n"
                        "stack a[n] over pp { stack b[n] over pp { tensor w [1]; } }\n"
                        "stack c[0] over ep { tensor w [1]; }\n"
                        "stack d[4] over ep first(3) last(2) { tensor w [1]; }\n"
                        "stack e[n] over ep first(1 - 2) { tensor w [1]; }\n"),
              ElementsAre("4:38: stack 'a.b' is spread over 'pp', which already places the enclosing stack 'a'; a "
                          "nested stack needs another axis",
                          "5:9: the element count of stack 'c' is 0; it must be positive",
                          "6:7: stack 'd' places 5 elements on its first and last stage but has only 4",
                          "7:26: first(...) of stack 'e' is -1 ('1 - 2'); it must not be negative"));
}

TEST(CheckerErrors, ObjectsPerAxes) {
  EXPECT_THAT(errors_of("layout t;\nconfig { n: int; }\nmesh tp, pp;\n"
                        "object a per(tp, tp);\n"
                        "stack s[n] over pp { object b per(pp); }\n"),
              ElementsAre("4:18: mesh axis 'tp' appears twice in per(...) of object 'a'",
                          "5:35: mesh axis 'pp' already places the enclosing stack 's'; object 's.b' cannot also be "
                          "per(pp)"));
}

TEST(CheckerErrors, CommonAndTransientKeys) {
  EXPECT_THAT(errors_of("layout t;\ntensor step [1];\ncommon step: int;\ncommon it: int;\ntransient it;\n"
                        "transient rng;\ntransient rng;\n"),
              ElementsAre("3:8: duplicate key 'step' (also declared at 2:8); two declarations may share a key only "
                          "under complementary conditions ('when p' / 'unless p')",
                          "5:11: duplicate key 'it' (also declared at 4:8); two declarations may share a key only "
                          "under complementary conditions ('when p' / 'unless p')",
                          "7:11: duplicate key 'rng' (also declared at 6:11); two declarations may share a key only "
                          "under complementary conditions ('when p' / 'unless p')"));
}

TEST(CheckerErrors, Optimizers) {
  EXPECT_THAT(errors_of("layout t;\nmesh dp, ep;\n"
                        "optimizer adam {\n  state m, v, m like param;\n  scalar v;\n"
                        "  distributed over dp;\n  distributed over ep;\n}\n"
                        "optimizer adam { }\n"),
              ElementsAre("4:15: duplicate name 'm' in optimizer 'adam' (first declared at 4:9); state and scalar "
                          "names must be unique",
                          "5:10: duplicate name 'v' in optimizer 'adam' (first declared at 4:12); state and scalar "
                          "names must be unique",
                          "7:20: optimizer 'adam' has more than one 'distributed over' line; its state is distributed "
                          "over one axis",
                          "9:11: duplicate optimizer 'adam' (first declared at 3:11)"));
}

TEST(CheckerErrors, Conditions) {
  EXPECT_THAT(errors_of("layout t;\nconfig { tie: int; n: int; }\nmesh pp;\n"
                        "tensor w [1] when tei;\nobject o unless nothing;\nstack s[n] over pp when ti { }\n"),
              ElementsAre("4:19: unknown config parameter 'tei' (did you mean 'tie'?)",
                          "5:17: unknown config parameter 'nothing'; declare it in the config block",
                          "6:25: unknown config parameter 'ti' (did you mean 'tie'?)"));
}

TEST(CheckerErrors, EveryErrorOfAFileInOneRun) {
  const auto c = compile(
      "layout t;\nconfig { a: int; a: int; }\nmesh tp;\n"
      "tensor w [b] split(0 by pp) dtype(f32);\nunused_warning_is_not_an_error;\n");
  EXPECT_FALSE(c.layout.has_value());
  // (The last line is a syntax error, so the checker did not run.)
  EXPECT_EQ(c.diagnostics.all().size(), 1u);
  EXPECT_THAT(errors_of("layout t;\nconfig { a: int; a: int; }\nmesh tp;\ntensor w [b] split(0 by pp) dtype(f32);\n"),
              ElementsAre("2:18: duplicate config parameter 'a' (first declared at 2:10)",
                          "4:11: unknown config parameter 'b'; declare it in the config block",
                          "4:25: unknown mesh axis 'pp' (mesh axes: tp)",
                          "4:35: unknown dtype 'f32'; dtypes are float64, float32, float16, bfloat16, int64, int32, "
                          "int16, int8, uint8, bool"));
}

}  // namespace
}  // namespace distckpt::gen
