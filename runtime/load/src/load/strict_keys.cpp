#include "load/strict_keys.h"

#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>

#include "comm/agreement.h"
#include "core/quoted_list.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "io/checksum.h"
#include "plan/messages.h"

namespace distckpt::loading {
namespace {

// The key a leaf is reported under: objects by key, not by shard.
const std::string& report_key(const Value& leaf) {
  return leaf.kind() == Kind::kShardedTensor ? leaf.as_sharded_tensor().key : leaf.as_sharded_object().key;
}

uint64_t key_digest(const std::string& key) { return io::xxh3(key.data(), key.size()); }

int owner_of(uint64_t digest, int world) { return static_cast<int>(digest % static_cast<uint64_t>(world)); }

int owner_of_place(uint64_t place, int world) { return static_cast<int>(place % static_cast<uint64_t>(world)); }

// Calls `f` on every stored key owned by digest, tensors (unless looked up
// by place) and objects, in order.
template <typename F>
void for_each_stored_key(const StoredKeys& stored, F&& f) {
  for (const auto* keys : {&stored.tensors, &stored.object_keys}) {
    for (const std::string& k : *keys) f(k);
  }
}

// Whether rank `r` owns stored key `k` (a key naming both a looked-up tensor
// and an object has two owners).
bool owns(const StoredKeys& stored, const std::string& k, int r, int world) {
  if (stored.lookup) {
    const std::optional<size_t> place = stored.lookup->find(k);
    if (place && owner_of_place(*place, world) == r) return true;
  }
  const bool by_digest = stored.tensors.count(k) > 0 || stored.object_keys.count(k) > 0;
  return by_digest && owner_of(key_digest(k), world) == r;
}

// What every rank routed here: requested digests and places (`asked`: the
// stored digests, by asking rank, when given).
struct Routed {
  std::set<uint64_t> digests;
  std::set<uint64_t> places;
};
Routed decode_routed(const std::vector<std::string>& routed, int world, std::vector<std::vector<uint64_t>>* asked) {
  if (routed.size() != static_cast<size_t>(world)) {
    throw ProtocolError(fmt::format("{} key routings for {} ranks", routed.size(), world));
  }
  Routed requested;
  if (asked) asked->assign(routed.size(), {});
  for (size_t r = 0; r < routed.size(); ++r) {
    if (routed[r].empty()) continue;
    plan::KeyDigests d = plan::decode_key_digests(routed[r], fmt::format("rank {}", r));
    requested.digests.insert(d.requested.begin(), d.requested.end());
    requested.places.insert(d.requested_places.begin(), d.requested_places.end());
    if (asked) (*asked)[r] = std::move(d.stored);
  }
  return requested;
}

// The owners' answers, in one agreed collective: an all-gather of names when
// every rank reads one checkpoint, an all-to-all of digests when each rank
// stores other keys.
std::set<std::string> unrequested_keys(const StoredKeys& stored, const std::vector<std::string>& routed,
                                       Communicator& comm) {
  std::set<std::string> missing;
  const std::string phase = "find the stored keys no rank requested";
  if (!stored.per_rank) {
    const std::vector<std::string> answers = gather_agreed(comm, phase, [&] {
      const plan::UnrequestedKeys mine = owned_unrequested_keys(stored, routed, comm.rank(), comm.size());
      return mine.names.empty() ? std::string() : plan::encode_unrequested_keys(mine);
    });
    for (size_t r = 0; r < answers.size(); ++r) {
      if (answers[r].empty()) continue;
      for (std::string& k : plan::decode_unrequested_keys(answers[r], fmt::format("rank {}", r)).names) {
        if (!owns(stored, k, static_cast<int>(r), comm.size())) {
          throw ProtocolError(fmt::format("rank {} answered for key '{}', which is not a stored key it owns", r, k));
        }
        missing.insert(std::move(k));
      }
    }
    return missing;
  }
  const std::vector<std::string> answers =
      all_to_all_agreed(comm, phase, [&] { return answer_stored_key_questions(routed, comm.size()); });
  std::map<uint64_t, const std::string*> by_digest;
  for_each_stored_key(stored, [&](const std::string& k) { by_digest.emplace(key_digest(k), &k); });
  for (size_t r = 0; r < answers.size(); ++r) {
    if (answers[r].empty()) continue;
    for (const uint64_t d : plan::decode_unrequested_keys(answers[r], fmt::format("rank {}", r)).digests) {
      const auto it = by_digest.find(d);
      if (it == by_digest.end() || owner_of(d, comm.size()) != static_cast<int>(r)) {
        throw ProtocolError(
            fmt::format("rank {} answered about a key digest {:016x} this rank did not ask it about", r, d));
      }
      missing.insert(*it->second);
    }
  }
  return missing;
}

}  // namespace

StoredKeys stored_keys_of(const CheckpointReader& reader) {
  StoredKeys stored;
  stored.where = fmt::format("the checkpoint '{}'", reader.dir());
  stored.lookup =
      StoredKeys::Lookup{reader.tensor_count(), [&reader](const std::string& k) { return reader.find_tensor(k); },
                         [&reader](size_t i) { return reader.tensor_at(i).key; }};
  for (const ObjectRecord& o : reader.objects()) stored.add_object(o.key, o.unique_key());
  return stored;
}

plan::UnrequestedKeys owned_unrequested_keys(const StoredKeys& stored, const std::vector<std::string>& routed, int me,
                                             int world) {
  const Routed requested = decode_routed(routed, world, nullptr);
  plan::UnrequestedKeys mine;
  if (stored.lookup) {
    for (size_t i = static_cast<size_t>(me); i < stored.lookup->count; i += static_cast<size_t>(world)) {
      if (!requested.places.count(i)) mine.names.push_back(stored.lookup->key_at(i));
    }
  }
  for_each_stored_key(stored, [&](const std::string& k) {
    const uint64_t d = key_digest(k);
    if (owner_of(d, world) == me && !requested.digests.count(d)) mine.names.push_back(k);
  });
  return mine;
}

std::vector<std::string> answer_stored_key_questions(const std::vector<std::string>& routed, int world) {
  std::vector<std::vector<uint64_t>> asked;
  const std::set<uint64_t> requested = decode_routed(routed, world, &asked).digests;
  std::vector<std::string> out(routed.size());
  for (size_t r = 0; r < asked.size(); ++r) {
    plan::UnrequestedKeys answer;
    for (const uint64_t d : asked[r]) {
      if (!requested.count(d)) answer.digests.push_back(d);
    }
    if (!answer.digests.empty()) out[r] = plan::encode_unrequested_keys(answer);
  }
  return out;
}

bool key_check_is_collective(StrictHandling mode) {
  return mode == StrictHandling::kLogAll || mode == StrictHandling::kRaiseAll || mode == StrictHandling::kReturnAll;
}

std::vector<std::string> route_key_digests(const Value& sharded, const StoredKeys& stored, int world) {
  std::map<int, plan::KeyDigests> by_owner;  // at most one entry per key
  std::set<uint64_t> requested, places;
  for (const Value* leaf : nested_values(sharded)) {
    // A key counts as requested whatever kind of leaf names it, as the owners
    // of both a tensor and an object of that key see it.
    const std::string& key = report_key(*leaf);
    const std::optional<size_t> place = stored.lookup ? stored.lookup->find(key) : std::nullopt;
    if (place) places.insert(*place);
    if (!place || stored.object_keys.count(key) > 0) requested.insert(key_digest(key));
  }
  for (const uint64_t d : requested) by_owner[owner_of(d, world)].requested.push_back(d);
  for (const uint64_t p : places) by_owner[owner_of_place(p, world)].requested_places.push_back(p);
  if (stored.per_rank) {
    std::set<uint64_t> kept;
    for_each_stored_key(stored, [&](const std::string& k) { kept.insert(key_digest(k)); });
    for (const uint64_t d : kept) by_owner[owner_of(d, world)].stored.push_back(d);
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (const auto& [owner, digests] : by_owner) out[static_cast<size_t>(owner)] = plan::encode_key_digests(digests);
  return out;
}

std::vector<std::string> agreed_routing_keys(Communicator& comm, const std::string& phase, StrictHandling mode,
                                             const std::function<void()>& step, const Value& sharded,
                                             const StoredKeys& stored) {
  if (!key_check_is_collective(mode)) {
    run_agreed(comm, phase, step);
    return {};
  }
  return all_to_all_agreed(comm, phase, [&] {
    step();
    return route_key_digests(sharded, stored, comm.size());
  });
}

KeyMismatch handle_key_mismatch(Value& sharded, const StoredKeys& stored, Communicator& comm, StrictHandling mode,
                                const std::vector<std::string>& routed) {
  KeyMismatch found;
  if (mode == StrictHandling::kAssumeOkUnexpected) return found;
  auto is_stored = [&](const Value& leaf) {
    return leaf.kind() == Kind::kShardedTensor ? stored.has_tensor(leaf.as_sharded_tensor().key)
                                               : stored.object_shards.count(leaf.as_sharded_object().unique_key()) > 0;
  };
  bool skip = false;
  for (const Value* leaf : nested_values(sharded)) {
    if (!is_stored(*leaf)) {
      found.unexpected.insert(report_key(*leaf));
      skip = true;
    }
  }
  if (key_check_is_collective(mode)) found.missing = unrequested_keys(stored, routed, comm);

  const std::string unexpected_msg = found.unexpected.empty()
                                         ? ""
                                         : fmt::format("unexpected keys (requested on rank {} but not in {}): {}",
                                                       comm.rank(), stored.where, quoted_list(found.unexpected));
  const std::string missing_msg =
      found.missing.empty()
          ? ""
          : fmt::format("missing keys (in {} but requested by no rank): {}", stored.where, quoted_list(found.missing));
  switch (mode) {
    case StrictHandling::kRaiseAll:
      if (!found.missing.empty() || !found.unexpected.empty()) {
        throw KeyMismatchError(unexpected_msg + (unexpected_msg.empty() || missing_msg.empty() ? "" : "; ") +
                               missing_msg);
      }
      break;
    case StrictHandling::kRaiseUnexpected:
      if (!found.unexpected.empty()) throw KeyMismatchError(unexpected_msg);
      break;
    case StrictHandling::kLogAll:
      if (!missing_msg.empty()) log_message(LogLevel::kWarning, missing_msg);
      [[fallthrough]];
    case StrictHandling::kLogUnexpected:
      if (!unexpected_msg.empty()) log_message(LogLevel::kWarning, unexpected_msg);
      break;
    default:
      break;
  }
  if (skip) sharded = extract_matching(sharded, is_stored).first;
  return found;
}

}  // namespace distckpt::loading
