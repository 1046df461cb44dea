#include "emit/printer.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace distckpt::gen {
namespace {

TEST(Printer, SubstitutesNamedVariablesAndIndents) {
  std::string out;
  Printer p(&out);
  p.print("class $name$ {\n", "name", "Model");
  {
    Printer::Indent indent(p);
    p.print("int $field$ = $value$;\n\n$$keep\n", "field", "x", "value", "3");
  }
  p.print("};\n");
  EXPECT_EQ(out, "class Model {\n  int x = 3;\n\n  $keep\n};\n");
}

TEST(Printer, EmitDropsTheTemplatesIndentation) {
  std::string out;
  Printer p(&out);
  p.print("namespace n {\n");
  p.indent();
  p.emit(R"tmpl(
      // $what$
      struct $name$ {

        int x;
      };
  )tmpl",
         "what", "a struct", "name", "S");
  EXPECT_EQ(out, "namespace n {\n  // a struct\n  struct S {\n\n    int x;\n  };\n");
}

TEST(Printer, LoneVariablesAreIndentedBlocks) {
  std::string out;
  Printer p(&out);
  p.emit(R"tmpl(
    class C {
     public:
      $members$
      $empty$
     private:
      int $field$;  // $$1
    };
  )tmpl",
         "members", "int a();\n\nint b();\n", "empty", "", "field", "f_");
  // The block's value is printed verbatim: no $variables$ in it are expanded.
  EXPECT_EQ(out, "class C {\n public:\n  int a();\n\n  int b();\n private:\n  int f_;  // $1\n};\n");
  EXPECT_EQ(Printer::capture([](Printer& q) { q.emit("\n  $v$\n", "v", "$x$"); }), "$x$\n");
}

TEST(Printer, UnknownVariableIsAnEmitterBug) {
  std::string out;
  Printer p(&out);
  EXPECT_THROW(p.print("$missing$"), std::logic_error);
  EXPECT_THROW(p.print("$open"), std::logic_error);
  EXPECT_THROW(p.outdent(), std::logic_error);
  EXPECT_THROW(p.emit("\n  $missing$\n"), std::logic_error);
}

}  // namespace
}  // namespace distckpt::gen
