// Mesh axes, checkpoint keys and C++ names: the checker's name tables.
#include "check/checker_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "check/cpp_identifiers.h"
#include "check/names.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {
namespace {

// Two declarations never coexist when one requires a parameter non-zero and
// the other requires it zero (`when p` / `unless p`).
bool exclusive(const std::vector<Condition>& a, const std::vector<Condition>& b) {
  for (const Condition& x : a) {
    for (const Condition& y : b) {
      if (x.param >= 0 && x.param == y.param && x.negate != y.negate) return true;
    }
  }
  return false;
}

// A mesh axis names a member of Mesh and, as kAxis, a constant next to
// kSchema in the generated source.
void check_axis_name(Diagnostics& diag, const ast::Name& axis, std::map<std::string, Loc>& constants) {
  const std::string problem = identifier_problem(axis.text);
  if (!problem.empty()) {
    diag.error(axis.loc,
               fmt::format("mesh axis '{}' becomes the C++ name '{}'{}; rename it", axis.text, axis.text, problem));
    return;
  }
  if (axis.text == "Mesh") {
    diag.error(axis.loc,
               "mesh axis 'Mesh' would generate the member 'Mesh::Mesh', which clashes with the struct name "
               "'Mesh'; rename it");
    return;
  }
  const std::string constant = axis_constant(axis.text);
  if (constant == "kSchema") {
    diag.error(axis.loc, fmt::format("mesh axis '{}' becomes the C++ constant 'kSchema', which clashes with the schema "
                                     "text kSchema; rename it",
                                     axis.text));
    return;
  }
  const auto [first, fresh] = constants.emplace(constant, axis.loc);
  if (!fresh) {
    diag.error(axis.loc, fmt::format("mesh axis '{}' becomes the C++ constant '{}', as does an axis before it; rename "
                                     "one of them",
                                     axis.text, constant))
        .note(first->second, "first declared here");
  }
}

}  // namespace

const EnclosingStack* Scope::stack_over(int axis) const {
  for (const EnclosingStack& stack : stacks) {
    if (stack.axis == axis) return &stack;
  }
  return nullptr;
}

void CheckContext::declare_mesh(const ast::Mesh& mesh) {
  mesh_declared_ = true;
  MeshDecl decl{mesh.name ? mesh.name->text : "default", {}, mesh.name ? mesh.name->loc : mesh.loc};
  std::map<std::string, Loc> in_this_mesh;
  for (const ast::Name& axis : mesh.axes) {
    const auto [seen, fresh_here] = in_this_mesh.emplace(axis.text, axis.loc);
    if (!fresh_here) {
      diag.error(axis.loc, fmt::format("duplicate mesh axis '{}'", axis.text))
          .note(seen->second, "first declared here");
      continue;
    }
    const auto [it, fresh] = axes_by_name_.emplace(axis.text, static_cast<int>(layout.mesh_axes.size()));
    if (fresh) {  // an axis of an earlier mesh is shared, not declared again
      layout.mesh_axes.push_back(axis.text);
      check_axis_name(diag, axis, axis_constants_);
    }
    decl.axes.push_back(it->second);
  }
  layout.meshes.push_back(std::move(decl));
}

std::optional<int> CheckContext::resolve_mesh(const ast::Name& name) {
  for (size_t i = 0; i < layout.meshes.size(); ++i) {
    if (layout.meshes[i].name == name.text) return static_cast<int>(i);
  }
  std::vector<std::string> names;
  for (const MeshDecl& m : layout.meshes) names.push_back(m.name);
  diag.error(name.loc, fmt::format("unknown mesh '{}'{}", name.text,
                                   names.empty() ? std::string("; declare it with 'mesh NAME: AXES;'")
                                                 : fmt::format(" (meshes: {})", join_names(names))));
  return std::nullopt;
}

bool CheckContext::on_mesh(int axis, int mesh) const {
  if (mesh < 0 || static_cast<size_t>(mesh) >= layout.meshes.size()) return true;  // reported elsewhere
  const std::vector<int>& axes = layout.meshes[mesh].axes;
  return std::find(axes.begin(), axes.end(), axis) != axes.end();
}

std::string CheckContext::describe_mesh(int mesh) const {
  std::vector<std::string> axes;
  for (const int axis : layout.meshes.at(mesh).axes) axes.push_back(layout.mesh_axes[axis]);
  return fmt::format("mesh {} ({})", layout.meshes[mesh].name, fmt::join(axes, ", "));
}

bool CheckContext::check_axis_on_mesh(int axis, int mesh, Loc loc, const std::string& what, bool enclosing) {
  if (on_mesh(axis, mesh)) return true;
  std::string hint;
  if (enclosing) {
    hint = fmt::format("; add '{}' to mesh {} (meshes naming one axis share it)", layout.mesh_axes[axis],
                       layout.meshes[mesh].name);
  }
  for (size_t m = 0; hint.empty() && m < layout.meshes.size(); ++m) {
    if (on_mesh(axis, static_cast<int>(m))) {
      hint = fmt::format("; put it on mesh {} with 'on {}'", layout.meshes[m].name, layout.meshes[m].name);
      break;
    }
  }
  diag.error(loc, fmt::format("{} uses mesh axis '{}', which is not on {}, where it lives{}", what,
                              layout.mesh_axes[axis], describe_mesh(mesh), hint));
  return false;
}

std::optional<int> CheckContext::find_axis(const std::string& name) const {
  const auto it = axes_by_name_.find(name);
  if (it == axes_by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<int> CheckContext::resolve_axis(const ast::Name& name) {
  if (!mesh_declared_) {
    // One error says it all; every later axis would fail for the same reason.
    if (!reported_missing_mesh_) {
      diag.error(name.loc, fmt::format("the schema declares no mesh, but '{}' is used as a mesh axis; add a 'mesh' "
                                       "declaration listing the parallel axes (e.g. 'mesh {};')",
                                       name.text, name.text));
      reported_missing_mesh_ = true;
    }
    return std::nullopt;
  }
  const std::optional<int> axis = find_axis(name.text);
  if (!axis) {
    diag.error(name.loc,
               fmt::format("unknown mesh axis '{}' (mesh axes: {})", name.text, join_names(layout.mesh_axes)));
  }
  return axis;
}

void CheckContext::claim_key(const std::string& full_key, KeyUse use) {
  std::vector<KeyUse>& uses = keys_[full_key];
  for (const KeyUse& earlier : uses) {
    if (!exclusive(earlier.conditions, use.conditions)) {
      diag.error(use.loc, fmt::format("duplicate key '{}'; two declarations may share a key only under "
                                      "complementary conditions ('when p' / 'unless p')",
                                      full_key))
          .note(earlier.loc, "first declared here");
      duplicate_keys_.insert({use.loc.line, use.loc.col});
      break;
    }
  }
  uses.push_back(std::move(use));
}

const std::vector<KeyUse>* CheckContext::key_uses(const std::string& full_key) const {
  const auto it = keys_.find(full_key);
  return it == keys_.end() ? nullptr : &it->second;
}

std::vector<std::string> CheckContext::tensor_keys() const {
  std::vector<std::string> out;
  for (const auto& [key, uses] : keys_) {
    for (const KeyUse& use : uses) {
      if (use.tensor && !use.tied) {
        out.push_back(key);
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());  // deterministic suggestions
  return out;
}

}  // namespace distckpt::gen
