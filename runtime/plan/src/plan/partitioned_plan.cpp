#include "plan/partitioned_plan.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "plan/validate.h"
#include "plan/wire.h"

namespace distckpt::plan {
namespace {

using Longs = flatbuffers::Vector<int64_t>;

int hashed_rank(const void* data, size_t bytes, int world) {
  return static_cast<int>(io::xxh3(data, bytes) % static_cast<uint64_t>(world));
}

std::string origin_of(const char* role, size_t rank) { return fmt::format("{} {}", role, rank); }

constexpr const char* kShards = "shards to balance";
constexpr const char* kChoices = "writer choices";
constexpr const char* kDecision = "writer decision";

std::string unique_key_of(const PlannedObject& o) {
  return ObjectPlan{o.key, o.global_shape, o.global_offset, {}, 0}.unique_key();
}

}  // namespace

// ---- Messages ---------------------------------------------------------------

std::string encode_shared_shards(const std::vector<SharedShard>& shards) {
  flatbuffers::FlatBufferBuilder b(256 + 64 * shards.size());
  std::vector<flatbuffers::Offset<fb::SharedShard>> out;
  out.reserve(shards.size());
  for (const SharedShard& s : shards) {
    out.push_back(fb::CreateSharedShard(b, s.is_object, b.CreateString(s.name), b.CreateVector(s.box.offset),
                                        b.CreateVector(s.box.length), s.flat_start, s.flat_stop, s.bytes,
                                        b.CreateVector(s.holders), s.id));
  }
  b.Finish(fb::CreateSharedShards(b, b.CreateVector(out)));
  return message_bytes(b);
}

std::vector<SharedShard> decode_shared_shards(std::string_view bytes, const std::string& origin) {
  const auto& root = verified_message<fb::SharedShards>(bytes, kShards, origin);
  std::vector<SharedShard> out;
  if (!root.shards()) return out;
  out.reserve(root.shards()->size());
  for (const fb::SharedShard* s : *root.shards()) {
    SharedShard shard;
    shard.is_object = s->is_object();
    shard.name = s->name()->str();
    shard.box = Box{scalars(s->offset(), kShards, origin), scalars(s->length(), kShards, origin)};
    shard.flat_start = s->flat_start();
    shard.flat_stop = s->flat_stop();
    shard.bytes = s->bytes();
    shard.holders = scalars(s->holders(), kShards, origin);
    shard.id = s->id();
    if (shard.holders.empty()) malformed(kShards, origin, fmt::format("'{}' has no holder", shard.name));
    for (size_t k = 0; k < shard.holders.size(); ++k) {
      if (shard.holders[k] < 0 || (k > 0 && shard.holders[k] <= shard.holders[k - 1])) {
        malformed(kShards, origin, fmt::format("the holders of '{}' are not distinct ascending ranks", shard.name));
      }
    }
    out.push_back(std::move(shard));
  }
  return out;
}

std::string encode_writer_choices(const WriterChoices& choices) {
  flatbuffers::FlatBufferBuilder b(64 + 8 * choices.ids.size());
  b.Finish(fb::CreateWriterChoices(b, b.CreateVector(choices.ids), b.CreateVector(choices.writers)));
  return message_bytes(b);
}

WriterChoices decode_writer_choices(std::string_view bytes, const std::string& origin) {
  const auto& root = verified_message<fb::WriterChoices>(bytes, kChoices, origin);
  WriterChoices out{scalars(root.ids(), kChoices, origin), scalars(root.writers(), kChoices, origin)};
  if (out.ids.size() != out.writers.size()) malformed(kChoices, origin, "as many ids as writers are needed");
  return out;
}

std::string encode_plan_decision(const PlanDecision& decision) {
  flatbuffers::FlatBufferBuilder b(256 + 8 * decision.items.size());
  std::vector<flatbuffers::Offset<fb::PlannedTensor>> tensors;
  for (const PlannedTensor& t : decision.records.tensors) {
    std::vector<flatbuffers::Offset<fb::PlannedChunk>> chunks;
    for (const PlannedChunk& c : t.chunks) {
      chunks.push_back(fb::CreatePlannedChunk(b, b.CreateVector(c.box.offset), b.CreateVector(c.box.length),
                                              c.flat ? c.flat->start : -1, c.flat ? c.flat->stop : -1, c.writer));
    }
    tensors.push_back(fb::CreatePlannedTensor(b, b.CreateString(t.key), b.CreateString(dtype_name(t.dtype)),
                                              b.CreateVector(t.global_shape), b.CreateVector(chunks)));
  }
  std::vector<flatbuffers::Offset<fb::PlannedObject>> objects;
  for (const PlannedObject& o : decision.records.objects) {
    objects.push_back(fb::CreatePlannedObject(b, b.CreateString(o.key), b.CreateVector(o.global_shape),
                                              b.CreateVector(o.global_offset), o.writer));
  }
  b.Finish(fb::CreatePlanDecision(b, b.CreateVector(decision.items), b.CreateVector(tensors), b.CreateVector(objects)));
  return message_bytes(b);
}

PlanDecision decode_plan_decision(std::string_view bytes, const std::string& origin) {
  const auto& root = verified_message<fb::PlanDecision>(bytes, kDecision, origin);
  const auto longs = [&](const Longs* v) { return scalars(v, kDecision, origin); };
  PlanDecision out;
  out.items = scalars(root.items(), kDecision, origin);
  if (root.tensors()) {
    for (const fb::PlannedTensor* t : *root.tensors()) {
      PlannedTensor tensor;
      tensor.key = t->key()->str();
      try {
        tensor.dtype = dtype_from_name(t->dtype()->str());
      } catch (const CorruptionError& e) {
        malformed(kDecision, origin, e.what());
      }
      tensor.global_shape = longs(t->global_shape());
      if (t->chunks()) {
        for (const fb::PlannedChunk* c : *t->chunks()) {
          PlannedChunk chunk;
          chunk.box = Box{longs(c->offset()), longs(c->length())};
          if (chunk.box.offset.size() != tensor.global_shape.size() ||
              chunk.box.length.size() != tensor.global_shape.size()) {
            malformed(kDecision, origin, fmt::format("a chunk of '{}' has a box of the wrong rank", tensor.key));
          }
          if (c->flat_start() >= 0) chunk.flat = FlatRange{c->flat_start(), c->flat_stop()};
          chunk.writer = c->writer();
          tensor.chunks.push_back(std::move(chunk));
        }
      }
      out.records.tensors.push_back(std::move(tensor));
    }
  }
  if (root.objects()) {
    for (const fb::PlannedObject* o : *root.objects()) {
      out.records.objects.push_back(
          PlannedObject{o->key()->str(), longs(o->global_shape()), longs(o->global_offset()), o->writer()});
    }
  }
  return out;
}

// ---- Steps ------------------------------------------------------------------

int planner_of(std::string_view key, int world) { return hashed_rank(key.data(), key.size(), world); }

int balancer_of(const std::vector<int>& holders, int world) {
  return hashed_rank(holders.data(), holders.size() * sizeof(int), world);
}

std::vector<std::string> route_local_plan(const LocalPlan& plan, int world) {
  std::map<int, std::pair<LocalPlan, std::vector<uint32_t>>> parts;  // by planner: few per rank
  const auto part_of = [&](const std::string& key) -> std::pair<LocalPlan, std::vector<uint32_t>>& {
    auto& part = parts[planner_of(key, world)];
    part.first.rank = plan.rank;
    return part;
  };
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    auto& [part, items] = part_of(plan.tensors[i].key);
    part.tensors.push_back(plan.tensors[i]);
    items.push_back(i);
  }
  // Every tensor before any object: each part lists its items in that order too.
  for (uint32_t i = 0; i < plan.objects.size(); ++i) {
    auto& [part, items] = part_of(plan.objects[i].key);
    part.objects.push_back(plan.objects[i]);
    items.push_back(static_cast<uint32_t>(plan.tensors.size() + i));
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (const auto& [planner, part] : parts)
    out[static_cast<size_t>(planner)] = encode_plan_part(part.first, part.second);
  return out;
}

PlannerShare plan_share(const std::vector<std::string>& received, WriterPolicy policy, bool check_access) {
  PlannerShare share;
  for (size_t r = 0; r < received.size(); ++r) {
    if (received[r].empty()) continue;
    const std::string origin = origin_of("rank", r);
    std::vector<uint32_t> items;
    LocalPlan part = decode_plan_part(received[r], origin, items);
    if (part.rank != static_cast<int>(r)) malformed("save plan", origin, fmt::format("it says rank {}", part.rank));
    share.plans.push_back(std::move(part));
    share.items.push_back(std::move(items));
  }
  validate_global_plan(share.plans, check_access);
  share.grouping = group_items(share.plans);
  share.writer = choose_unshared_writers(share.plans, share.grouping, policy);
  return share;
}

std::vector<std::string> shared_shards_by_balancer(const PlannerShare& share, int world) {
  std::map<int, std::vector<SharedShard>> by_balancer;
  for (size_t i = 0; i < share.writer.size(); ++i) {
    if (share.writer[i] != kShared) continue;
    SharedShard s = shared_shard(share.plans, share.grouping, i);
    by_balancer[balancer_of(s.holders, world)].push_back(std::move(s));
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (const auto& [balancer, shards] : by_balancer) {
    out[static_cast<size_t>(balancer)] = encode_shared_shards(shards);
  }
  return out;
}

std::vector<std::string> balance_shares(const std::vector<std::string>& received) {
  std::vector<SharedShard> shards;
  std::vector<size_t> planner;  // per shard, who sent it
  for (size_t p = 0; p < received.size(); ++p) {
    if (received[p].empty()) continue;
    std::vector<SharedShard> sent = decode_shared_shards(received[p], origin_of("planner", p));
    std::move(sent.begin(), sent.end(), std::back_inserter(shards));
    planner.resize(shards.size(), p);
  }
  const std::vector<int> chosen = balance_within_holder_sets(shards);
  std::map<size_t, WriterChoices> answers;  // by planner
  for (size_t s = 0; s < shards.size(); ++s) {
    WriterChoices& a = answers[planner[s]];
    a.ids.push_back(shards[s].id);
    a.writers.push_back(chosen[s]);
  }
  std::vector<std::string> out(received.size());
  for (const auto& [p, a] : answers) out[p] = encode_writer_choices(a);
  return out;
}

void apply_writer_choices(PlannerShare& share, const std::vector<std::string>& choices) {
  const Grouping& g = share.grouping;
  for (size_t b = 0; b < choices.size(); ++b) {
    if (choices[b].empty()) continue;
    const std::string origin = origin_of("balancer", b);
    const WriterChoices answer = decode_writer_choices(choices[b], origin);
    for (size_t k = 0; k < answer.ids.size(); ++k) {
      const uint32_t id = answer.ids[k];
      if (id >= share.writer.size() || share.writer[id] != kShared) {
        malformed(kChoices, origin, fmt::format("shard id {} was not sent to it", id));
      }
      share.writer[id] = static_cast<int64_t>(ref_of_rank(share.plans, g, g.groups[id], answer.writers[k]));
    }
  }
  if (std::count(share.writer.begin(), share.writer.end(), kShared) > 0) {
    throw ProtocolError("a shared shard got no writer from its balancer");
  }
}

std::vector<std::string> decide_share(PlannerShare& share, const std::vector<std::string>& choices, int world,
                                      int coordinator) {
  apply_writer_choices(share, choices);
  const Grouping& g = share.grouping;
  std::map<int, std::vector<uint32_t>> items_of_rank;
  for (const int64_t w : share.writer) {
    if (w < 0) continue;
    const ItemRef& ref = g.refs[static_cast<size_t>(w)];
    items_of_rank[share.plans[ref.plan].rank].push_back(share.items[ref.plan][ref.item]);
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  if (coordinator < 0) {
    for (auto& [rank, items] : items_of_rank)
      out[static_cast<size_t>(rank)] = encode_plan_decision({std::move(items), {}});
    return out;
  }
  PlanDecision to_coordinator{std::move(items_of_rank[coordinator]), planned_records(share.plans, g, share.writer)};
  items_of_rank.erase(coordinator);
  for (auto& [rank, items] : items_of_rank)
    out[static_cast<size_t>(rank)] = encode_plan_decision({std::move(items), {}});
  if (!to_coordinator.items.empty() || !to_coordinator.records.tensors.empty() ||
      !to_coordinator.records.objects.empty()) {
    out[static_cast<size_t>(coordinator)] = encode_plan_decision(to_coordinator);
  }
  return out;
}

std::vector<uint32_t> assignment_from_decisions(const std::vector<std::string>& decisions, const LocalPlan& plan) {
  std::vector<uint32_t> out;
  std::vector<bool> seen(plan.item_count(), false);
  for (size_t p = 0; p < decisions.size(); ++p) {
    if (decisions[p].empty()) continue;
    const std::string origin = origin_of("planner", p);
    for (const uint32_t item : decode_plan_decision(decisions[p], origin).items) {
      if (item >= seen.size() || seen[item]) {
        malformed(kDecision, origin, fmt::format("item {} of {} is unknown or assigned twice", item, seen.size()));
      }
      seen[item] = true;
      out.push_back(item);
    }
  }
  sort_canonically(plan, out);
  return out;
}

GlobalSavePlan global_plan_from_decisions(const std::vector<std::string>& decisions, int world) {
  PlannedRecords records;
  for (size_t p = 0; p < decisions.size(); ++p) {
    if (decisions[p].empty()) continue;
    PlannedRecords part = decode_plan_decision(decisions[p], origin_of("planner", p)).records;
    std::move(part.tensors.begin(), part.tensors.end(), std::back_inserter(records.tensors));
    std::move(part.objects.begin(), part.objects.end(), std::back_inserter(records.objects));
  }
  std::sort(records.tensors.begin(), records.tensors.end(),
            [](const PlannedTensor& a, const PlannedTensor& b) { return a.key < b.key; });
  for (size_t i = 1; i < records.tensors.size(); ++i) {
    if (records.tensors[i].key == records.tensors[i - 1].key) {
      throw ProtocolError(fmt::format("two planners planned '{}'", records.tensors[i].key));
    }
  }
  std::vector<std::pair<std::string, PlannedObject>> objects;
  objects.reserve(records.objects.size());
  for (PlannedObject& o : records.objects) objects.emplace_back(unique_key_of(o), std::move(o));
  std::sort(objects.begin(), objects.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  records.objects.clear();
  for (size_t i = 0; i < objects.size(); ++i) {
    if (i > 0 && objects[i].first == objects[i - 1].first) {
      throw ProtocolError(fmt::format("two planners planned object '{}'", objects[i].first));
    }
    records.objects.push_back(std::move(objects[i].second));
  }
  return assemble_global_plan(records, world);
}

}  // namespace distckpt::plan
