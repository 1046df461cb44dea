#include "transfer/digest_check.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <utility>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "io/checksum.h"
#include "io/tensor_digest.h"
#include "plan/wire.h"

namespace distckpt::transferring {
namespace {

constexpr const char* kWhat = "transfer digests";
constexpr size_t kNamedMismatches = 8;  // the message names this many; the count says the rest

// The digest of the elements a shard holds (`data`: its values, any
// device; undefined: only which elements), and which they are.
std::pair<uint64_t, io::PlaceSums> shard_digest(const ShardedTensor& shard, const at::Tensor& data) {
  const at::Tensor values = !data.defined() || data.device().is_cpu() ? data : data.cpu();
  const Box box = shard.global_box();
  if (!shard.flattened_range) {
    const uint64_t digest =
        values.defined() ? io::digest_region(values.reshape(box.length), box, shard.global_shape) : 0;
    return {digest, io::place_sums(box, shard.global_shape)};
  }
  const FlatRange flat = *shard.flattened_range;
  const at::Tensor flat_values = values.defined() ? values.reshape({-1}) : values;
  uint64_t sum = 0;
  io::PlaceSums places;
  for (const FlatPiece& piece : decompose_flat_range(box, flat)) {
    if (values.defined()) {
      const at::Tensor part = flat_values.narrow(0, piece.flat_start - flat.start, piece.box.numel());
      sum += io::digest_region(part.reshape(piece.box.length), piece.box, shard.global_shape);
    }
    places += io::place_sums(piece.box, shard.global_shape);
  }
  return {sum, places};
}

int owner_of(const std::string& key, int world) {
  return static_cast<int>(io::xxh3(key.data(), key.size()) % static_cast<uint64_t>(world));
}

struct Sums {
  uint64_t source = 0, received = 0;
  io::PlaceSums source_places, received_places;
  bool requested = false, converted = false;
};

}  // namespace

std::vector<DigestPart> source_digests(const std::vector<const ShardedTensor*>& sources) {
  std::vector<DigestPart> parts;
  for (const ShardedTensor* s : sources) {
    if (!s->is_main_replica() || s->held_numel() == 0) continue;
    const auto [digest, places] = shard_digest(*s, s->data);
    parts.push_back(DigestPart{s->key, true, digest, places, false});
  }
  return parts;
}

std::vector<DigestPart> received_digests(const std::vector<loading::FilledTensor>& filled,
                                         const StorageIndex& sources) {
  std::vector<DigestPart> parts;
  for (const loading::FilledTensor& f : filled) {
    if (!f.request.is_main_replica() || f.request.held_numel() == 0) continue;
    const TensorRecord* record = sources.find_tensor(f.request.key);
    const bool converted = !record || record->dtype != f.values.scalar_type();
    const auto [digest, places] = shard_digest(f.request, converted ? at::Tensor() : f.values);
    parts.push_back(DigestPart{f.request.key, false, digest, places, converted});
  }
  return parts;
}

DigestReport compare_digests(Communicator& comm, const std::function<std::vector<DigestPart>()>& parts,
                             const StorageIndex& sources) {
  const int world = comm.size();
  const std::vector<std::string> routed = all_to_all_agreed(comm, "route the transferred tensors' digests", [&] {
    std::vector<std::vector<DigestPart>> by_owner(static_cast<size_t>(world));
    for (const DigestPart& p : parts()) by_owner[static_cast<size_t>(owner_of(p.key, world))].push_back(p);
    std::vector<std::string> out(static_cast<size_t>(world));
    for (size_t r = 0; r < out.size(); ++r) {
      if (!by_owner[r].empty()) out[r] = encode_digest_parts(by_owner[r]);
    }
    return out;
  });
  DigestReport report;
  std::vector<std::string> mismatches;
  run_agreed(comm, "check the transferred tensors' digests", [&] {
    std::map<std::string, Sums> sums;
    for (size_t r = 0; r < routed.size(); ++r) {
      if (routed[r].empty()) continue;
      const std::string origin = fmt::format("rank {}", r);
      for (const DigestPart& p : decode_digest_parts(routed[r], origin)) {
        if (owner_of(p.key, world) != comm.rank() || !sources.find_tensor(p.key)) {
          plan::malformed(kWhat, origin, fmt::format("'{}' is not a source tensor this rank checks", p.key));
        }
        Sums& s = sums[p.key];
        if (p.source) {
          s.source += p.digest;
          s.source_places += p.places;
        } else {
          s.requested = true;
          s.converted = s.converted || p.converted;
          s.received += p.digest;
          s.received_places += p.places;
        }
      }
    }
    for (const auto& [key, s] : sums) {
      if (!s.requested) continue;  // sent nowhere
      const TensorRecord* record = sources.find_tensor(key);
      const auto numel = static_cast<uint64_t>(record ? distckpt::numel(record->global_shape) : 0);
      if (s.converted) {
        report.unverified[key] = "received in another dtype than its sources'";
      } else if (!(s.received_places == s.source_places) || s.source_places.elements != numel) {
        report.unverified[key] = fmt::format(
            "the destinations' main replicas did not receive each of its {} elements once ({} received; replica "
            "ids decide which ranks count)",
            numel, s.received_places.elements);
      } else if (s.source != s.received) {
        mismatches.push_back(fmt::format("'{}' (digest {} on the sources, {} received)", key, io::hex64(s.source),
                                         io::hex64(s.received)));
      } else {
        report.verified[key] = s.source;
      }
    }
    if (mismatches.empty()) return;
    std::string named;
    for (size_t i = 0; i < std::min(mismatches.size(), kNamedMismatches); ++i) named += (i ? ", " : "") + mismatches[i];
    if (mismatches.size() > kNamedMismatches)
      named += fmt::format(" and {} more", mismatches.size() - kNamedMismatches);
    throw ProtocolError(fmt::format(
        "{} transferred tensor(s) arrived different from their sources: {}. Bytes changed on the way, or a source "
        "tensor changed during the transfer; transfer again",
        mismatches.size(), named));
  });
  return report;
}

std::string encode_digest_parts(const std::vector<DigestPart>& parts) {
  flatbuffers::FlatBufferBuilder b(64 + 64 * parts.size());
  std::vector<flatbuffers::Offset<fb::TensorDigestPart>> out;
  out.reserve(parts.size());
  for (const DigestPart& p : parts) {
    out.push_back(fb::CreateTensorDigestPart(b, b.CreateString(p.key), p.source, p.digest, p.places.elements,
                                             p.converted, p.places.indices, p.places.squares));
  }
  b.Finish(fb::CreateTransferDigests(b, b.CreateVector(out)));
  return plan::message_bytes(b);
}

std::vector<DigestPart> decode_digest_parts(std::string_view bytes, const std::string& origin) {
  const auto& root = plan::verified_message<fb::TransferDigests>(bytes, kWhat, origin);
  std::vector<DigestPart> parts;
  if (!root.parts()) return parts;
  parts.reserve(root.parts()->size());
  for (const fb::TensorDigestPart* p : *root.parts()) {
    parts.push_back(DigestPart{plan::string_or_empty(p->key()), p->source(), p->digest(),
                               io::PlaceSums{p->elements(), p->indices(), p->squares()}, p->converted()});
  }
  return parts;
}

}  // namespace distckpt::transferring
