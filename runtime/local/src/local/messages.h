// The local layer's messages between ranks (schema/wire.fbs). Decoders raise
// ProtocolError naming the rank (`origin`) on malformed bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace distckpt::local {

struct StructureAnnouncement {
  uint64_t structure_hash = 0;
  uint64_t cached_distribution = 0;  // 0: none cached
};
std::string encode_structure_announcement(const StructureAnnouncement& a);
StructureAnnouncement decode_structure_announcement(std::string_view bytes, const std::string& origin);

struct HeldCopy {
  int64_t iteration = 0;
  int owner = 0;
};
std::string encode_inventory(const std::vector<HeldCopy>& copies);
std::vector<HeldCopy> decode_inventory(std::string_view bytes, const std::string& origin);

struct CopyStatus {
  bool ok = false;
  std::string problem;           // why the own copy did not read
  std::vector<int> held_owners;  // other owners' copies of the iteration held
};
std::string encode_copy_status(const CopyStatus& s);
CopyStatus decode_copy_status(std::string_view bytes, const std::string& origin);

std::string encode_recovery_status(const std::string& problem);
std::string decode_recovery_status(std::string_view bytes, const std::string& origin);

struct ShardNeedMessage {
  std::string identity;
  uint64_t bytes = 0;
};
// `batch_bytes`: the rounds exchange's batch, which every rank gets (0: none).
std::string encode_shard_needs(const std::vector<ShardNeedMessage>& needs, uint64_t batch_bytes = 0);
std::vector<ShardNeedMessage> decode_shard_needs(std::string_view bytes, const std::string& origin,
                                                 uint64_t* batch_bytes = nullptr);

std::string encode_shard_offers(const std::vector<std::string>& identities);
std::vector<std::string> decode_shard_offers(std::string_view bytes, const std::string& origin);

// Partitioned exchange: what a rank routes to one scheduler.
struct ShardRouting {
  std::vector<ShardNeedMessage> needs;
  std::vector<uint32_t> indices;  // of the needs in the rank's list
  std::vector<std::string> kept;  // identities of shards the rank keeps
};
std::string encode_shard_routing(const ShardRouting& r);
ShardRouting decode_shard_routing(std::string_view bytes, const std::string& origin);

// A scheduler's answer to one rank.
struct ShardTransferList {
  struct Receive {
    uint32_t need = 0;
    int from = 0;
    uint64_t bytes = 0, window = 0;
    uint32_t tag = 0;
  };
  struct Send {
    uint32_t kept = 0;  // among the identities the rank routed to the scheduler
    int to = 0;
    uint64_t bytes = 0, window = 0;
    uint32_t tag = 0;
  };
  std::vector<Receive> receives;
  std::vector<Send> sends;
};
std::string encode_shard_transfers(const ShardTransferList& t);
ShardTransferList decode_shard_transfers(std::string_view bytes, const std::string& origin);

}  // namespace distckpt::local
