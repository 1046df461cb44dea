#include "api/messages.h"

#include <fmt/format.h>

#include <cstring>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "plan/wire.h"

namespace distckpt::api {

std::string encode_plan_announcement(const PlanAnnouncement& a) {
  flatbuffers::FlatBufferBuilder b(64);
  b.Finish(fb::CreatePlanAnnouncement(b, a.structure_hash, a.cached_plan, a.common_hash, a.coordinator));
  return plan::message_bytes(b);
}

PlanAnnouncement decode_plan_announcement(std::string_view bytes, const std::string& origin) {
  const auto& m = plan::verified_message<fb::PlanAnnouncement>(bytes, "plan announcement", origin);
  return PlanAnnouncement{m.structure_hash(), m.cached_plan(), m.common_hash(), m.coordinator()};
}

std::string encode_save_progress(uint64_t done) {
  flatbuffers::FlatBufferBuilder b(32);
  b.Finish(fb::CreateSaveProgress(b, done));
  return plan::message_bytes(b);
}

uint64_t decode_save_progress(std::string_view bytes, const std::string& origin) {
  return plan::verified_message<fb::SaveProgress>(bytes, "save progress report", origin).done();
}

std::string encode_requested_keys(const std::set<std::string>& keys) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<flatbuffers::Offset<flatbuffers::String>> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(b.CreateString(k));
  b.Finish(fb::CreateRequestedKeys(b, b.CreateVector(out)));
  return plan::message_bytes(b);
}

std::vector<std::string> decode_requested_keys(std::string_view bytes, const std::string& origin) {
  return plan::strings(plan::verified_message<fb::RequestedKeys>(bytes, "requested keys", origin).keys());
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

std::string encode_read_plan(const std::string& host, const std::string& needs) {
  const std::string host_bytes = host.empty() ? std::string() : encode_host_name(host);
  const auto length = static_cast<uint32_t>(host_bytes.size());
  std::string out(sizeof length, '\0');
  std::memcpy(out.data(), &length, sizeof length);
  return out + host_bytes + needs;
}

ReadPlanMessage decode_read_plan(std::string_view bytes, const std::string& origin) {
  uint32_t length = 0;
  if (bytes.size() < sizeof length) {
    throw ProtocolError(fmt::format("{} sent a read plan of {} bytes, too short for its header", origin, bytes.size()));
  }
  std::memcpy(&length, bytes.data(), sizeof length);
  bytes.remove_prefix(sizeof length);
  if (length > bytes.size()) {
    throw ProtocolError(
        fmt::format("{} sent a read plan whose host name claims {} of its {} bytes", origin, length, bytes.size()));
  }
  ReadPlanMessage m;
  if (length > 0) m.host = decode_host_name(std::string(bytes.substr(0, length)), origin);
  m.needs = std::string(bytes.substr(length));
  return m;
}

}  // namespace distckpt::api
