#include "plan/shard_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "io/checksum.h"

namespace distckpt::plan {
namespace {

// Dense ids for a set of strings, numbered in sorted order, so refs compare
// by integer instead of by string.
std::vector<uint32_t> sorted_ids(const std::vector<std::string_view>& names) {
  std::unordered_map<std::string_view, uint32_t> ids;
  ids.reserve(names.size());
  std::vector<std::string_view> distinct;
  for (std::string_view n : names) {
    if (ids.emplace(n, 0).second) distinct.push_back(n);
  }
  std::sort(distinct.begin(), distinct.end());
  for (uint32_t i = 0; i < distinct.size(); ++i) ids[distinct[i]] = i;
  std::vector<uint32_t> out;
  out.reserve(names.size());
  for (std::string_view n : names) out.push_back(ids[n]);
  return out;
}

bool is_main_ref(const std::vector<LocalPlan>& plans, const ShardGroup& group, const ItemRef& r) {
  return group.is_object ? object_of(plans, r).is_main() : tensor_of(plans, r).is_main();
}

int rank_of(const std::vector<LocalPlan>& plans, const ItemRef& r) { return plans[r.plan].rank; }

// Index into refs of the main replica of a group, or -1 (never written).
int64_t main_of(const std::vector<LocalPlan>& plans, const Grouping& g, const ShardGroup& group) {
  for (size_t k = group.begin; k < group.end; ++k) {
    if (is_main_ref(plans, group, g.refs[k])) return static_cast<int64_t>(k);
  }
  return -1;
}

// Group order, which the balancer reproduces from SharedShards alone.
bool comes_before(const SharedShard& a, const SharedShard& b) {
  if (a.is_object != b.is_object) return b.is_object;
  if (a.name != b.name) return a.name < b.name;
  if (a.box != b.box) return a.box < b.box;
  if (a.flat_start != b.flat_start) return a.flat_start < b.flat_start;
  return a.flat_stop < b.flat_stop;
}

}  // namespace

const ShardPlan& tensor_of(const std::vector<LocalPlan>& plans, const ItemRef& r) {
  return plans[r.plan].tensors[r.item];
}
const ObjectPlan& object_of(const std::vector<LocalPlan>& plans, const ItemRef& r) {
  return plans[r.plan].objects[r.item - plans[r.plan].tensors.size()];
}

Grouping group_items(const std::vector<LocalPlan>& plans) {
  Grouping g;
  std::vector<std::string_view> tensor_keys;
  std::vector<std::string> object_keys;
  std::vector<ItemRef> tensors, objects;
  for (uint32_t r = 0; r < plans.size(); ++r) {
    const LocalPlan& p = plans[r];
    for (uint32_t i = 0; i < p.tensors.size(); ++i) {
      tensor_keys.push_back(p.tensors[i].key);
      tensors.push_back(ItemRef{0, r, i});
    }
    for (uint32_t i = 0; i < p.objects.size(); ++i) {
      object_keys.push_back(p.objects[i].unique_key());
      objects.push_back(ItemRef{0, r, static_cast<uint32_t>(p.tensors.size() + i)});
    }
  }
  const std::vector<uint32_t> tensor_order = sorted_ids(tensor_keys);
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].order = tensor_order[i];
  const std::vector<uint32_t> object_order =
      sorted_ids(std::vector<std::string_view>(object_keys.begin(), object_keys.end()));
  for (size_t i = 0; i < objects.size(); ++i) objects[i].order = object_order[i];

  auto same_tensor_shard = [&](const ItemRef& a, const ItemRef& b) {
    if (a.order != b.order) return false;
    const ShardPlan& x = tensor_of(plans, a);
    const ShardPlan& y = tensor_of(plans, b);
    return x.box == y.box && x.flat.has_value() == y.flat.has_value() && (!x.flat || *x.flat == *y.flat);
  };
  std::sort(tensors.begin(), tensors.end(), [&](const ItemRef& a, const ItemRef& b) {
    if (a.order != b.order) return a.order < b.order;
    const ShardPlan& x = tensor_of(plans, a);
    const ShardPlan& y = tensor_of(plans, b);
    if (x.box != y.box) return x.box < y.box;
    const int64_t xs = x.flat ? x.flat->start : 0, ys = y.flat ? y.flat->start : 0;
    if (xs != ys) return xs < ys;
    const int64_t xe = x.flat ? x.flat->stop : -1, ye = y.flat ? y.flat->stop : -1;
    if (xe != ye) return xe < ye;
    return a.plan != b.plan ? a.plan < b.plan : a.item < b.item;
  });
  std::sort(objects.begin(), objects.end(), [](const ItemRef& a, const ItemRef& b) {
    if (a.order != b.order) return a.order < b.order;
    return a.plan != b.plan ? a.plan < b.plan : a.item < b.item;
  });

