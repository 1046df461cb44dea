// `mapping NAME { ... }`: checkpoint keys <-> another framework's tensor
// names. Runs once the layout is complete: every line must name a tensor of
// the layout, bind one index to each of its stacks and use each in its
// external name, map a fused tensor's parts exactly once; every tensor must
// be mapped or skipped. External names are checked for collisions here as
// far as the templates tell (the runtime checks the expanded names).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "check/checker_context.h"
#include "check/cpp_identifiers.h"
#include "check/names.h"

namespace distckpt::gen {
namespace {

// A tensor declaration with the stacks around it (outermost first).
struct Declared {
  const TensorDecl* tensor = nullptr;
  std::vector<const StackDecl*> stacks;
  std::vector<std::string> stack_keys;  // full keys, parallel to stacks
  std::vector<Condition> conditions;
};

void collect(const Block& block, const std::string& prefix, std::vector<const StackDecl*>& stacks,
             std::vector<std::string>& stack_keys, std::vector<Condition>& conditions,
             std::map<std::string, std::vector<Declared>>& out) {
  for (const TensorDecl& tensor : block.tensors) {
    std::vector<Condition> all = conditions;
    if (tensor.condition.param >= 0) all.push_back(tensor.condition);
    out[prefix + tensor.key].push_back(Declared{&tensor, stacks, stack_keys, all});
  }
  for (const auto& stack : block.stacks) {
    const std::string full = prefix + stack->key;
    stacks.push_back(stack.get());
    stack_keys.push_back(full);
    if (stack->condition.param >= 0) conditions.push_back(stack->condition);
    collect(stack->body, full + ".", stacks, stack_keys, conditions, out);
    if (stack->condition.param >= 0) conditions.pop_back();
    stack_keys.pop_back();
    stacks.pop_back();
  }
}

ExprPtr sum(ExprPtr a, ExprPtr b) {
  if (!a) return b;
  auto e = std::make_shared<Expr>();
  e->op = Expr::Op::kAdd;
  e->lhs = std::move(a);
  e->rhs = std::move(b);
  return e;
}

ExprPtr zero() { return std::make_shared<Expr>(); }

// The `{name}` placeholders of a template, checked for balance; the
// template with every placeholder as "{}" goes to `normalized`.
bool placeholders(CheckContext& ctx, const ast::MapTarget& target, std::vector<std::string>& names,
                  std::string& normalized) {
  const std::string& text = target.external;
  const auto at = [&](size_t i) { return Loc{target.loc.line, target.loc.col + 1 + static_cast<int>(i)}; };
  if (text.empty()) {
    ctx.diag.error(target.loc, "empty external name");
    return false;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '}') {
      ctx.diag.error(at(i), fmt::format("'}}' without '{{' in \"{}\"; placeholders read {{index}}", text));
      return false;
    }
    if (text[i] != '{') {
      normalized += text[i];
      continue;
    }
    const size_t close = text.find('}', i);
    const std::string name = close == std::string::npos ? "" : text.substr(i + 1, close - i - 1);
    if (close == std::string::npos || name.empty() || name.find('{') != std::string::npos) {
      ctx.diag.error(at(i), fmt::format("'{{' must open a placeholder such as {{layer}} in \"{}\"", text));
      return false;
    }
    names.push_back(name);
    normalized += "{}";
    i = close;
  }
  return true;
}

class MappingChecker {
 public:
  MappingChecker(CheckContext& ctx, const std::map<std::string, std::vector<Declared>>& tensors)
      : ctx_(ctx), tensors_(tensors) {}

  MappingDecl check(const ast::Mapping& mapping) {
    MappingDecl decl;
    decl.name = mapping.name.text;
    decl.function = mapping.name.text + "_mapping";
    decl.loc = mapping.name.loc;
    if (!mapping.name.text.empty() && mapping.name.text.front() == '_') {
      ctx_.diag.error(mapping.name.loc, fmt::format("mapping '{}' becomes the C++ function '{}'; names that begin "
                                                    "with '_' are reserved, rename it",
                                                    mapping.name.text, decl.function));
    }
    for (const ast::MapEntry& entry : mapping.entries) add(entry, decl);
    for (const ast::Name& skip : mapping.skips) {
      if (!known(skip.text, skip.loc, "skip")) continue;
      claim(skip.text, skip.loc);
    }
    for (const auto& [key, declared] : tensors_) {
      if (handled_.count(key) == 0 && !all_tied(declared)) {
        ctx_.diag.error(mapping.name.loc,
                        fmt::format("mapping '{}' does not say where tensor '{}' goes: map it, or write 'skip {};' "
                                    "when the other side has no such tensor",
                                    mapping.name.text, key, key));
      }
    }
    return decl;
  }

