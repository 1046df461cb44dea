// Mesh axes, checkpoint keys and C++ names: the checker's name tables.
#include "check/checker_context.h"

#include <fmt/format.h>

#include <algorithm>

#include "check/cpp_identifiers.h"
#include "check/names.h"

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

}  // namespace

const EnclosingStack* Scope::stack_over(int axis) const {
  for (const EnclosingStack& stack : stacks) {
    if (stack.axis == axis) return &stack;
  }
  return nullptr;
}

void CppNames::claim(Diagnostics& diagnostics, const std::string& cpp_name, const std::string& owner, Loc loc) {
  const std::string problem = identifier_problem(cpp_name);
  if (!problem.empty()) {
    diagnostics.error(loc, fmt::format("{} becomes the C++ name '{}'{}; rename it", owner, cpp_name, problem));
    return;
  }
  const auto [it, fresh] = owners_.emplace(cpp_name, std::make_pair(owner, loc));
  if (fresh || it->second.first == owner) return;
  diagnostics
      .error(loc, fmt::format("{} and {} both become the C++ name '{}'; rename one of them", owner, it->second.first,
                              cpp_name))
      .note(it->second.second, "first declared here");
}

void CheckContext::declare_mesh(const ast::Mesh& mesh) {
  mesh_declared_ = true;
  std::vector<Loc> locs;
  for (const ast::Name& axis : mesh.axes) {
    const auto [it, fresh] = axes_by_name_.emplace(axis.text, static_cast<int>(layout.mesh_axes.size()));
    if (!fresh) {
      diag.error(axis.loc, fmt::format("duplicate mesh axis '{}'", axis.text))
          .note(locs[it->second], "first declared here");
      continue;
    }
    layout.mesh_axes.push_back(axis.text);
    locs.push_back(axis.loc);
    const std::string problem = identifier_problem(axis.text);
    if (!problem.empty()) {
      diag.error(axis.loc,
                 fmt::format("mesh axis '{}' becomes the C++ name '{}'{}; rename it", axis.text, axis.text, problem));
    }
  }
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
