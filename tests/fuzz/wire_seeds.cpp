// Writes one seed message per decoder of fuzz_wire.cpp into the folder named
// on the command line: the first byte picks the decoder, as the target reads
// it. Real encoder output, so the fuzzer starts from valid messages.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "local/messages.h"
#include "plan/global_plan.h"
#include "plan/load_schedule.h"
#include "plan/load_share.h"
#include "plan/local_plan.h"
#include "plan/messages.h"
#include "plan/partitioned_plan.h"
#include "transfer/digest_check.h"
#include "transfer/peer_memory.h"

namespace {

void write_seed(const std::string& dir, uint8_t which, const std::string& name, const std::string& message) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(which));
  out.write(message.data(), static_cast<std::streamsize>(message.size()));
}

// Rank 1's share of three ranks' load, over the pieces fuzz_wire's share case knows.
std::string load_share_seed() {
  namespace plan = distckpt::plan;
  const plan::PieceLookup lookup = [](uint32_t tensor, uint32_t piece) {
    return tensor == 0 ? plan::PieceGeometry{{{4 * static_cast<int64_t>(piece), 0}, {4, 8}}, 4, {}}
                       : plan::PieceGeometry{{{0}, {16}}, 2, {}};
  };
  const std::vector<std::vector<plan::PieceNeed>> needs = {
      {{0, 0, {{0, 0}, {4, 8}}}, {1, 0, {{0}, {16}}}},
      {{0, 0, {{0, 0}, {4, 8}}}, {0, 1, {{4, 2}, {2, 4}}}, {1, 0, {{0}, {16}}}},
      {{0, 1, {{4, 0}, {4, 8}}}}};
  const plan::LoadSchedule schedule = plan::make_load_schedule(needs, lookup, 32, true);
  std::vector<plan::TransferKey> keys;
  for (uint32_t k = 0; k < plan::slab_transfers(schedule, needs).size(); ++k) keys.push_back({k / 2, k});
  const std::vector<plan::LoadShare> shares = plan::shares_of(schedule, needs, {0, 1, 2}, keys);
  return plan::encode_share_message(1, {&shares[1]}, {0});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  namespace local = distckpt::local;
  namespace plan = distckpt::plan;
  namespace transferring = distckpt::transferring;

  write_seed(dir, 0, "plan_announcement", plan::encode_plan_announcement({0x1234abcd, 0x99}));
  write_seed(dir, 2, "save_progress", plan::encode_save_progress(1 << 20));
  write_seed(dir, 3, "key_digests", plan::encode_key_digests({{0x1234, 0xfeedface}, {0x42}}));
  write_seed(dir, 4, "host_name", plan::encode_host_name("node-17"));

  plan::LocalPlan p;
  p.rank = 1;
  plan::ShardPlan t;
  t.key = "decoder.fc1.weight";
  t.dtype = at::kBFloat16;
  t.global_shape = {4, 8};
  t.box = {{2, 0}, {2, 8}};
  t.flat = distckpt::FlatRange{3, 11};
  t.replica_id = {0, 1};
  p.tensors.push_back(t);
  t.key = "embedding.weight";
  t.dtype = at::kFloat;
  t.flat.reset();
  p.tensors.push_back(t);
  plan::ObjectPlan o;
  o.key = "rng_state";
  o.global_shape = {2};
  o.global_offset = {1};
  o.replica_id = {0};
  o.byte_size = 64;
  p.objects.push_back(o);
  write_seed(dir, 5, "local_plan", plan::encode_local_plan(p));

  plan::WriteResults r;
  r.rank = 1;
  r.file_size = 4096;
  r.items = {{0, 64, {0x1111}}, {64, 128, {0x2222, 0x3333}}};
  write_seed(dir, 6, "write_results", plan::encode_write_results(r));
  write_seed(dir, 7, "needs", plan::encode_needs(1, {{0, 2, {{0, 4}, {2, 4}}}, {3, 0, {{1}, {1}}}}));

  write_seed(dir, 8, "structure_announcement", local::encode_structure_announcement({0xfeed, 0}));
  write_seed(dir, 9, "inventory", local::encode_inventory({{100, 0}, {100, 3}, {200, 1}}));
  write_seed(dir, 10, "copy_status", local::encode_copy_status({false, "checksum mismatch", {2, 3}}));
  write_seed(dir, 11, "recovery_status", local::encode_recovery_status("no replica of rank 2"));
  write_seed(dir, 12, "shard_needs", local::encode_shard_needs({{"emb/0.0", 256}, {"fc1/2.0", 1024}}));
  write_seed(dir, 13, "shard_offers", local::encode_shard_offers({"emb/0.0", "fc1/2.0"}));

  plan::PlanDecision d;
  d.items = {0, 3, 5};
  d.records.tensors.push_back({"decoder.fc1.weight", at::kBFloat16, {4, 8}, {{{{0, 0}, {2, 8}}, std::nullopt, 3}}});
  d.records.objects.push_back({"rng_state", {2}, {1}, 1});
  write_seed(dir, 1, "plan_decision", plan::encode_plan_decision(d));
  plan::SharedShard s;
  s.name = "decoder.fc1.weight";
  s.box = {{2, 0}, {2, 8}};
  s.bytes = 32;
  s.holders = {1, 5, 9};
  s.id = 7;
  write_seed(dir, 14, "shared_shards", plan::encode_shared_shards({s}));
  write_seed(dir, 15, "writer_choices", plan::encode_writer_choices({{7, 2}, {5, 1}}));
  write_seed(dir, 16, "plan_part", plan::encode_plan_part(p, {2, 4, 9}));
  write_seed(dir, 17, "read_plan",
             plan::encode_read_plan("node-3", {plan::encode_needs(2, {{0, 1, {{0, 4}, {2, 4}}}}),
                                               plan::encode_needs(2, {{1, 0, {{0}, {16}}}})}));
  write_seed(dir, 18, "unrequested_keys", plan::encode_unrequested_keys({{0xfeedface}, {"decoder.fc1.weight"}}));
  write_seed(dir, 19, "load_share", load_share_seed());
  write_seed(dir, 20, "shard_routing",
             local::encode_shard_routing({{{"emb/0.0", 256}, {"fc1/2.0", 1024}}, {3, 7}, {"fc2/1.0"}}));
  local::ShardTransferList transfers;
  transfers.receives.push_back({3, 2, 256, uint64_t{5} << 32 | 1, 9});
  transfers.sends.push_back({0, 4, 1024, uint64_t{5} << 32 | 2, 11});
  write_seed(dir, 21, "shard_transfers", local::encode_shard_transfers(transfers));
  write_seed(dir, 22, "transfer_digests",
             transferring::encode_digest_parts({{"decoder.fc1.weight", true, 0x1234abcd, {24, 276, 4324}, false},
                                                {"emb", false, 0, {8, 28, 140}, true}}));
  write_seed(dir, 23, "transfer_source",
             transferring::encode_source(plan::encode_local_plan(plan::LocalPlan{}),
                                         {"node-3", 4242, 0x7ffc0010, 0x9e3779b97f4a7c15, {0x7f0000001000, 0}}));
  return 0;
}
