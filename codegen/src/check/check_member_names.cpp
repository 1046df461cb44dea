// The members each generated class gets from the schema: a tensor's setter,
// holds_ check and slot field, a stack's accessor, element count and
// elements, and so on. Within one class no two declarations may generate
// the same name, and none may take a name the generated code declares or
// uses there (Model::state_dict, builder_, the axis constants, ...).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string_view>
#include <tuple>

#include "check/checker_context.h"
#include "check/cpp_identifiers.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {
namespace {

// A declaration and the members it generates, its accessor first.
struct Claim {
  const char* kind;  // "tensor", ...
  std::string key;   // relative to the class
  Loc loc;
  std::vector<std::string> members;

  std::string what() const { return fmt::format("{} '{}'", kind, key); }
  // Complementary twins (`when p` / `unless p`) share their members; other
  // declarations of one key are reported as duplicate keys or stacks.
  bool twin_of(const Claim& other) const { return std::string_view(kind) == other.kind && key == other.key; }
};

Claim tensor_claim(const TensorDecl& t) {
  return {"tensor", t.key, t.loc, {t.accessor, "holds_" + t.accessor, t.accessor + "_"}};
}
Claim object_claim(const ObjectDecl& o) { return {"object", o.key, o.loc, {o.accessor, o.accessor + "_"}}; }
Claim stack_claim(const StackDecl& s) {
  return {"stack", s.key, s.loc, {s.accessor, s.accessor + "_local_count", s.accessor + "_"}};
}

class MemberTable {
 public:
  MemberTable(const CheckContext& ctx, std::string cls) : ctx_(ctx), diag_(ctx.diag), cls_(std::move(cls)) {}

  // A name the generated code declares or uses in the class; `what` says
  // which ("the generated Model::bind()").
  void fix(const std::string& name, std::string what) { fixed_.emplace(name, std::move(what)); }
  void add(Claim claim) { claims_.push_back(std::move(claim)); }

  // Reports every problem, at the later declaration of two.
  void check() {
    std::stable_sort(claims_.begin(), claims_.end(), [](const Claim& a, const Claim& b) {
      return std::tie(a.loc.line, a.loc.col) < std::tie(b.loc.line, b.loc.col);
    });
    for (const Claim& claim : claims_) {
      if (valid(claim) && free(claim)) {
        for (const std::string& member : claim.members) owners_.emplace(member, &claim);
      }
    }
  }

 private:
  bool valid(const Claim& claim) {
    const std::string& accessor = claim.members.front();
    const std::string problem = identifier_problem(accessor);
    if (!problem.empty()) {
      diag_.error(claim.loc, fmt::format("{} becomes the C++ name '{}'{}; rename it", claim.what(), accessor, problem));
      return false;
    }
    for (const std::string& member : claim.members) {
      const auto fixed = fixed_.find(member);
      if (fixed == fixed_.end()) continue;
      diag_.error(claim.loc, fmt::format("{} would generate the member '{}::{}', which clashes with {}; rename it",
                                         claim.what(), cls_, member, fixed->second));
      return false;
    }
    return true;
  }

  bool free(const Claim& claim) {
    for (const std::string& member : claim.members) {
      const auto it = owners_.find(member);
      if (it == owners_.end()) continue;
      const Claim& first = *it->second;
      // A duplicate key is reported as such, once.
      if (claim.twin_of(first) || (claim.key == first.key && ctx_.duplicate_key_at(claim.loc))) return true;
      const bool both_accessors = member == claim.members.front() && member == first.members.front();
      diag_
          .error(claim.loc,
                 both_accessors
                     ? fmt::format("{} and {} both become the C++ name '{}'; rename one of them", claim.what(),
                                   first.what(), member)
                     : fmt::format("{} would generate the member '{}::{}', which {} also generates; rename one of them",
                                   claim.what(), cls_, member, first.what()))
          .note(first.loc, "first declared here");
      return false;
    }
    return true;
  }