 private:
  static bool all_tied(const std::vector<Declared>& declared) {
    for (const Declared& d : declared) {
      if (d.tensor->tied_key.empty()) return false;
    }
    return true;
  }

  bool known(const std::string& key, Loc loc, const char* what) {
    if (tensors_.count(key) != 0) return true;
    std::vector<std::string> keys;
    for (const auto& [k, unused] : tensors_) keys.push_back(k);
    const std::vector<KeyUse>* uses = ctx_.key_uses(key);
    const bool object = uses != nullptr && !uses->empty() && !uses->front().tensor;
    ctx_.diag.error(loc, object ? fmt::format("'{}' is an object; a {} line names a tensor (objects have no "
                                              "external form and need no mapping)",
                                              key, what)
                                : fmt::format("'{}' is not a tensor of layout '{}'{}", key, ctx_.layout.name,
                                              did_you_mean(key, keys)));
    return false;
  }

  bool claim(const std::string& key, Loc loc) {
    const auto [it, inserted] = handled_.emplace(key, loc);
    if (!inserted) {
      ctx_.diag.error(loc, fmt::format("'{}' is mapped twice in this mapping", key)).note(it->second, "first here");
    }
    return inserted;
  }

  // The indices bound after the stack keys, in order; false when reported.
  bool check_indices(const ast::MapKey& key, const Declared& declared) {
    const std::vector<std::string>& stacks = declared.stack_keys;
    std::set<std::string> seen;
    bool ok = true;
    for (size_t i = 0; i < key.indices.size(); ++i) {
      const ast::MapIndex& index = key.indices[i];
      const std::string before = key.text.substr(0, index.prefix);
      if (i >= stacks.size() || stacks[i] != before) {
        ctx_.diag.error(index.name.loc,
                        fmt::format("'[{}]' follows '{}', which is not {}; bind one index after each stack of '{}' "
                                    "({})",
                                    index.name.text, before,
                                    i < stacks.size() ? fmt::format("the stack '{}'", stacks[i]) : "a stack", key.text,
                                    stacks.empty() ? "it has none" : join_names(stacks)));
        return false;
      }
      if (!seen.insert(index.name.text).second) {
        ctx_.diag.error(index.name.loc, fmt::format("index '{}' is bound twice in '{}'", index.name.text, key.text));
        ok = false;
      }
    }
    if (key.indices.size() < stacks.size()) {
      const std::string& stack = stacks[key.indices.size()];
      ctx_.diag.error(key.loc,
                      fmt::format("'{}' lies in stack '{}': bind an index to it, as in {}[i]", key.text, stack, stack));
      return false;
    }
    return ok;
  }

  // Every placeholder names a bound index and every index is used.
  bool check_template(const ast::MapTarget& target, const ast::MapKey& key) {
    std::vector<std::string> used;
    std::string normalized;
    if (!placeholders(ctx_, target, used, normalized)) return false;
    bool ok = true;
    for (const std::string& name : used) {
      bool bound = false;
      for (const ast::MapIndex& index : key.indices) bound = bound || index.name.text == name;
      if (!bound) {
        ctx_.diag.error(target.loc,
                        fmt::format("'{{{}}}' in \"{}\" is not an index of '{}'", name, target.external, key.text));
        ok = false;
      }
    }
    for (const ast::MapIndex& index : key.indices) {
      if (std::find(used.begin(), used.end(), index.name.text) == used.end()) {
        ctx_.diag.error(target.loc, fmt::format("\"{}\" does not use index '{}': every element of '{}' would get "
                                                "the same external name",
                                                target.external, index.name.text, key.text));
        ok = false;
      }
    }
    const auto [it, inserted] = externals_.emplace(normalized, target.loc);
    if (!inserted) {
      ctx_.diag.error(target.loc, fmt::format("external name \"{}\" is already used in this mapping", target.external))
          .note(it->second, "first used here");
      ok = false;
    }
    return ok;
  }

  void add(const ast::MapEntry& entry, MappingDecl& decl) {
    const ast::MapKey& key = entry.key;
    if (!known(key.text, key.loc, "mapping") || !claim(key.text, key.loc)) return;
    const std::vector<Declared>& declared = tensors_.at(key.text);
    if (!check_indices(key, declared.front())) return;
    if (entry.targets.empty()) {
      ctx_.diag.error(key.loc, fmt::format("'{}' maps no fused part; name each one, as in {{ {} = \"...\"; }}",
                                           key.text, part_name_example(declared.front())));
      return;
    }
    bool ok = true;
    for (const ast::MapTarget& target : entry.targets) ok = check_template(target, key) && ok;
    if (!ok) return;
    for (const Declared& d : declared) {
      if (!d.tensor->tied_key.empty()) continue;  // stored under its main copy's key
      if (entry.whole) {
        decl.tensors.push_back(resolved(key, d, entry.targets.front(), -1, nullptr, nullptr));
      } else {
        add_parts(entry, d, decl);
      }
    }
  }

