#include "plan/global_plan.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <string_view>
#include <unordered_map>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "format/dtype.h"
#include "plan/balance.h"
#include "plan/validate.h"
#include "plan/wire.h"

namespace distckpt::plan {
namespace {

// One item of one rank's plan.
struct ItemRef {
  uint32_t order;  // rank of the item's key (tensors) or unique key (objects) in sorted order
  uint32_t rank;
  uint32_t item;
};

// A distinct stored shard: a run [begin, end) of ItemRefs, sorted by rank.
struct ShardGroup {
  bool is_object;
  size_t begin, end;
  uint64_t bytes;
};

const ShardPlan& tensor_of(const std::vector<LocalPlan>& plans, const ItemRef& r) {
  return plans[r.rank].tensors[r.item];
}
const ObjectPlan& object_of(const std::vector<LocalPlan>& plans, const ItemRef& r) {
  return plans[r.rank].objects[r.item - plans[r.rank].tensors.size()];
}

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

// Every item of every plan grouped into distinct shards, tensors first (in
// key, box, flat order), then objects (in unique-key order).
struct Grouping {
  std::vector<ItemRef> refs;
  std::vector<ShardGroup> groups;
};

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
    return a.rank != b.rank ? a.rank < b.rank : a.item < b.item;
  });
  std::sort(objects.begin(), objects.end(), [](const ItemRef& a, const ItemRef& b) {
    if (a.order != b.order) return a.order < b.order;
    return a.rank != b.rank ? a.rank < b.rank : a.item < b.item;
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
    const LocalPlan& p = plans[g.refs[i].rank];
    uint64_t bytes = p.item_bytes(g.refs[i].item);
    if (is_object) {  // objects may differ in size between replicas: plan for the largest
      for (size_t k = i; k < j; ++k) bytes = std::max(bytes, plans[g.refs[k].rank].item_bytes(g.refs[k].item));
    }
    g.groups.push_back(ShardGroup{is_object, i, j, bytes});
    i = j;
  }
  return g;
}

bool is_main_ref(const std::vector<LocalPlan>& plans, const ShardGroup& group, const ItemRef& r) {
  return group.is_object ? object_of(plans, r).is_main() : tensor_of(plans, r).is_main();
}

// Index into refs of the main replica of a group, or -1 (never written).
int64_t main_of(const std::vector<LocalPlan>& plans, const Grouping& g, const ShardGroup& group) {
  for (size_t k = group.begin; k < group.end; ++k) {
    if (is_main_ref(plans, group, g.refs[k])) return static_cast<int64_t>(k);
  }
  return -1;
}

// The ref of `rank` in a group; its main replica when it holds several copies.
size_t ref_of_rank(const std::vector<LocalPlan>& plans, const Grouping& g, const ShardGroup& group, uint32_t rank) {
  size_t found = group.end;
  for (size_t k = group.begin; k < group.end; ++k) {
    if (g.refs[k].rank != rank) continue;
    if (is_main_ref(plans, group, g.refs[k])) return k;
    if (found == group.end) found = k;
  }
  return found;
}

// For every written group, the index into refs of its writer's item.
std::vector<int64_t> choose_writers(const std::vector<LocalPlan>& plans, const Grouping& g, WriterPolicy policy) {
  std::vector<int64_t> writer(g.groups.size(), -1);
  std::vector<uint64_t> load(plans.size(), 0);
  std::vector<size_t> shared;  // groups with more than one holder rank (balanced policy)
  for (size_t i = 0; i < g.groups.size(); ++i) {
    const ShardGroup& group = g.groups[i];
    const int64_t main = main_of(plans, g, group);
    if (main < 0 || (!group.is_object && group.bytes == 0)) continue;  // empty tensor shards are not stored
    const bool one_holder = g.refs[group.begin].rank == g.refs[group.end - 1].rank;
    if (policy == WriterPolicy::kMainReplica) {
      writer[i] = main;
    } else if (policy == WriterPolicy::kLowestRank || one_holder) {
      writer[i] = static_cast<int64_t>(ref_of_rank(plans, g, group, g.refs[group.begin].rank));
    } else {
      shared.push_back(i);
      continue;
    }
    load[g.refs[static_cast<size_t>(writer[i])].rank] += group.bytes;
  }
  if (policy != WriterPolicy::kBalanced) return writer;
  std::vector<BalanceItem> items(shared.size());
  for (size_t s = 0; s < shared.size(); ++s) {
    const ShardGroup& group = g.groups[shared[s]];
    items[s].bytes = group.bytes;
    for (size_t k = group.begin; k < group.end; ++k) items[s].candidates.push_back(static_cast<int>(g.refs[k].rank));
  }
  const Balance balance = balance_least_loaded(items, std::move(load));
  for (size_t s = 0; s < shared.size(); ++s) {
    const uint32_t best = static_cast<uint32_t>(balance.choice[s]);
    writer[shared[s]] = static_cast<int64_t>(ref_of_rank(plans, g, g.groups[shared[s]], best));
  }
  return writer;
}

