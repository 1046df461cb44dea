// Fuzzes the decoders of the messages ranks send each other (schema/wire.fbs).
// The first input byte picks the decoder, the rest is the message. Every
// decoder must either throw ProtocolError or return values that encode and
// decode back to the same bytes. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
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

namespace local = distckpt::local;
namespace plan = distckpt::plan;
namespace transferring = distckpt::transferring;

// decode(bytes) is accepted, and its value survives encode -> decode unchanged.
template <typename Decode, typename Encode>
void round_trip(std::string_view bytes, Decode decode, Encode encode) {
  const std::string encoded = encode(decode(bytes));
  if (encode(decode(encoded)) != encoded) std::abort();
}

// A scheduler's share message (plan/load_share.h), merged as rank 1 of 8
// whose needs are fixed_share_needs() in every staging round.
const std::vector<plan::PieceNeed>& fixed_share_needs() {
  static const std::vector<plan::PieceNeed> needs = {
      {0, 0, {{0, 0}, {4, 8}}}, {0, 1, {{4, 2}, {2, 4}}}, {1, 0, {{0}, {16}}}};
  return needs;
}

plan::PieceGeometry fixed_share_piece(uint32_t tensor, uint32_t piece) {
  if (tensor == 0 && piece < 2) return {{{4 * static_cast<int64_t>(piece), 0}, {4, 8}}, 4, {}};
  if (tensor == 1 && piece == 0) return {{{0}, {16}}, 2, {}};
  throw distckpt::ProtocolError("no such piece");
}

std::string merged_and_encoded(std::string_view m, const std::string& from) {
  const plan::ShareHeader header = plan::decode_share_header(m, from);
  if (header.rounds > 8) throw distckpt::ProtocolError("more rounds than this target sizes");
  const std::vector<std::vector<plan::PieceNeed>> needs(header.rounds, fixed_share_needs());
  std::vector<plan::LoadShare> shares(header.rounds);
  for (plan::LoadShare& s : shares) s.slot.assign(fixed_share_needs().size(), -1);
  plan::merge_share_message(m, from, 1, 8, fixed_share_piece, needs, shares);
  std::vector<const plan::LoadShare*> parts;
  for (const plan::LoadShare& s : shares) parts.push_back(s.pieces.empty() ? nullptr : &s);
  return plan::encode_share_message(header.rounds, parts, header.host_rounds);
}

void share_round_trip(std::string_view m, const std::string& from) {
  const std::string encoded = merged_and_encoded(m, from);
  if (merged_and_encoded(encoded, from) != encoded) std::abort();
}

void run(uint8_t which, std::string_view m) {
  const std::string from = "rank 1";
  switch (which % 25) {
    case 0:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_plan_announcement(b, from); },
          [](const plan::PlanAnnouncement& a) { return plan::encode_plan_announcement(a); });
    case 1:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_plan_decision(b, from); },
          [](const plan::PlanDecision& d) { return plan::encode_plan_decision(d); });
    case 2:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_save_progress(b, from); },
          [](uint64_t done) { return plan::encode_save_progress(done); });
    case 3:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_key_digests(b, from); },
          [](const plan::KeyDigests& d) { return plan::encode_key_digests(d); });
    case 4:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_host_name(b, from); },
          [](const std::string& name) { return plan::encode_host_name(name); });
    case 5:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_local_plan(b, from); },
          [](const plan::LocalPlan& p) { return plan::encode_local_plan(p); });
    case 6:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_write_results(b, from); },
          [](const plan::WriteResults& r) { return plan::encode_write_results(r); });
    case 7:
      // The rank is not part of the decoded needs: encode them under one.
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_needs(b, from); },
          [](const std::vector<plan::PieceNeed>& n) { return plan::encode_needs(0, n); });
    case 8:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_structure_announcement(b, from); },
          [](const local::StructureAnnouncement& a) { return local::encode_structure_announcement(a); });
    case 9:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_inventory(b, from); },
          [](const std::vector<local::HeldCopy>& c) { return local::encode_inventory(c); });
    case 10:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_copy_status(b, from); },
          [](const local::CopyStatus& s) { return local::encode_copy_status(s); });
    case 11:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_recovery_status(b, from); },
          [](const std::string& problem) { return local::encode_recovery_status(problem); });
    case 12:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_shard_needs(b, from); },
          [](const std::vector<local::ShardNeedMessage>& n) { return local::encode_shard_needs(n); });
    case 13:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_shard_offers(b, from); },
          [](const std::vector<std::string>& ids) { return local::encode_shard_offers(ids); });
    case 14:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_shared_shards(b, from); },
          [](const std::vector<plan::SharedShard>& s) { return plan::encode_shared_shards(s); });
    case 15:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_writer_choices(b, from); },
          [](const plan::WriterChoices& c) { return plan::encode_writer_choices(c); });
    case 16: {
      std::vector<uint32_t> items;
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_plan_part(b, from, items); },
          [&](const plan::LocalPlan& p) { return plan::encode_plan_part(p, items); });
    }
    case 17: {
      const plan::ReadPlanMessage read_plan = plan::decode_read_plan(m, from);
      const auto rounds = [](const plan::ReadPlanMessage& p) {
        return std::vector<std::string>(p.rounds.begin(), p.rounds.end());
      };
      for (std::string_view needs : read_plan.rounds) plan::decode_needs(std::string(needs), from);
      const std::string encoded = plan::encode_read_plan(read_plan.host, rounds(read_plan));
      const plan::ReadPlanMessage again = plan::decode_read_plan(encoded, from);
      if (plan::encode_read_plan(again.host, rounds(again)) != encoded) std::abort();
      return;
    }
    case 18:
      return round_trip(
          m, [&](std::string_view b) { return plan::decode_unrequested_keys(b, from); },
          [](const plan::UnrequestedKeys& k) { return plan::encode_unrequested_keys(k); });
    case 19:
      return share_round_trip(m, from);
    case 20:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_shard_routing(b, from); },
          [](const local::ShardRouting& r) { return local::encode_shard_routing(r); });
    case 21:
      return round_trip(
          m, [&](std::string_view b) { return local::decode_shard_transfers(b, from); },
          [](const local::ShardTransferList& t) { return local::encode_shard_transfers(t); });
    case 22:
      return round_trip(
          m, [&](std::string_view b) { return transferring::decode_digest_parts(b, from); },
          [](const std::vector<transferring::DigestPart>& p) { return transferring::encode_digest_parts(p); });
    case 23:
      return round_trip(
          m, [&](std::string_view b) { return transferring::decode_source(b, from); },
          [](const std::pair<std::string, transferring::Reach>& s) {
            return transferring::encode_source(s.first, s.second);
          });
    default:
      // Every decoder on the same bytes: a message of one kind sent where
      // another is expected must be rejected or read, never crash.
      for (uint8_t i = 0; i < 24; ++i) {
        try {
          run(i, m);
        } catch (const distckpt::ProtocolError&) {
        }
      }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // Messages arrive as std::string (comm/communicator.h), so their bytes are
  // aligned as the FlatBuffers readers expect; data + 1 would not be.
  const std::string message(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    run(data[0], message);
  } catch (const distckpt::ProtocolError&) {
  }
  return 0;
}
