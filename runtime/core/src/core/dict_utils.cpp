// Tree walks over state dicts: diff, split, merge, map, flatten, key prefixes.
#include "distckpt/core/dict_utils.h"

#include <fmt/format.h>

#include <algorithm>

#include "distckpt/core/errors.h"

namespace distckpt {

std::string to_string(const Path& path) { return fmt::format("{}", fmt::join(path, "/")); }

namespace {

Path child(const Path& path, std::string step) {
  Path out = path;
  out.push_back(std::move(step));
  return out;
}

std::string index_step(size_t i) { return std::to_string(i); }

void diff_into(const Value& left, const Value& right, const Path& path, DiffResult& out) {
  if (left.kind() != right.kind()) {
    out.mismatch.push_back({path, left.kind(), right.kind()});
    return;
  }
  if (left.is_dict()) {
    // Both maps are sorted: one merge-walk finds every key once.
    const Dict& a = left.as_dict();
    const Dict& b = right.as_dict();
    auto ia = a.begin();
    auto ib = b.begin();
    while (ia != a.end() || ib != b.end()) {
      if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
        out.only_left.push_back(child(path, ia->first));
        ++ia;
      } else if (ia == a.end() || ib->first < ia->first) {
        out.only_right.push_back(child(path, ib->first));
        ++ib;
      } else {
        diff_into(ia->second, ib->second, child(path, ia->first), out);
        ++ia;
        ++ib;
      }
    }
    return;
  }
  if (left.is_list()) {
    const List& a = left.as_list();
    const List& b = right.as_list();
    const size_t common = std::min(a.size(), b.size());
    for (size_t i = 0; i < common; ++i) diff_into(a[i], b[i], child(path, index_step(i)), out);
    for (size_t i = common; i < a.size(); ++i) out.only_left.push_back(child(path, index_step(i)));
    for (size_t i = common; i < b.size(); ++i) out.only_right.push_back(child(path, index_step(i)));
    return;
  }
  if (!left.equals(right)) out.mismatch.push_back({path, left.kind(), right.kind()});
}

// One side of a split: absent when nothing of the subtree went to that side.
using Side = std::optional<Value>;

struct Split {
  Side match;
  Side rest;
};

Split split_tree(const Value& x, const std::function<bool(const Value&)>& predicate, bool lists_as_dicts);

// Collects children into the two sides. An input container that was already
// empty goes to the non-matching side so the split loses nothing.
class SplitBuilder {
 public:
  explicit SplitBuilder(bool as_dict) : as_dict_(as_dict) {
    if (as_dict) {
      match_ = Value::dict();
      rest_ = Value::dict();
    } else {
      match_ = Value::list();
      rest_ = Value::list();
    }
  }

  void add(const std::string& key, Split part) {
    if (part.match) put(match_, key, std::move(*part.match));
    if (part.rest) put(rest_, key, std::move(*part.rest));
  }

  Split finish(bool input_was_empty) {
    Split out;
    if (match_.size() > 0) out.match = std::move(match_);
    if (rest_.size() > 0 || input_was_empty) out.rest = std::move(rest_);
    return out;
  }

 private:
  void put(Value& side, const std::string& key, Value v) {
    if (as_dict_) {
      side.as_dict().emplace(key, std::move(v));
    } else {
      side.push_back(std::move(v));
    }
  }

