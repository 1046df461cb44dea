#include "plan/validate.h"

#include <fmt/format.h>

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

void validate_objects(const std::vector<LocalPlan>& plans) {
  struct ObjectRef {
    std::string unique_key;
    const ObjectPlan* object;
    int rank;
  };
  std::vector<ObjectRef> refs;
  for (const LocalPlan& p : plans) {
    for (const ObjectPlan& o : p.objects) refs.push_back(ObjectRef{o.unique_key(), &o, p.rank});
  }
  std::sort(refs.begin(), refs.end(), [](const ObjectRef& a, const ObjectRef& b) {
    return a.unique_key != b.unique_key ? a.unique_key < b.unique_key : a.rank < b.rank;
  });
  for (size_t i = 0; i < refs.size();) {
    size_t j = i;
    const ObjectRef* main = nullptr;
    for (; j < refs.size() && refs[j].unique_key == refs[i].unique_key; ++j) {
      if (!refs[j].object->is_main()) continue;
      if (main) {
        throw ShardingError(
            fmt::format("sharded object '{}' has a main replica on rank {} and on rank {}; give "
                        "the copies non-zero replica ids",
                        refs[i].unique_key, main->rank, refs[j].rank));
      }
      main = &refs[j];
    }
    if (!main) {
      throw ShardingError(
          fmt::format("sharded object '{}' has no main replica (held by rank {} with replica id "
                      "{}); one copy must have replica_id all zeros",
                      refs[i].unique_key, refs[i].rank, to_string(refs[i].object->replica_id)));
    }
    i = j;
  }
}

}  // namespace

void validate_global_plan(const std::vector<LocalPlan>& plans) {
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
    check_coverage(group.front().shard->key, group.front().shard->global_shape, group);
    i = j;
  }
  validate_objects(plans);
}

}  // namespace distckpt::plan
