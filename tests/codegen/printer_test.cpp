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

TEST(Printer, UnknownVariableIsAnEmitterBug) {
  std::string out;
  Printer p(&out);
  EXPECT_THROW(p.print("$missing$"), std::logic_error);
  EXPECT_THROW(p.print("$open"), std::logic_error);
  EXPECT_THROW(p.outdent(), std::logic_error);
}

}  // namespace
}  // namespace distckpt::gen