  g.refs = std::move(tensors);
  const size_t tensor_refs = g.refs.size();
  g.refs.insert(g.refs.end(), objects.begin(), objects.end());
  for (size_t i = 0; i < g.refs.size();) {
    const bool is_object = i >= tensor_refs;
    size_t j = i + 1;
    if (is_object) {
      while (j < g.refs.size() && g.refs[j].order == g.refs[i].order) ++j;
    } else {
      while (j < tensor_refs && same_tensor_shard(g.refs[i], g.refs[j])) ++j;
    }
    uint64_t bytes = plans[g.refs[i].plan].item_bytes(g.refs[i].item);
    g.groups.push_back(ShardGroup{is_object, i, j, bytes});
    i = j;
  }
  return g;
}

size_t ref_of_rank(const std::vector<LocalPlan>& plans, const Grouping& g, const ShardGroup& group, int rank) {
  size_t found = group.end;
  for (size_t k = group.begin; k < group.end; ++k) {
    if (rank_of(plans, g.refs[k]) != rank) continue;
    if (is_main_ref(plans, group, g.refs[k])) return k;
    if (found == group.end) found = k;
  }
  if (found == group.end)
    throw ProtocolError(fmt::format("rank {} was chosen to write a shard it does not hold", rank));
  return found;
}

std::vector<int64_t> choose_unshared_writers(const std::vector<LocalPlan>& plans, const Grouping& g,
                                             WriterPolicy policy) {
  std::vector<int64_t> writer(g.groups.size(), kNotWritten);
  for (size_t i = 0; i < g.groups.size(); ++i) {
    const ShardGroup& group = g.groups[i];
    const int64_t main = main_of(plans, g, group);
    if (main < 0 || (!group.is_object && group.bytes == 0)) continue;  // empty tensor shards are not stored
    const bool one_holder = g.refs[group.begin].plan == g.refs[group.end - 1].plan;
    // An object's replicas may differ (per-rank RNG state under one key):
    // the main replica's is the one saved, under every policy (Megatron's
    // rule); objects are small, so balancing them buys nothing.
    if (policy == WriterPolicy::kMainReplica || group.is_object) {
      writer[i] = main;
    } else if (policy == WriterPolicy::kLowestRank || one_holder) {
      writer[i] = static_cast<int64_t>(ref_of_rank(plans, g, group, rank_of(plans, g.refs[group.begin])));
    } else {
      writer[i] = kShared;
    }
  }
  return writer;
}

SharedShard shared_shard(const std::vector<LocalPlan>& plans, const Grouping& g, size_t group_index) {
  const ShardGroup& group = g.groups[group_index];
  SharedShard s;
  s.is_object = group.is_object;
  s.bytes = group.bytes;
  const ItemRef& first = g.refs[group.begin];
  if (group.is_object) {
    s.name = object_of(plans, first).unique_key();
  } else {
    const ShardPlan& t = tensor_of(plans, first);
    s.name = t.key;
    s.box = t.box;
    if (t.flat) {
      s.flat_start = t.flat->start;
      s.flat_stop = t.flat->stop;
    }
  }
  for (size_t k = group.begin; k < group.end; ++k) {
    const int rank = rank_of(plans, g.refs[k]);
    if (s.holders.empty() || s.holders.back() != rank) s.holders.push_back(rank);  // refs come by rank
  }
  s.id = static_cast<uint32_t>(group_index);
  return s;
}

