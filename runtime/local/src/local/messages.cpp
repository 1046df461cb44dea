#include "local/messages.h"

#include "distckpt/fb/wire_generated.h"
#include "plan/wire.h"

namespace distckpt::local {

using plan::string_or_empty;
using plan::strings;

std::string encode_structure_announcement(const StructureAnnouncement& a) {
  flatbuffers::FlatBufferBuilder b(64);
  b.Finish(fb::CreateStructureAnnouncement(b, a.structure_hash, a.cached_distribution));
  return plan::message_bytes(b);
}

StructureAnnouncement decode_structure_announcement(std::string_view bytes, const std::string& origin) {
  const auto& m = plan::verified_message<fb::StructureAnnouncement>(bytes, "structure announcement", origin);
  return StructureAnnouncement{m.structure_hash(), m.cached_distribution()};
}

std::string encode_inventory(const std::vector<HeldCopy>& copies) {
  flatbuffers::FlatBufferBuilder b(64 + 16 * copies.size());
  std::vector<flatbuffers::Offset<fb::HeldCopy>> out;
  out.reserve(copies.size());
  for (const HeldCopy& c : copies) out.push_back(fb::CreateHeldCopy(b, c.iteration, c.owner));
  b.Finish(fb::CreateLocalInventory(b, b.CreateVector(out)));
  return plan::message_bytes(b);
}

std::vector<HeldCopy> decode_inventory(std::string_view bytes, const std::string& origin) {
  const auto& m = plan::verified_message<fb::LocalInventory>(bytes, "local checkpoint list", origin);
  std::vector<HeldCopy> out;
  if (!m.copies()) return out;
  out.reserve(m.copies()->size());
  for (const fb::HeldCopy* c : *m.copies()) out.push_back(HeldCopy{c->iteration(), c->owner()});
  return out;
}

std::string encode_copy_status(const CopyStatus& s) {
  flatbuffers::FlatBufferBuilder b(64 + s.problem.size() + 4 * s.held_owners.size());
  b.Finish(fb::CreateLocalCopyStatus(b, s.ok, b.CreateString(s.problem), b.CreateVector(s.held_owners)));
  return plan::message_bytes(b);
}

CopyStatus decode_copy_status(std::string_view bytes, const std::string& origin) {
  const auto& m = plan::verified_message<fb::LocalCopyStatus>(bytes, "local checkpoint status", origin);
  CopyStatus s{m.ok(), string_or_empty(m.problem()), {}};
  if (m.held_owners()) s.held_owners.assign(m.held_owners()->begin(), m.held_owners()->end());
  return s;
}

std::string encode_recovery_status(const std::string& problem) {
  flatbuffers::FlatBufferBuilder b(64 + problem.size());
  b.Finish(fb::CreateRecoveryStatus(b, b.CreateString(problem)));
  return plan::message_bytes(b);
}

std::string decode_recovery_status(std::string_view bytes, const std::string& origin) {
  return string_or_empty(plan::verified_message<fb::RecoveryStatus>(bytes, "recovery status", origin).problem());
}

std::string encode_shard_needs(const std::vector<ShardNeedMessage>& needs, uint64_t batch_bytes) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<flatbuffers::Offset<fb::ShardNeed>> out;
  out.reserve(needs.size());
  for (const ShardNeedMessage& n : needs) out.push_back(fb::CreateShardNeed(b, b.CreateString(n.identity), n.bytes));
  b.Finish(fb::CreateShardNeeds(b, b.CreateVector(out), 0, 0, batch_bytes));
  return plan::message_bytes(b);
}

std::vector<ShardNeedMessage> decode_shard_needs(std::string_view bytes, const std::string& origin,
                                                 uint64_t* batch_bytes) {
  const auto& m = plan::verified_message<fb::ShardNeeds>(bytes, "shard needs", origin);
  if (batch_bytes) *batch_bytes = m.batch_bytes();
  std::vector<ShardNeedMessage> out;
  if (!m.needs()) return out;
  out.reserve(m.needs()->size());
  for (const fb::ShardNeed* n : *m.needs()) out.push_back(ShardNeedMessage{n->identity()->str(), n->bytes()});
  return out;
}

std::string encode_shard_offers(const std::vector<std::string>& identities) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<flatbuffers::Offset<flatbuffers::String>> out;
  out.reserve(identities.size());
  for (const std::string& id : identities) out.push_back(b.CreateString(id));
  b.Finish(fb::CreateShardOffers(b, b.CreateVector(out)));
  return plan::message_bytes(b);
}