  bool as_dict_;
  Value match_;
  Value rest_;
};

Split split_tree(const Value& x, const std::function<bool(const Value&)>& predicate, bool lists_as_dicts) {
  if (x.is_dict()) {
    SplitBuilder builder(/*as_dict=*/true);
    for (const auto& [key, v] : x.as_dict()) {
      builder.add(key, split_tree(v, predicate, lists_as_dicts));
    }
    return builder.finish(x.size() == 0);
  }
  if (x.is_list()) {
    SplitBuilder builder(/*as_dict=*/lists_as_dicts);
    const List& list = x.as_list();
    for (size_t i = 0; i < list.size(); ++i) {
      builder.add(index_step(i), split_tree(list[i], predicate, lists_as_dicts));
    }
    return builder.finish(list.empty());
  }
  if (predicate(x)) return {x, std::nullopt};
  return {std::nullopt, x};
}

// None on either side means "nothing here yet", so it never conflicts.
void merge_at(Value& dst, const Value& src, const Path& path) {
  if (src.is_none()) return;
  if (dst.is_none()) {
    dst = src;
    return;
  }
  if (dst.is_dict() && src.is_dict()) {
    Dict& d = dst.as_dict();
    for (const auto& [key, v] : src.as_dict()) {
      auto it = d.find(key);
      if (it == d.end()) {
        d.emplace(key, v);
      } else {
        merge_at(it->second, v, child(path, key));
      }
    }
    return;
  }
  if (dst.is_list() && src.is_list()) {
    List& d = dst.as_list();
    const List& s = src.as_list();
    if (d.size() != s.size()) {
      throw UsageError(
          fmt::format("merge: lists at '{}' have different lengths ({} and {}); lists "
                      "merge element by element and must have the same length",
                      to_string(path), d.size(), s.size()));
    }
    for (size_t i = 0; i < s.size(); ++i) merge_at(d[i], s[i], child(path, index_step(i)));
    return;
  }
  throw UsageError(
      fmt::format("merge: both trees hold a value at '{}' ({} and {}); each leaf must "
                  "come from exactly one of the merged state dicts",
                  to_string(path), kind_name(dst.kind()), kind_name(src.kind())));
}

Value map_copy(const Value& x, const std::function<Value(const Value&)>& f) {
  if (x.is_dict()) {
    Dict out;
    for (const auto& [key, v] : x.as_dict()) out.emplace_hint(out.end(), key, map_copy(v, f));
    return Value(std::move(out));
  }
  if (x.is_list()) {
    List out;
    out.reserve(x.size());
    for (const Value& v : x.as_list()) out.push_back(map_copy(v, f));
    return Value(std::move(out));
  }
  return f(x);
}

template <typename V, typename Visit>
void walk_leaves(V& x, Path& path, const Visit& visit) {
  if (x.is_dict()) {
    for (auto& [key, v] : x.as_dict()) {
      path.push_back(key);
      walk_leaves(v, path, visit);
      path.pop_back();
    }
  } else if (x.is_list()) {
    auto& list = x.as_list();
    for (size_t i = 0; i < list.size(); ++i) {
      path.push_back(index_step(i));
      walk_leaves(list[i], path, visit);
      path.pop_back();
    }
  } else {
    visit(x, path);
  }
}

// The checkpoint key of a sharded leaf, or null for leaves without one.
std::string* sharding_key(Value& v) {
  switch (v.kind()) {
    case Kind::kShardedTensor:
      return &v.as_sharded_tensor().key;
    case Kind::kShardedObject:
      return &v.as_sharded_object().key;
    case Kind::kFactory:
      return &v.as_factory().key;
    default:
      return nullptr;
  }
}

void for_each_sharding_key(Value& x, const std::function<void(std::string&)>& f) {
  map_inplace(x, [&](Value& leaf) {
    if (std::string* key = sharding_key(leaf)) f(*key);
  });
}

void inspect_into(const Value& x, int depth, std::string& out) {
  const std::string indent(static_cast<size_t>(depth) * 2, ' ');
  auto entry = [&](const std::string& key, const Value& v) {
    if (v.is_container()) {
      out += fmt::format("{}{}:\n", indent, key);
      inspect_into(v, depth + 1, out);
    } else {
      out += fmt::format("{}{}: {}\n", indent, key, kind_name(v.kind()));
    }
  };
  if (x.is_dict()) {
    for (const auto& [key, v] : x.as_dict()) entry(key, v);
  } else if (x.is_list()) {
    for (size_t i = 0; i < x.size(); ++i) entry(index_step(i), x[i]);
  } else {
    out += fmt::format("{}{}\n", indent, kind_name(x.kind()));
  }
}

std::pair<Value, Value> extract_kinds(const Value& x, std::initializer_list<Kind> kinds) {
  const std::vector<Kind> wanted(kinds);
  return extract_matching(
      x, [&](const Value& v) { return std::find(wanted.begin(), wanted.end(), v.kind()) != wanted.end(); });
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

DiffResult diff(const Value& left, const Value& right) {
  DiffResult out;
  diff_into(left, right, {}, out);
  return out;
}

std::pair<Value, Value> extract_matching(const Value& x, const std::function<bool(const Value&)>& predicate,
                                         bool lists_as_dicts) {
  Split split = split_tree(x, predicate, lists_as_dicts);
  // An empty side keeps the root's container kind so callers can still index it.
  auto empty_root = [&]() -> Value {
    if (x.is_dict() || (x.is_list() && lists_as_dicts)) return Value::dict();
    if (x.is_list()) return Value::list();
    return Value();
  };
  Value match = split.match ? std::move(*split.match) : empty_root();
  Value rest = split.rest ? std::move(*split.rest) : empty_root();
  return {std::move(match), std::move(rest)};
}

std::vector<Path> DiffResult::mismatch_paths() const {
  std::vector<Path> out;
  out.reserve(mismatch.size());
  for (const Mismatch& m : mismatch) out.push_back(m.path);
  return out;
}

std::string inspect_types(const Value& x) {
  std::string out;
  inspect_into(x, 0, out);
  return out;
}

void dict_map(Value& x, const std::function<Value(const Value&)>& f) {
  dict_map_with_key(x, [&](const std::string&, const Value& v) { return f(v); });
}

void dict_map_with_key(Value& x, const std::function<Value(const std::string& key, const Value&)>& f) {
  if (!x.is_dict()) {
    throw UsageError(fmt::format("dict_map: the root is a {}, not a dict", kind_name(x.kind())));
  }
  for (auto& [key, v] : x.as_dict()) {
    if (v.is_dict()) {
      dict_map_with_key(v, f);
    } else {
      v = f(key, v);
    }
  }
}

void for_each_nested_item(Value& x,
                          const std::function<void(Value& container, const std::string& key, Value& value)>& f) {
  if (x.is_dict()) {
    for (auto& [key, v] : x.as_dict()) {
      if (v.is_container()) {
        for_each_nested_item(v, f);
      } else {
        f(x, key, v);
      }
    }
  } else if (x.is_list()) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].is_container()) {
        for_each_nested_item(x[i], f);
      } else {
        f(x, index_step(i), x[i]);
      }
    }
  }
}