std::vector<int> balance_within_holder_sets(const std::vector<SharedShard>& shards) {
  std::map<std::vector<int>, std::vector<size_t>> sets;
  for (size_t i = 0; i < shards.size(); ++i) sets[shards[i].holders].push_back(i);
  std::vector<int> choice(shards.size(), -1);
  for (auto& [holders, members] : sets) {
    if (holders.empty()) throw ProtocolError("a shared shard lists no holder");
    std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
      if (shards[a].bytes != shards[b].bytes) return shards[a].bytes > shards[b].bytes;
      return comes_before(shards[a], shards[b]);
    });
    // plan/balance.h's rule, for items that all share one candidate set: a
    // heap of the holders' loads instead of a scan of every candidate per
    // item (a set can span the world). Position p is holders[(start + p) % n];
    // the least load wins, ties the lowest position.
    const size_t n = holders.size();
    const size_t start = io::xxh3(holders.data(), n * sizeof(int)) % n;
    using Slot = std::pair<uint64_t, size_t>;  // (load, position)
    std::vector<Slot> initial;
    initial.reserve(n);
    for (size_t p = 0; p < n; ++p) initial.emplace_back(0, p);
    std::priority_queue<Slot, std::vector<Slot>, std::greater<>> least(std::greater<>(), std::move(initial));
    for (size_t m : members) {
      auto [load, position] = least.top();
      least.pop();
      choice[m] = holders[(start + position) % n];
      least.emplace(load + shards[m].bytes, position);
    }
  }
  return choice;
}

PlannedRecords planned_records(const std::vector<LocalPlan>& plans, const Grouping& g,
                               const std::vector<int64_t>& writer) {
  PlannedRecords out;
  const auto record_of = [&](const ShardPlan& s) -> PlannedTensor& {
    if (out.tensors.empty() || out.tensors.back().key != s.key) {  // groups come sorted by key
      out.tensors.push_back(PlannedTensor{s.key, s.dtype, s.global_shape, {}});
    }
    return out.tensors.back();
  };
  for (size_t i = 0; i < g.groups.size(); ++i) {
    const ShardGroup& group = g.groups[i];
    if (writer[i] < 0) {
      // Nothing to write, but a tensor without elements is still listed:
      // a load asks for it like any other.
      if (!group.is_object && group.bytes == 0) record_of(tensor_of(plans, g.refs[group.begin]));
      continue;
    }
    const ItemRef& w = g.refs[static_cast<size_t>(writer[i])];
    if (group.is_object) {
      const ObjectPlan& o = object_of(plans, w);
      out.objects.push_back(PlannedObject{o.key, o.global_shape, o.global_offset, rank_of(plans, w)});
      continue;
    }
    const ShardPlan& s = tensor_of(plans, w);
    record_of(s).chunks.push_back(PlannedChunk{s.box, s.flat, rank_of(plans, w)});
  }
  return out;
}

GlobalSavePlan assemble_global_plan(const PlannedRecords& records, int world) {
  GlobalSavePlan plan;
  CheckpointMetadata& m = plan.skeleton;
  m.world_size = world;
  std::vector<int> writers;
  for (const PlannedTensor& t : records.tensors) {
    for (const PlannedChunk& c : t.chunks) writers.push_back(c.writer);
  }
  for (const PlannedObject& o : records.objects) writers.push_back(o.writer);
  std::sort(writers.begin(), writers.end());
  writers.erase(std::unique(writers.begin(), writers.end()), writers.end());
  for (const int r : writers) {
    if (r < 0 || r >= world) throw ProtocolError(fmt::format("a planned writer is rank {} of {}", r, world));
    m.files.push_back(FileRecord{rank_file_path(r), 0, r});
  }
  const auto file_of = [&](int rank) {
    return static_cast<uint32_t>(std::lower_bound(writers.begin(), writers.end(), rank) - writers.begin());
  };
  m.tensors.reserve(records.tensors.size());
  for (const PlannedTensor& t : records.tensors) {
    TensorRecord record;
    record.key = t.key;
    record.dtype = t.dtype;
    record.global_shape = t.global_shape;
    record.chunks.reserve(t.chunks.size());
    for (const PlannedChunk& c : t.chunks) {
      ChunkRecord chunk;
      chunk.box = c.box;
      chunk.flat = c.flat;
      chunk.file = file_of(c.writer);
      chunk.byte_length = static_cast<uint64_t>(c.flat ? c.flat->size() : c.box.numel()) * dtype_size(t.dtype);
      record.chunks.push_back(std::move(chunk));
    }
    m.tensors.push_back(std::move(record));
  }
  m.objects.reserve(records.objects.size());
  for (const PlannedObject& o : records.objects) {
    ObjectRecord record;
    record.key = o.key;
    record.global_shape = o.global_shape;
    record.global_offset = o.global_offset;
    record.file = file_of(o.writer);
    m.objects.push_back(std::move(record));
  }
  index_slots(plan, static_cast<size_t>(world));
  return plan;
}

}  // namespace distckpt::plan
