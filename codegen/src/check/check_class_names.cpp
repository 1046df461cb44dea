// The names of the generated classes. Stack element classes are nested in
// Model and optimizer classes sit next to it in the layout's namespace; the
// members of Model see both, so they share one set of names with those the
// generated code declares itself (Config, Mesh, ...) or uses inside Model
// (the source's Axis enum and using-declarations).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "check/checker_context.h"

namespace distckpt::gen {
namespace {

constexpr std::array<std::string_view, 8> kGeneratedNames = {"Model", "Config",    "ResolvedConfig", "Mesh",
                                                             "Axis",  "Placement", "Position",       "TensorSpec"};

// A declaration that generates a class.
struct ClassOwner {
  std::string cls;
  const char* kind;  // "stack" or "optimizer"
  std::string name;  // the stack's full key, the optimizer's name
  Loc loc;
};

void collect_stacks(const Block& block, const std::string& prefix, std::vector<ClassOwner>& out) {
  for (const auto& st : block.stacks) {
    const std::string key = prefix + st->key;
    out.push_back(ClassOwner{st->class_name, "stack", key, st->loc});
    collect_stacks(st->body, key + ".", out);
  }
}

bool generated_name(const std::string& cls) {
  return std::find(kGeneratedNames.begin(), kGeneratedNames.end(), cls) != kGeneratedNames.end();
}

}  // namespace

std::vector<std::string> class_names_in_model(const Layout& layout) {
  std::vector<std::string> names(kGeneratedNames.begin(), kGeneratedNames.end());
  std::vector<ClassOwner> owners;
  collect_stacks(layout.body, "", owners);
  for (const ClassOwner& owner : owners) names.push_back(owner.cls);
  for (const OptimizerDecl& o : layout.optimizers) names.push_back(o.class_name);
  return names;
}

void check_class_names(CheckContext& ctx) {
  std::vector<ClassOwner> owners;
  collect_stacks(ctx.layout.body, "", owners);
  std::set<std::string> optimizers;  // a duplicate optimizer is reported already
  for (const OptimizerDecl& o : ctx.layout.optimizers) {
    if (optimizers.insert(o.name).second) owners.push_back(ClassOwner{o.class_name, "optimizer", o.name, o.loc});
  }
  // The first in the file is the one a clash note points at.
  std::stable_sort(owners.begin(), owners.end(), [](const ClassOwner& a, const ClassOwner& b) {
    return std::tie(a.loc.line, a.loc.col) < std::tie(b.loc.line, b.loc.col);
  });

  std::map<std::string, const ClassOwner*> first_of;
  for (const ClassOwner& owner : owners) {
    if (owner.cls.empty() || std::isdigit(static_cast<unsigned char>(owner.cls[0]))) {
      ctx.diag.error(owner.loc, fmt::format("{} '{}' would generate the class name '{}', which is not a C++ "
                                            "identifier; rename it",
                                            owner.kind, owner.name, owner.cls));
      continue;
    }
    if (generated_name(owner.cls)) {
      ctx.diag.error(owner.loc, fmt::format("{} class name '{}' of '{}' clashes with the generated name '{}'; rename "
                                            "the {}",
                                            owner.kind, owner.cls, owner.name, owner.cls, owner.kind));
      continue;
    }
    const auto [it, fresh] = first_of.emplace(owner.cls, &owner);
    if (fresh) continue;
    const ClassOwner& first = *it->second;
    if (first.kind == owner.kind && first.name == owner.name) {  // complementary twins of one stack
      ctx.diag
          .error(owner.loc, fmt::format("stack '{}' is declared twice; its element class '{}' can exist once, so two "
                                        "stacks need two keys, even under complementary conditions",
                                        owner.name, owner.cls))
          .note(first.loc, "first declared here");
      continue;
    }
    ctx.diag
        .error(owner.loc, fmt::format("{} class name '{}' of '{}' is already generated for {} '{}'; rename one of them",
                                      owner.kind, owner.cls, owner.name, first.kind, first.name))
        .note(first.loc, "first declared here");
  }
}

}  // namespace distckpt::gen
