#include "plan/global_plan.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <unordered_map>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "format/dtype.h"
#include "plan/shard_groups.h"
#include "plan/validate.h"
#include "plan/wire.h"

namespace distckpt::plan {
namespace {

// Every group's writer: the unshared ones directly, the shared ones by the
// holder-set balance.
std::vector<int64_t> choose_writers(const std::vector<LocalPlan>& plans, const Grouping& g, WriterPolicy policy) {
  std::vector<int64_t> writer = choose_unshared_writers(plans, g, policy);
  std::vector<SharedShard> shared;
  for (size_t i = 0; i < writer.size(); ++i) {
    if (writer[i] == kShared) shared.push_back(shared_shard(plans, g, i));
  }
  const std::vector<int> chosen = balance_within_holder_sets(shared);
  for (size_t s = 0; s < shared.size(); ++s) {
    writer[shared[s].id] = static_cast<int64_t>(ref_of_rank(plans, g, g.groups[shared[s].id], chosen[s]));
  }
  return writer;
}

std::vector<std::vector<uint32_t>> assignments_of(const std::vector<LocalPlan>& plans, const Grouping& g,
                                                  const std::vector<int64_t>& writer) {
  std::vector<std::vector<uint32_t>> out(plans.size());
  for (int64_t w : writer) {
    if (w >= 0) out[g.refs[static_cast<size_t>(w)].plan].push_back(g.refs[static_cast<size_t>(w)].item);
  }
  for (size_t r = 0; r < plans.size(); ++r) sort_canonically(plans[r], out[r]);
  return out;
}

int32_t writer_of_chunk(const CheckpointMetadata& m, uint32_t file) { return m.files.at(file).writer_rank; }

}  // namespace

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

std::string rank_file_path(int rank) { return fmt::format("data/rank_{:05d}.bin", rank); }

std::vector<std::vector<uint32_t>> distribute_writers(const std::vector<LocalPlan>& plans, WriterPolicy policy) {
  const Grouping g = group_items(plans);
  return assignments_of(plans, g, choose_writers(plans, g, policy));
}

GlobalSavePlan make_global_save_plan(const std::vector<LocalPlan>& plans, WriterPolicy policy, bool check_access) {
  validate_global_plan(plans, check_access);
  const Grouping g = group_items(plans);
  const std::vector<int64_t> writer = choose_writers(plans, g, policy);
  GlobalSavePlan plan = assemble_global_plan(planned_records(plans, g, writer), static_cast<int>(plans.size()));
  plan.assignments = assignments_of(plans, g, writer);
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

bool objects_written_by_main_replicas(const StorageIndex& metadata, const WriterOf& writer_of, const LocalPlan& plan,
                                      int rank) {
  std::unordered_map<std::string, const ObjectRecord*> objects;
  for (const ObjectRecord& o : metadata.objects) objects.emplace(o.unique_key(), &o);
  for (const ObjectPlan& o : plan.objects) {
    if (!o.is_main()) continue;
    const auto it = objects.find(o.unique_key());
    if (it != objects.end() && writer_of(it->second->file) != rank) return false;
  }
  return true;
}

std::vector<uint32_t> local_assignment_from_metadata(const CheckpointMetadata& metadata, const LocalPlan& plan,
                                                     int rank) {
  return local_assignment_from_metadata(
      metadata, [&](const std::string& key) { return metadata.find_tensor(key); },
      [&](uint32_t file) { return metadata.files.at(file).writer_rank; }, plan, rank);
}

std::vector<uint32_t> local_assignment_from_metadata(const StorageIndex& metadata, const RecordLookup& find,
                                                     const WriterOf& writer_of, const LocalPlan& plan, int rank) {
  std::vector<uint32_t> items;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const ShardPlan& s = plan.tensors[i];
    if (s.stored_numel() == 0) continue;  // never stored
    const TensorRecord* record = find(s.key);
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
    if (writer_of(match->file) == rank) items.push_back(i);
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
    if (writer_of(it->second->file) == rank) {
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
