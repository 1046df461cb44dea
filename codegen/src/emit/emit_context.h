// What the emitters of every construct share: the layout, and how its
// expressions, conditions and mesh axes are spelled in the generated C++.
#pragma once

#include <string>
#include <vector>

#include "emit/printer.h"
#include "ir/ir.h"

namespace distckpt::gen {

class EmitContext {
 public:
  explicit EmitContext(const Layout& layout) : layout_(layout) {}

  const Layout& layout() const { return layout_; }

  // C++ over the resolved config `c` ("(c.heads + 2 * c.kv_groups) * c.head_dim");
  // divisions go through exact_div so a bad config fails with the schema text.
  std::string cpp(const Expr& expr) const;
  // As written in the schema ("(heads + 2 * kv_groups) * head_dim").
  std::string schema(const Expr& expr) const;
  std::string axis(int index) const { return layout_.mesh_axes[index]; }  // "tp"
  std::string axis_constant(int index) const;                             // "kTp"
  // The arguments of distckpt::layout::MeshCoords: every axis name, quoted,
  // and its coordinate in the generated Mesh ("mesh.tp, mesh.pp").
  std::string axis_names() const;
  std::string axis_coords() const;
  // "kExpertsMesh": the index of a mesh in MeshCoords::meshes.
  std::string mesh_constant(int index) const;
  bool several_meshes() const { return layout_.meshes.size() > 1; }
  // With virtual pipeline stages, parameter names start with their model
  // chunk's prefix: these C++ expressions give the first and the last chunk's
  // ("" without chunks).
  std::string first_chunk_prefix() const;
  std::string last_chunk_prefix() const;
  // "c.tie != 0" for `when tie`, "" when unconditional.
  std::string condition_test(const Condition& condition) const;
  // " when tie" / " unless tie" as in the schema, "" when unconditional.
  std::string condition_text(const Condition& condition) const;

 private:
  std::string cpp(const Expr& expr, int parent_precedence) const;

  const Layout& layout_;
};

std::string quoted(const std::string& s);        // a C++ string literal
std::string common_type(CommonDecl::Type type);  // the C++ type of a common value
// "a, b, c" of the non-empty parts, each mapped through `quote` when given.
std::string comma_list(const std::vector<std::string>& parts, std::string (*quote)(const std::string&) = nullptr);

// Wraps what is printed in its lifetime in `if (tests) {` ... `}`, joining
// the non-empty tests with &&; prints nothing extra when all are empty.
class Guard {
 public:
  Guard(Printer& p, const std::vector<std::string>& tests);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  Printer& p_;
  bool open_ = false;
};

}  // namespace distckpt::gen
