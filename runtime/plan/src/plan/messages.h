// The api layer's small messages between ranks (schema/wire.fbs). Decoders
// raise ProtocolError naming the rank (`origin`) on malformed bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace distckpt::plan {

struct PlanAnnouncement {
  uint64_t structure_hash = 0;
  uint64_t cached_plan = 0;  // digest of the cached plan; 0: none
  uint64_t common_hash = 0;  // CommonLeafHashes::digest of the rank's common state
  int32_t coordinator = 0;   // SaveOptions::coordinator_rank as this rank has it
  uint64_t save_id = 0;      // the coordinator's: names this save's objects on an object store
};
std::string encode_plan_announcement(const PlanAnnouncement& a);
PlanAnnouncement decode_plan_announcement(std::string_view bytes, const std::string& origin);

std::string encode_save_progress(uint64_t done);
uint64_t decode_save_progress(std::string_view bytes, const std::string& origin);

// One hash per leaf of a common state, in path order ("a/b/0").
struct CommonLeafHashes {
  std::vector<std::string> paths;
  std::vector<uint64_t> hashes;
  uint64_t digest() const;  // of the whole list
};
std::string encode_common_leaf_hashes(const CommonLeafHashes& h);
CommonLeafHashes decode_common_leaf_hashes(std::string_view bytes, const std::string& origin);

// Strict key handling (*_ALL modes): what a rank sends a key's owner.
struct KeyDigests {
  std::vector<uint64_t> requested;  // keys the rank requests
  std::vector<uint64_t> stored;     // keys it stores, asked about (ranks storing different keys)
  // Requested tensors of a checkpoint every rank reads, by their place in it
  // (owned by place, so that an owner lists its stored keys without decoding
  // the others').
  std::vector<uint64_t> requested_places;
};
std::string encode_key_digests(const KeyDigests& digests);
KeyDigests decode_key_digests(std::string_view bytes, const std::string& origin);

// An owner's answer: stored keys no rank requested.
struct UnrequestedKeys {
  std::vector<uint64_t> digests;   // to a rank that asked about them
  std::vector<std::string> names;  // to every rank, when all read one checkpoint
};
std::string encode_unrequested_keys(const UnrequestedKeys& keys);
UnrequestedKeys decode_unrequested_keys(std::string_view bytes, const std::string& origin);

std::string encode_host_name(const std::string& name);
std::string decode_host_name(std::string_view bytes, const std::string& origin);

// What a rank tells the others when a load plans its reads: its host name
// (empty: not asked) and its needs (plan::encode_needs) round by round (a
// load whose device-bound reads exceed one staging window runs in rounds,
// load/device_staging.h), in one message so that one collective carries all.
struct ReadPlanMessage {
  std::string host;
  std::vector<std::string_view> rounds;  // views of the decoded bytes: each round's encoded needs
  uint64_t batch_bytes = 0;              // the rounds exchange's batch (0: not sent)
};
std::string encode_read_plan(const std::string& host, const std::vector<std::string>& round_needs,
                             uint64_t batch_bytes = 0);
ReadPlanMessage decode_read_plan(std::string_view bytes, const std::string& origin);

}  // namespace distckpt::plan