  const CheckContext& ctx_;
  Diagnostics& diag_;
  std::string cls_;
  std::map<std::string, std::string> fixed_;
  std::vector<Claim> claims_;
  std::map<std::string, const Claim*> owners_;
};

// What every generated class sees: the class names, and the types its
// declarations spell unqualified.
void fix_common(MemberTable& table, const std::vector<std::string>& classes) {
  for (const std::string& cls : classes) table.fix(cls, fmt::format("the class name '{}'", cls));
  table.fix("int64_t", "the type int64_t");
  table.fix("size_t", "the type size_t");
}

void add_block(MemberTable& table, const Block& block) {
  for (const TensorDecl& t : block.tensors) table.add(tensor_claim(t));
  for (const ObjectDecl& o : block.objects) table.add(object_claim(o));
  for (const auto& s : block.stacks) table.add(stack_claim(*s));
}

void check_element_classes(CheckContext& ctx, const Block& block, const std::vector<std::string>& classes) {
  for (const auto& stack : block.stacks) {
    const std::string cls = "Model::" + stack->class_name;
    MemberTable table(ctx, cls);
    fix_common(table, classes);
    table.fix("builder_", fmt::format("the generated {}::builder_", cls));
    table.fix("global_index_", fmt::format("the generated {}::global_index_", cls));
    table.fix("global_index", fmt::format("the generated {}::global_index()", cls));
    add_block(table, stack->body);
    table.check();
    check_element_classes(ctx, stack->body, classes);
  }
}

void check_model(CheckContext& ctx, const std::vector<std::string>& classes) {
  const Layout& layout = ctx.layout;
  MemberTable table(ctx, "Model");
  fix_common(table, classes);
  for (const char* member : {"config_", "builder_", "kLayoutName"}) {
    table.fix(member, fmt::format("the generated Model::{}", member));
  }
  for (const char* function :
       {"config", "bind", "state_dict", "metadata_state_dict", "save_options", "schema_text", "fingerprint"}) {
    table.fix(function, fmt::format("the generated Model::{}()", function));
  }
  if (layout.chunked_stack) {
    table.fix("chunks_", "the generated Model::chunks_");
    for (const char* function : {"chunk_count", "bind_chunk"}) {
      table.fix(function, fmt::format("the generated Model::{}()", function));
    }
    const std::string chunk = layout.chunked_stack->accessor + "_chunk";
    table.fix(chunk, fmt::format("the generated Model::{}()", chunk));
    table.fix(chunk + "s_", fmt::format("the generated Model::{}s_", chunk));
  }
  // File-local helpers Model's definitions call or name unqualified.
  if (layout.meshes.size() > 1) {
    table.fix("mesh_coords", "mesh_coords(), which Model's constructor calls");
    for (const MeshDecl& mesh : layout.meshes) {
      const std::string constant = mesh_constant(mesh.name);
      table.fix(constant, fmt::format("the mesh constant {}, which the generated code uses", constant));
    }
  }
  for (const MappingDecl& m : layout.mappings) {
    table.fix(m.function + "_of", fmt::format("{}_of(), which Model::save_options() calls", m.function));
  }
  // Names Model's definitions use unqualified, which a member would hide.
  table.fix("resolve", "resolve(), which Model's constructor calls");
  table.fix("kSchema", "the schema text kSchema, which Model::save_options() uses");
  for (const std::string& axis : layout.mesh_axes) {
    table.fix(axis_constant(axis),
              fmt::format("the axis constant {}, which Model's constructor uses", axis_constant(axis)));
  }
  add_block(table, layout.body);
  for (const CommonDecl& c : layout.commons) table.add({"common", c.key, c.loc, {c.accessor}});
  for (const TransientDecl& t : layout.transients) table.add({"transient", t.key, t.loc, {t.accessor}});
  table.check();
}

}  // namespace

void check_member_names(CheckContext& ctx) {
  const std::vector<std::string> classes = class_names_in_model(ctx.layout);
  check_model(ctx, classes);
  check_element_classes(ctx, ctx.layout.body, classes);
}

}  // namespace distckpt::gen