  static std::string part_name_example(const Declared& d) {
    return d.tensor->fused.empty() ? "part" : d.tensor->fused.front().name;
  }

  void add_parts(const ast::MapEntry& entry, const Declared& d, MappingDecl& decl) {
    const TensorDecl& tensor = *d.tensor;
    const ast::MapKey& key = entry.key;
    if (tensor.fused.empty()) {
      ctx_.diag.error(entry.targets.front().loc,
                      fmt::format("'{}' is not fused; map it whole: {} = \"...\";", key.text, key.text));
      return;
    }
    std::map<std::string, const ast::MapTarget*> by_part;
    for (const ast::MapTarget& target : entry.targets) {
      const std::string& part = target.part->text;
      bool exists = false;
      for (const FusedPart& p : tensor.fused) exists = exists || p.name == part;
      if (!exists) {
        std::vector<std::string> names;
        for (const FusedPart& p : tensor.fused) names.push_back(p.name);
        ctx_.diag.error(target.part->loc,
                        fmt::format("'{}' has no fused part '{}' (parts: {})", key.text, part, join_names(names)));
        return;
      }
      if (!by_part.emplace(part, &target).second) {
        ctx_.diag.error(target.part->loc, fmt::format("part '{}' of '{}' is mapped twice", part, key.text));
        return;
      }
    }
    ExprPtr offset;
    for (const FusedPart& part : tensor.fused) {
      const auto it = by_part.find(part.name);
      if (it == by_part.end()) {
        ctx_.diag.error(key.loc, fmt::format("part '{}' of '{}' is not mapped", part.name, key.text));
        return;
      }
      decl.tensors.push_back(
          resolved(key, d, *it->second, tensor.splits.front().dim, offset ? offset : zero(), part.extent));
      offset = sum(offset, part.extent);
    }
  }

  static MappedTensor resolved(const ast::MapKey& key, const Declared& d, const ast::MapTarget& target, int part_dim,
                               ExprPtr part_offset, ExprPtr part_extent) {
    MappedTensor m;
    m.external = target.external;
    m.shape = d.tensor->shape;
    m.part_dim = part_dim;
    m.part_offset = std::move(part_offset);
    m.part_extent = std::move(part_extent);
    m.pad_dim = d.tensor->pad_dim;
    m.conditions = d.conditions;
    m.loc = target.loc;
    // The checkpoint key: a stack stored as keys puts its element's index in it.
    size_t copied = 0;
    for (size_t i = 0; i < d.stacks.size(); ++i) {
      const ast::MapIndex& index = key.indices[i];
      m.indices.push_back(MapIndex{index.name.text, d.stacks[i]->count, !d.stacks[i]->as_keys});
      if (d.stacks[i]->as_keys) {
        m.key += key.text.substr(copied, index.prefix - copied) + ".{" + index.name.text + "}";
        copied = index.prefix;
      }
    }
    m.key += key.text.substr(copied);
    size_t written = 0;
    for (const ast::MapIndex& index : key.indices) {
      m.source += key.text.substr(written, index.prefix - written) + "[" + index.name.text + "]";
      written = index.prefix;
    }
    m.source += key.text.substr(written);
    m.source += target.part ? fmt::format(" {{ {} = \"{}\"; }}", target.part->text, target.external)
                            : fmt::format(" = \"{}\";", target.external);
    return m;
  }

  CheckContext& ctx_;
  const std::map<std::string, std::vector<Declared>>& tensors_;
  std::map<std::string, Loc> handled_;    // keys mapped or skipped
  std::map<std::string, Loc> externals_;  // normalized templates
};

}  // namespace

void check_mappings(CheckContext& ctx, const ast::Schema& schema) {
  std::map<std::string, std::vector<Declared>> tensors;
  std::vector<const StackDecl*> stacks;
  std::vector<std::string> stack_keys;
  std::vector<Condition> conditions;
  collect(ctx.layout.body, "", stacks, stack_keys, conditions, tensors);
  std::map<std::string, Loc> names;
  for (const ast::Item& item : schema.items) {
    const auto* mapping = std::get_if<ast::Mapping>(&item);
    if (mapping == nullptr) continue;
    const auto [it, inserted] = names.emplace(mapping->name.text, mapping->name.loc);
    if (!inserted) {
      ctx.diag.error(mapping->name.loc, fmt::format("mapping '{}' is declared twice", mapping->name.text))
          .note(it->second, "first declared here");
      continue;
    }
    ctx.layout.mappings.push_back(MappingChecker(ctx, tensors).check(*mapping));
  }
}

}  // namespace distckpt::gen