std::pair<Value, Value> extract_sharded_tensors(const Value& sharded_state_dict) {
  return extract_kinds(sharded_state_dict, {Kind::kShardedTensor});
}

std::pair<Value, Value> extract_sharded_tensors_and_factories(const Value& sharded_state_dict) {
  return extract_kinds(sharded_state_dict, {Kind::kShardedTensor, Kind::kFactory});
}

std::pair<Value, Value> extract_sharded_tensors_or_nonpersistent(const Value& sharded_state_dict) {
  return extract_kinds(sharded_state_dict, {Kind::kShardedTensor, Kind::kFactory, Kind::kNonPersistent});
}

std::pair<Value, Value> extract_nonpersistent(const Value& sharded_state_dict) {
  return extract_kinds(sharded_state_dict, {Kind::kNonPersistent});
}

std::pair<Value, Value> extract_sharded_base(const Value& sharded_state_dict) {
  return extract_kinds(sharded_state_dict, {Kind::kShardedTensor, Kind::kShardedObject, Kind::kFactory});
}

void merge(Value& dst, const Value& src) { merge_at(dst, src, {}); }

void map_inplace(Value& x, const std::function<void(Value&)>& f) {
  Path path;
  walk_leaves(x, path, [&](Value& leaf, const Path&) { f(leaf); });
}

Value map_outplace(const Value& x, const std::function<Value(const Value&)>& f) { return map_copy(x, f); }

std::vector<const Value*> nested_values(const Value& x) {
  std::vector<const Value*> out;
  Path path;
  walk_leaves(x, path, [&](const Value& leaf, const Path&) { out.push_back(&leaf); });
  return out;
}

std::vector<Value*> nested_values(Value& x) {
  std::vector<Value*> out;
  Path path;
  walk_leaves(x, path, [&](Value& leaf, const Path&) { out.push_back(&leaf); });
  return out;
}

std::vector<std::pair<Path, const Value*>> nested_items(const Value& x) {
  std::vector<std::pair<Path, const Value*>> out;
  Path path;
  walk_leaves(x, path, [&](const Value& leaf, const Path& p) { out.emplace_back(p, &leaf); });
  return out;
}

void add_prefix_for_sharding(Value& sharded_state_dict, const std::string& prefix) {
  for_each_sharding_key(sharded_state_dict, [&](std::string& key) { key = prefix + key; });
}

void replace_prefix_for_sharding(Value& sharded_state_dict, const std::string& old_prefix,
                                 const std::string& new_prefix) {
  // Check every key first so a failure leaves the state dict untouched.
  for_each_sharding_key(sharded_state_dict, [&](std::string& key) {
    if (!starts_with(key, old_prefix)) {
      throw UsageError(
          fmt::format("replace_prefix_for_sharding: key '{}' does not start with the "
                      "expected prefix '{}'",
                      key, old_prefix));
    }
  });
  for_each_sharding_key(sharded_state_dict,
                        [&](std::string& key) { key = new_prefix + key.substr(old_prefix.size()); });
}

void apply_prefix_mapping(Value& sharded_state_dict,
                          const std::vector<std::pair<std::string, std::string>>& prefix_map) {
  for_each_sharding_key(sharded_state_dict, [&](std::string& key) {
    for (const auto& [old_prefix, new_prefix] : prefix_map) {
      if (starts_with(key, old_prefix)) {
        key = new_prefix + key.substr(old_prefix.size());
        return;
      }
    }
  });
}

}  // namespace distckpt