std::vector<std::vector<uint32_t>> assignments_of(const std::vector<LocalPlan>& plans, const Grouping& g,
                                                  const std::vector<int64_t>& writer) {
  std::vector<std::vector<uint32_t>> out(plans.size());
  for (int64_t w : writer) {
    if (w >= 0) out[g.refs[static_cast<size_t>(w)].rank].push_back(g.refs[static_cast<size_t>(w)].item);
  }
  for (size_t r = 0; r < plans.size(); ++r) sort_canonically(plans[r], out[r]);
  return out;
}

int32_t writer_of_chunk(const CheckpointMetadata& m, uint32_t file) { return m.files.at(file).writer_rank; }

// Slots of every rank in skeleton order (= each rank's canonical order),
// and the payload bytes each rank writes.
void index_slots(GlobalSavePlan& plan, size_t world) {
  const CheckpointMetadata& m = plan.skeleton;
  plan.slots.assign(world, {});
  plan.bytes_per_rank.assign(world, 0);
  for (uint32_t t = 0; t < m.tensors.size(); ++t) {
    for (uint32_t c = 0; c < m.tensors[t].chunks.size(); ++c) {
      const ChunkRecord& chunk = m.tensors[t].chunks[c];
      const auto r = static_cast<size_t>(writer_of_chunk(m, chunk.file));
      plan.slots[r].push_back(WriteSlot{false, t, c});
      plan.bytes_per_rank[r] += chunk.byte_length;
    }
  }
  for (uint32_t o = 0; o < m.objects.size(); ++o) {
    plan.slots[static_cast<size_t>(writer_of_chunk(m, m.objects[o].file))].push_back(WriteSlot{true, o, 0});
  }
}

}  // namespace

std::string rank_file_path(int rank) { return fmt::format("data/rank_{:05d}.bin", rank); }

std::vector<std::vector<uint32_t>> distribute_writers(const std::vector<LocalPlan>& plans, WriterPolicy policy) {
  const Grouping g = group_items(plans);
  return assignments_of(plans, g, choose_writers(plans, g, policy));
}

GlobalSavePlan make_global_save_plan(const std::vector<LocalPlan>& plans, WriterPolicy policy, bool check_access) {
  validate_global_plan(plans, check_access);
  const Grouping g = group_items(plans);
  const std::vector<int64_t> writer = choose_writers(plans, g, policy);

  GlobalSavePlan plan;
  plan.assignments = assignments_of(plans, g, writer);
  CheckpointMetadata& m = plan.skeleton;
  m.world_size = static_cast<int32_t>(plans.size());
  std::vector<uint32_t> file_of_rank(plans.size(), 0);
  for (size_t r = 0; r < plans.size(); ++r) {
    if (plan.assignments[r].empty()) continue;
    file_of_rank[r] = static_cast<uint32_t>(m.files.size());
    m.files.push_back(FileRecord{rank_file_path(static_cast<int>(r)), 0, static_cast<int32_t>(r)});
  }
  const auto record_of = [&](const ShardPlan& s) -> TensorRecord& {
    if (m.tensors.empty() || m.tensors.back().key != s.key) {  // groups come sorted by key
      TensorRecord record;
      record.key = s.key;
      record.dtype = s.dtype;
      record.global_shape = s.global_shape;
      m.tensors.push_back(std::move(record));
    }
    return m.tensors.back();
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
      ObjectRecord record;
      record.key = o.key;
      record.global_shape = o.global_shape;
      record.global_offset = o.global_offset;
      record.file = file_of_rank[w.rank];
      m.objects.push_back(std::move(record));
      continue;
    }
    const ShardPlan& s = tensor_of(plans, w);
    TensorRecord& record = record_of(s);
    ChunkRecord chunk;
    chunk.box = s.box;
    chunk.flat = s.flat;
    chunk.file = file_of_rank[w.rank];
    chunk.byte_length = static_cast<uint64_t>(s.stored_numel()) * dtype_size(s.dtype);
    record.chunks.push_back(std::move(chunk));
  }
  index_slots(plan, plans.size());
  return plan;
}

GlobalSavePlan global_plan_from_metadata(const CheckpointMetadata& metadata) {
  GlobalSavePlan plan;
  plan.skeleton = metadata;
  CheckpointMetadata& m = plan.skeleton;
  for (TensorRecord& t : m.tensors) {
    for (ChunkRecord& c : t.chunks) {
      c.byte_offset = 0;
      c.block_checksums.clear();
    }
  }
  for (ObjectRecord& o : m.objects) {
    o.byte_offset = 0;
    o.byte_length = 0;
    o.block_checksums.clear();
  }
  for (FileRecord& f : m.files) f.size = 0;
  index_slots(plan, static_cast<size_t>(metadata.world_size));
  plan.assignments.assign(static_cast<size_t>(metadata.world_size), {});
  return plan;
}

