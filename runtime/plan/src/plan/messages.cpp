#include "plan/messages.h"

#include <fmt/format.h>

#include <cstring>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "io/checksum.h"
#include "plan/wire.h"

namespace distckpt::plan {

std::string encode_plan_announcement(const PlanAnnouncement& a) {
  flatbuffers::FlatBufferBuilder b(64);
  b.Finish(fb::CreatePlanAnnouncement(b, a.structure_hash, a.cached_plan, a.common_hash, a.coordinator, a.save_id));
  return plan::message_bytes(b);
}

PlanAnnouncement decode_plan_announcement(std::string_view bytes, const std::string& origin) {
  const auto& m = plan::verified_message<fb::PlanAnnouncement>(bytes, "plan announcement", origin);
  return PlanAnnouncement{m.structure_hash(), m.cached_plan(), m.common_hash(), m.coordinator(), m.save_id()};
}

std::string encode_save_progress(uint64_t done) {
  flatbuffers::FlatBufferBuilder b(32);
  b.Finish(fb::CreateSaveProgress(b, done));
  return plan::message_bytes(b);
}

uint64_t decode_save_progress(std::string_view bytes, const std::string& origin) {
  return plan::verified_message<fb::SaveProgress>(bytes, "save progress report", origin).done();
}

std::string encode_key_digests(const KeyDigests& digests) {
  flatbuffers::FlatBufferBuilder b(
      64 + 8 * (digests.requested.size() + digests.stored.size() + digests.requested_places.size()));
  b.Finish(fb::CreateKeyDigests(b, b.CreateVector(digests.requested), b.CreateVector(digests.stored),
                                b.CreateVector(digests.requested_places)));
  return plan::message_bytes(b);
}

KeyDigests decode_key_digests(std::string_view bytes, const std::string& origin) {
  constexpr const char* kWhat = "key digests";
  const auto& m = plan::verified_message<fb::KeyDigests>(bytes, kWhat, origin);
  return KeyDigests{plan::scalars(m.requested(), kWhat, origin), plan::scalars(m.stored(), kWhat, origin),
                    plan::scalars(m.requested_places(), kWhat, origin)};
}

std::string encode_unrequested_keys(const UnrequestedKeys& keys) {
  flatbuffers::FlatBufferBuilder b(64 + 8 * keys.digests.size());
  std::vector<flatbuffers::Offset<flatbuffers::String>> names;
  names.reserve(keys.names.size());
  for (const std::string& k : keys.names) names.push_back(b.CreateString(k));
  b.Finish(fb::CreateUnrequestedKeys(b, b.CreateVector(keys.digests), b.CreateVector(names)));
  return plan::message_bytes(b);
}

UnrequestedKeys decode_unrequested_keys(std::string_view bytes, const std::string& origin) {
  constexpr const char* kWhat = "unrequested keys";
  const auto& m = plan::verified_message<fb::UnrequestedKeys>(bytes, kWhat, origin);
  return UnrequestedKeys{plan::scalars(m.digests(), kWhat, origin), plan::strings(m.names())};
}

std::string encode_host_name(const std::string& name) {
  flatbuffers::FlatBufferBuilder b(64 + name.size());
  b.Finish(fb::CreateHostName(b, b.CreateString(name)));
  return plan::message_bytes(b);
}

std::string decode_host_name(std::string_view bytes, const std::string& origin) {
  return plan::string_or_empty(plan::verified_message<fb::HostName>(bytes, "host name", origin).name());
}

std::string encode_common_leaf_hashes(const CommonLeafHashes& h) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<flatbuffers::Offset<flatbuffers::String>> paths;
  paths.reserve(h.paths.size());
  for (const std::string& p : h.paths) paths.push_back(b.CreateString(p));
  b.Finish(fb::CreateCommonLeafHashes(b, b.CreateVector(paths), b.CreateVector(h.hashes)));
  return plan::message_bytes(b);
}

