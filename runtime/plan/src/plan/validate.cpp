#include "plan/validate.h"

#include <fmt/format.h>

#include <algorithm>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "plan/coverage.h"

namespace distckpt::plan {
namespace {

struct ShardRef {
  const ShardPlan* shard;
  int rank;
};

void check_consistent(const std::vector<ShardRef>& group) {
  const ShardRef& first = group.front();
  for (const ShardRef& r : group) {
    if (r.shard->dtype != first.shard->dtype) {
      throw ShardingError(fmt::format(
          "'{}' has dtype {} on rank {} but {} on rank {}; every rank must save the "
          "same dtype for one key",
          first.shard->key, dtype_name(first.shard->dtype), first.rank, dtype_name(r.shard->dtype), r.rank));
    }
    if (r.shard->global_shape != first.shard->global_shape) {
      throw ShardingError(
          fmt::format("'{}' has global shape {} on rank {} but {} on rank {}; every rank must "
                      "agree on the global shape of a key",
                      first.shard->key, to_string(first.shard->global_shape), first.rank,
                      to_string(r.shard->global_shape), r.rank));
    }
  }
}

// Flat (ZeRO) main replicas of one chunk box must tile [0, box.numel()).
void check_flat_ranges(const std::string& key, const Box& box, std::vector<ShardRef> parts) {
  std::sort(parts.begin(), parts.end(),
            [](const ShardRef& a, const ShardRef& b) { return a.shard->flat->start < b.shard->flat->start; });
  int64_t expected = 0;
  const ShardRef* previous = nullptr;
  for (const ShardRef& p : parts) {
    const FlatRange r = *p.shard->flat;
    if (r.size() == 0) continue;
    if (r.start < expected) {
      throw ShardingError(fmt::format(
          "invalid sharding of '{}': flattened ranges [{}, {}) on rank {} and [{}, {}) on rank {} overlap in the "
          "chunk {}",
          key, previous->shard->flat->start, previous->shard->flat->stop, previous->rank, r.start, r.stop, p.rank,
          to_string(box)));
    }
    if (r.start > expected) {
      throw ShardingError(fmt::format(
          "invalid sharding of '{}': flattened range [{}, {}) of the chunk {} is held by no rank (main replicas)", key,
          expected, r.start, to_string(box)));
    }
    expected = r.stop;
    previous = &p;
  }
  if (expected != box.numel()) {
    throw ShardingError(fmt::format(
        "invalid sharding of '{}': flattened range [{}, {}) of the chunk {} is held by no rank (main replicas)", key,
        expected, box.numel(), to_string(box)));
  }
}

void check_coverage(const std::string& key, const Shape& global_shape, const std::vector<ShardRef>& group) {
  std::vector<OwnedBox> boxes;
  std::vector<ShardRef> flat;
  for (const ShardRef& r : group) {
    if (!r.shard->is_main()) continue;
    if (r.shard->flat) {
      flat.push_back(r);
    } else {
      boxes.push_back(OwnedBox{r.shard->box, r.rank});
    }
  }
  // Flat pieces of the same chunk box become one box once their ranges tile it.
  std::sort(flat.begin(), flat.end(), [](const ShardRef& a, const ShardRef& b) { return a.shard->box < b.shard->box; });
  for (size_t i = 0; i < flat.size();) {
    size_t j = i;
    while (j < flat.size() && flat[j].shard->box == flat[i].shard->box) ++j;
    check_flat_ranges(key, flat[i].shard->box, std::vector<ShardRef>(flat.begin() + i, flat.begin() + j));
    boxes.push_back(OwnedBox{flat[i].shard->box, flat[i].rank});
    i = j;
  }
  check_exact_cover(key, global_shape, boxes);
}

struct ObjectRef {
  const ObjectPlan* object;
  int rank;
};

// Megatron's rules for one key: one global shape (the shard grid), and
// exactly one main replica of every shard of the grid.
void check_object_key(const std::vector<ObjectRef>& refs) {
  const ObjectRef& first = refs.front();
  const std::string& key = first.object->key;
  for (const ObjectRef& r : refs) {
    if (r.object->global_shape != first.object->global_shape) {
      throw ShardingError(fmt::format(
          "sharded object '{}' has the shard grid {} on rank {} but {} on rank {}; every shard of one object must "
          "give the same global shape",
          key, to_string(first.object->global_shape), first.rank, to_string(r.object->global_shape), r.rank));
    }
  }
  std::vector<const ObjectRef*> mains;  // by offset, row-major
  for (const ObjectRef& r : refs) {
    if (r.object->is_main()) mains.push_back(&r);
  }
  std::sort(mains.begin(), mains.end(),
            [](const ObjectRef* a, const ObjectRef* b) { return a->object->global_offset < b->object->global_offset; });
  for (size_t i = 1; i < mains.size(); ++i) {
    if (mains[i]->object->global_offset == mains[i - 1]->object->global_offset) {
      throw ShardingError(
          fmt::format("sharded object '{}' has a main replica on rank {} and on rank {}; give "
                      "the copies non-zero replica ids",
                      mains[i]->object->unique_key(), mains[i - 1]->rank, mains[i]->rank));
    }
  }
  const Shape& grid = first.object->global_shape;
  // The i-th offset of the grid in row-major order: the first one no main replica holds is named.
  Shape expected(grid.size(), 0);
  for (const ObjectRef* m : mains) {
    if (m->object->global_offset != expected) break;
    for (size_t axis = grid.size(); axis-- > 0;) {
      if (++expected[axis] < grid[axis]) break;
      expected[axis] = 0;
    }
    if (std::all_of(expected.begin(), expected.end(), [](int64_t x) { return x == 0; })) {
      return;  // wrapped around: every shard present
    }
  }
  const auto held =
      std::find_if(refs.begin(), refs.end(), [&](const ObjectRef& r) { return r.object->global_offset == expected; });
  if (held != refs.end()) {
    throw ShardingError(
        fmt::format("sharded object '{}' has no main replica (held by rank {} with replica id "
                    "{}); one copy must have replica_id all zeros",
                    held->object->unique_key(), held->rank, to_string(held->object->replica_id)));
  }
  throw ShardingError(fmt::format(
      "sharded object '{}' is missing shard {} of its grid {}: no rank saves it ({} of the grid's shards are "
      "present); every shard of an object must be saved by some rank",
      key, to_string(expected), to_string(grid), mains.size()));
}

void validate_objects(const std::vector<LocalPlan>& plans) {
  std::vector<ObjectRef> refs;
  for (const LocalPlan& p : plans) {
    for (const ObjectPlan& o : p.objects) refs.push_back(ObjectRef{&o, p.rank});
  }
  std::stable_sort(refs.begin(), refs.end(),
                   [](const ObjectRef& a, const ObjectRef& b) { return a.object->key < b.object->key; });
  for (size_t i = 0; i < refs.size();) {
    size_t j = i;
    while (j < refs.size() && refs[j].object->key == refs[i].object->key) ++j;
    check_object_key(std::vector<ObjectRef>(refs.begin() + i, refs.begin() + j));
    i = j;
  }
}

}  // namespace

void validate_global_plan(const std::vector<LocalPlan>& plans, bool check_access) {
  std::vector<ShardRef> refs;
  for (const LocalPlan& p : plans) {
    for (const ShardPlan& s : p.tensors) refs.push_back(ShardRef{&s, p.rank});
  }
  std::stable_sort(refs.begin(), refs.end(),
                   [](const ShardRef& a, const ShardRef& b) { return a.shard->key < b.shard->key; });
  for (size_t i = 0; i < refs.size();) {
    size_t j = i;
    while (j < refs.size() && refs[j].shard->key == refs[i].shard->key) ++j;
    std::vector<ShardRef> group(refs.begin() + i, refs.begin() + j);
    check_consistent(group);
    if (check_access) check_coverage(group.front().shard->key, group.front().shard->global_shape, group);
    i = j;
  }
  if (check_access) validate_objects(plans);
}

}  // namespace distckpt::plan