std::vector<uint32_t> local_assignment_from_metadata(const CheckpointMetadata& metadata, const LocalPlan& plan,
                                                     int rank) {
  std::vector<uint32_t> items;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const ShardPlan& s = plan.tensors[i];
    if (s.stored_numel() == 0) continue;  // never stored
    const TensorRecord* record = metadata.find_tensor(s.key);
    const ChunkRecord* match = nullptr;
    if (record) {
      for (const ChunkRecord& c : record->chunks) {  // chunks of one key: few, and only at restart
        if (c.box == s.box && c.flat.has_value() == s.flat.has_value() && (!c.flat || *c.flat == *s.flat)) {
          match = &c;
          break;
        }
      }
    }
    if (!match) {
      if (!s.is_main()) continue;  // a replica group without a main is never written
      throw CheckpointError(fmt::format(
          "the plan recorded in the checkpoint has no chunk {} of '{}': it was saved with another structure",
          to_string(s.box), s.key));
    }
    if (metadata.files.at(match->file).writer_rank == rank) items.push_back(i);
  }
  std::unordered_map<std::string, const ObjectRecord*> objects;
  for (const ObjectRecord& o : metadata.objects) objects.emplace(o.unique_key(), &o);
  for (uint32_t i = 0; i < plan.objects.size(); ++i) {
    const std::string key = plan.objects[i].unique_key();
    auto it = objects.find(key);
    if (it == objects.end()) {
      throw CheckpointError(fmt::format(
          "the plan recorded in the checkpoint has no object '{}': it was saved with another structure", key));
    }
    if (metadata.files.at(it->second->file).writer_rank == rank) {
      items.push_back(static_cast<uint32_t>(plan.tensors.size() + i));
    }
  }
  sort_canonically(plan, items);
  return items;
}

std::string encode_write_results(const WriteResults& results) {
  flatbuffers::FlatBufferBuilder b(256 + 64 * results.items.size());
  std::vector<flatbuffers::Offset<fb::ItemWrite>> items;
  items.reserve(results.items.size());
  for (const ItemWrite& w : results.items) {
    items.push_back(fb::CreateItemWrite(b, w.byte_offset, w.byte_length, b.CreateVector(w.block_checksums)));
  }
  b.Finish(fb::CreateWriteResults(b, results.rank, results.file_size, b.CreateVector(items)));
  return message_bytes(b);
}

WriteResults decode_write_results(std::string_view bytes, const std::string& origin) {
  const auto* root = &verified_message<fb::WriteResults>(bytes, "write results", origin);
  WriteResults out;
  out.rank = root->rank();
  out.file_size = root->file_size();
  if (root->items()) {
    out.items.reserve(root->items()->size());
    for (const fb::ItemWrite* w : *root->items()) {
      out.items.push_back(
          ItemWrite{w->byte_offset(), w->byte_length(), scalars(w->block_checksums(), "write results", origin)});
    }
  }
  return out;
}

CheckpointMetadata fill_skeleton(const GlobalSavePlan& plan, const std::vector<WriteResults>& results) {
  CheckpointMetadata m = plan.skeleton;
  const uint64_t block = m.checksum_block_size;
  for (size_t r = 0; r < plan.slots.size(); ++r) {
    const std::vector<WriteSlot>& slots = plan.slots[r];
    const std::vector<ItemWrite>& items = r < results.size() ? results[r].items : std::vector<ItemWrite>{};
    if (items.size() != slots.size()) {
      throw ProtocolError(
          fmt::format("rank {} reports {} written items but was assigned {}", r, items.size(), slots.size()));
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      const WriteSlot& s = slots[k];
      const ItemWrite& w = items[k];
      const uint64_t expected_checksums = block == 0 ? 0 : (w.byte_length + block - 1) / block;
      if (w.block_checksums.size() != expected_checksums) {
        throw ProtocolError(fmt::format("rank {} reports {} checksums for a {}-byte item (expected {})", r,
                                        w.block_checksums.size(), w.byte_length, expected_checksums));
      }
      if (s.is_object) {
        ObjectRecord& o = m.objects[s.index];
        o.byte_offset = w.byte_offset;
        o.byte_length = w.byte_length;
        o.block_checksums = w.block_checksums;
        continue;
      }
      ChunkRecord& c = m.tensors[s.index].chunks[s.chunk];
      if (w.byte_length != c.byte_length) {
        throw ProtocolError(fmt::format("rank {} wrote {} bytes for chunk {} of '{}' but {} were planned", r,
                                        w.byte_length, to_string(c.box), m.tensors[s.index].key, c.byte_length));
      }
      c.byte_offset = w.byte_offset;
      c.block_checksums = w.block_checksums;
    }
  }
  for (FileRecord& f : m.files) {
    const auto r = static_cast<size_t>(f.writer_rank);
    if (r < results.size()) f.size = results[r].file_size;
  }
  return m;
}

}  // namespace distckpt::plan