std::vector<std::string> decode_shard_offers(std::string_view bytes, const std::string& origin) {
  return strings(plan::verified_message<fb::ShardOffers>(bytes, "shard offers", origin).identities());
}

std::string encode_shard_routing(const ShardRouting& r) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<flatbuffers::Offset<fb::ShardNeed>> needs;
  for (const ShardNeedMessage& n : r.needs)
    needs.push_back(fb::CreateShardNeed(b, b.CreateString(n.identity), n.bytes));
  std::vector<flatbuffers::Offset<flatbuffers::String>> kept;
  for (const std::string& id : r.kept) kept.push_back(b.CreateString(id));
  b.Finish(fb::CreateShardNeeds(b, b.CreateVector(needs), b.CreateVector(r.indices), b.CreateVector(kept)));
  return plan::message_bytes(b);
}

ShardRouting decode_shard_routing(std::string_view bytes, const std::string& origin) {
  constexpr const char* kWhat = "shard routing";
  const auto& m = plan::verified_message<fb::ShardNeeds>(bytes, kWhat, origin);
  ShardRouting r;
  if (m.needs()) {
    for (const fb::ShardNeed* n : *m.needs()) r.needs.push_back(ShardNeedMessage{n->identity()->str(), n->bytes()});
  }
  r.indices = plan::scalars(m.indices(), kWhat, origin);
  r.kept = strings(m.kept());
  if (r.indices.size() != r.needs.size()) {
    plan::malformed(kWhat, origin, fmt::format("{} indices for {} needs", r.indices.size(), r.needs.size()));
  }
  return r;
}

std::string encode_shard_transfers(const ShardTransferList& t) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<uint32_t> rn, rt, sk, st;
  std::vector<int> rf, sto;
  std::vector<uint64_t> rb, rw, sb, sw;
  for (const ShardTransferList::Receive& x : t.receives) {
    rn.push_back(x.need);
    rf.push_back(x.from);
    rb.push_back(x.bytes);
    rw.push_back(x.window);
    rt.push_back(x.tag);
  }
  for (const ShardTransferList::Send& x : t.sends) {
    sk.push_back(x.kept);
    sto.push_back(x.to);
    sb.push_back(x.bytes);
    sw.push_back(x.window);
    st.push_back(x.tag);
  }
  b.Finish(fb::CreateShardTransfers(b, b.CreateVector(rn), b.CreateVector(rf), b.CreateVector(rb), b.CreateVector(rw),
                                    b.CreateVector(rt), b.CreateVector(sk), b.CreateVector(sto), b.CreateVector(sb),
                                    b.CreateVector(sw), b.CreateVector(st)));
  return plan::message_bytes(b);
}

ShardTransferList decode_shard_transfers(std::string_view bytes, const std::string& origin) {
  constexpr const char* kWhat = "shard transfers";
  const auto& m = plan::verified_message<fb::ShardTransfers>(bytes, kWhat, origin);
  const auto rn = plan::scalars(m.receive_needs(), kWhat, origin);
  const auto rf = plan::scalars(m.receive_from(), kWhat, origin);
  const auto rb = plan::scalars(m.receive_bytes(), kWhat, origin);
  const auto rw = plan::scalars(m.receive_windows(), kWhat, origin);
  const auto rt = plan::scalars(m.receive_tags(), kWhat, origin);
  const auto sk = plan::scalars(m.send_kept(), kWhat, origin);
  const auto sto = plan::scalars(m.send_to(), kWhat, origin);
  const auto sb = plan::scalars(m.send_bytes(), kWhat, origin);
  const auto sw = plan::scalars(m.send_windows(), kWhat, origin);
  const auto st = plan::scalars(m.send_tags(), kWhat, origin);
  if (rf.size() != rn.size() || rb.size() != rn.size() || rw.size() != rn.size() || rt.size() != rn.size() ||
      sto.size() != sk.size() || sb.size() != sk.size() || sw.size() != sk.size() || st.size() != sk.size()) {
    plan::malformed(kWhat, origin, "fields of different lengths");
  }
  ShardTransferList t;
  for (size_t i = 0; i < rn.size(); ++i) t.receives.push_back({rn[i], rf[i], rb[i], rw[i], rt[i]});
  for (size_t i = 0; i < sk.size(); ++i) t.sends.push_back({sk[i], sto[i], sb[i], sw[i], st[i]});
  return t;
}

}  // namespace distckpt::local