CommonLeafHashes decode_common_leaf_hashes(std::string_view bytes, const std::string& origin) {
  const auto& m = plan::verified_message<fb::CommonLeafHashes>(bytes, "common leaf hashes", origin);
  CommonLeafHashes out;
  out.paths = plan::strings(m.paths());
  if (m.hashes()) out.hashes.assign(m.hashes()->begin(), m.hashes()->end());
  if (out.hashes.size() != out.paths.size()) {
    plan::malformed("common leaf hashes", origin,
                    fmt::format("{} paths but {} hashes", out.paths.size(), out.hashes.size()));
  }
  return out;
}

namespace {

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Takes a T off the front of `bytes`, or says what is missing.
template <typename T>
T take(std::string_view& bytes, const std::string& origin, const char* what) {
  T value{};
  if (bytes.size() < sizeof value) {
    throw ProtocolError(
        fmt::format("{} sent a read plan that ends inside its {} ({} bytes left)", origin, what, bytes.size()));
  }
  std::memcpy(&value, bytes.data(), sizeof value);
  bytes.remove_prefix(sizeof value);
  return value;
}

// `length` bytes off the front of `bytes`.
std::string_view take_bytes(std::string_view& bytes, uint64_t length, const std::string& origin, const char* what) {
  if (length > bytes.size()) {
    throw ProtocolError(fmt::format("{} sent a read plan whose {} claims {} of its {} remaining bytes", origin, what,
                                    length, bytes.size()));
  }
  const std::string_view taken = bytes.substr(0, static_cast<size_t>(length));
  bytes.remove_prefix(static_cast<size_t>(length));
  return taken;
}

}  // namespace

// u32 host length, host (encode_host_name), u32 rounds, then per round a u64 length and its needs.
std::string encode_read_plan(const std::string& host, const std::vector<std::string>& round_needs,
                             uint64_t batch_bytes) {
  const std::string host_bytes = host.empty() ? std::string() : encode_host_name(host);
  std::string out;
  put(out, static_cast<uint32_t>(host_bytes.size()));
  out += host_bytes;
  put(out, batch_bytes);
  put(out, static_cast<uint32_t>(round_needs.size()));
  for (const std::string& needs : round_needs) {
    put(out, static_cast<uint64_t>(needs.size()));
    out += needs;
  }
  return out;
}

ReadPlanMessage decode_read_plan(std::string_view bytes, const std::string& origin) {
  ReadPlanMessage m;
  const auto host_length = take<uint32_t>(bytes, origin, "header");
  const std::string_view host = take_bytes(bytes, host_length, origin, "host name");
  if (!host.empty()) m.host = decode_host_name(std::string(host), origin);
  m.batch_bytes = take<uint64_t>(bytes, origin, "batch size");
  const auto rounds = take<uint32_t>(bytes, origin, "round count");
  // Each round takes at least its length: a count the bytes cannot hold is refused before reserving.
  if (rounds > bytes.size() / sizeof(uint64_t)) {
    throw ProtocolError(fmt::format("{} sent a read plan of {} rounds in {} bytes", origin, rounds, bytes.size()));
  }
  m.rounds.reserve(rounds);
  for (uint32_t k = 0; k < rounds; ++k) {
    const auto length = take<uint64_t>(bytes, origin, "round length");
    m.rounds.push_back(take_bytes(bytes, length, origin, "round"));
  }
  if (!bytes.empty()) {
    throw ProtocolError(fmt::format("{} sent a read plan with {} bytes after its last round", origin, bytes.size()));
  }
  return m;
}

uint64_t CommonLeafHashes::digest() const {
  io::StreamingHash h;
  for (size_t i = 0; i < paths.size(); ++i) {
    h.update(paths[i].data(), paths[i].size() + 1);  // with the terminator: "a" + "bc" != "ab" + "c"
    h.update(&hashes[i], sizeof hashes[i]);
  }
  return h.digest();
}

}  // namespace distckpt::plan
