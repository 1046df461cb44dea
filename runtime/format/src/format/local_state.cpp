// The hollow tensor-aware state dict as FlatBuffers (schema/local.fbs).
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/fb/local_generated.h"
#include "fb_support.h"
#include "format/common_state.h"
#include "format/dtype.h"
#include "format/local_state_codec.h"

namespace distckpt {
namespace {

using fb_support::checked_mul;
using fb_support::checked_numel;

constexpr const char* kLocalIdentifier = "DCKL";
constexpr uint32_t kMaxVerifierDepth = 8;  // LocalState -> records -> vectors

template <typename T>
flatbuffers::Offset<flatbuffers::Vector<T>> vec(flatbuffers::FlatBufferBuilder& fbb, const std::vector<T>& v) {
  return fbb.CreateVector(v);
}

flatbuffers::Offset<fb::LocalTensorRecord> encode_tensor(flatbuffers::FlatBufferBuilder& fbb,
                                                         const LocalTensorEntry& e) {
  const ShardedTensor& t = e.meta;
  fb_support::ensure_room(fbb, 256 + t.key.size() + 8 * e.block_checksums.size(), "the local state");
  const auto key = fbb.CreateString(t.key);
  const auto dtype = fbb.CreateString(dtype_name(t.dtype));
  const auto local_shape = vec(fbb, t.local_shape);
  const auto global_shape = vec(fbb, t.global_shape);
  const auto global_offset = vec(fbb, t.global_offset);
  const auto fragments = vec(fbb, t.axis_fragmentations);
  const auto replica = vec<int64_t>(fbb, t.replica_id);
  const auto device = fbb.CreateString(e.device);
  const auto checksums = vec(fbb, e.block_checksums);
  return fb::CreateLocalTensorRecord(
      fbb, key, dtype, local_shape, global_shape, global_offset, fragments, replica, t.prepend_axis_num,
      t.allow_shape_mismatch, t.flattened_range ? t.flattened_range->start : -1,
      t.flattened_range ? t.flattened_range->stop : -1, e.held, device, e.byte_offset, e.byte_length, checksums);
}

flatbuffers::Offset<fb::LocalObjectRecord> encode_object(flatbuffers::FlatBufferBuilder& fbb, const ShardedObject& o) {
  fb_support::ensure_room(fbb, 128 + o.key.size() + o.data.size(), "the local state");
  const auto key = fbb.CreateString(o.key);
  const auto shape = vec(fbb, o.global_shape);
  const auto offset = vec(fbb, o.global_offset);
  const auto replica = vec<int64_t>(fbb, o.replica_id);
  const auto data = fbb.CreateVector(reinterpret_cast<const uint8_t*>(o.data.data()), o.data.size());
  return fb::CreateLocalObjectRecord(fbb, key, shape, offset, replica, data);
}

class Decoder {
 public:
  Decoder(size_t size, const std::string& origin) : origin_(origin), budget_(size, origin) {}

  LocalState decode(const fb::LocalState& s) {
    if (s.format_version() > kLocalFormatVersion) {
      throw CheckpointError(fmt::format("{}: written by a newer distckpt (local format {}); this build reads {}",
                                        origin_, s.format_version(), kLocalFormatVersion));
    }
    if (s.format_version() != kLocalFormatVersion) fail(fmt::format("format_version {}", s.format_version()));
    LocalState out;
    out.owner_rank = s.owner_rank();
    out.world_size = s.world_size();
    out.iteration = s.iteration();
    if (out.world_size < 1 || out.owner_rank < 0 || out.owner_rank >= out.world_size) {
      fail(fmt::format("owner rank {} of a world of {}", out.owner_rank, out.world_size));
    }
    out.algorithm = str(s.algorithm(), "algorithm");
    if (out.algorithm != "atomic" && out.algorithm != "fully_parallel") fail("unknown algorithm " + out.algorithm);
    out.checksum_block_size = s.checksum_block_size();
    if (out.checksum_block_size == 0) fail("checksum block size 0");
    if (s.tensors() != nullptr) {
      out.tensors.reserve(s.tensors()->size());
      for (const fb::LocalTensorRecord* r : *s.tensors()) out.tensors.push_back(tensor(*r, out.checksum_block_size));
    }
    if (s.objects() != nullptr) {
      out.objects.reserve(s.objects()->size());
      for (const fb::LocalObjectRecord* r : *s.objects()) out.objects.push_back(object(*r));
    }
    if (s.common() != nullptr && s.common()->size() > 0) {
      budget_.charge_vector(s.common());
      out.common = decode_common_state(
          std::string_view(reinterpret_cast<const char*>(s.common()->data()), s.common()->size()), origin_);
    } else {
      out.common = Value::dict();
    }
    return out;
  }

 private:
  // `path`: the file the failure is about, when known (`origin_` need not name a file).
  [[noreturn]] void fail(const std::string& what, const std::string& path = {}) const {
    throw CorruptionError(
        fmt::format("{}: invalid local checkpoint metadata: {}; the file is corrupted", origin_, what), path);
  }

  std::string str(const flatbuffers::String* s, const char* field) {
    if (s == nullptr) fail(fmt::format("{} is missing", field));
    budget_.charge_string(s);
    return s->str();
  }

  Shape shape(const flatbuffers::Vector<int64_t>* v, const std::string& key) {
    Shape out = budget_.copy_vector(v);
    if (!checked_numel(out.begin(), out.end())) fail(fmt::format("'{}': shape {} overflows", key, to_string(out)));
    return out;
  }

  LocalTensorEntry tensor(const fb::LocalTensorRecord& r, uint64_t block) {
    budget_.charge_table();
    LocalTensorEntry e;
    ShardedTensor& t = e.meta;
    t.key = str(r.key(), "a tensor key");
    try {
      t.dtype = dtype_from_name(str(r.dtype(), "a dtype"));
    } catch (const CorruptionError& err) {
      fail(err.what(), err.path());
    }
    t.local_shape = shape(r.local_shape(), t.key);
    t.global_shape = shape(r.global_shape(), t.key);
    t.global_offset = budget_.copy_vector(r.global_offset());
    t.axis_fragmentations = budget_.copy_vector(r.axis_fragmentations());
    t.replica_id = ReplicaId(budget_.copy_vector(r.replica_id()));
    t.prepend_axis_num = r.prepend_axis_num();
    t.allow_shape_mismatch = r.allow_shape_mismatch();
    if (r.flat_start() != -1 || r.flat_stop() != -1) t.flattened_range = FlatRange{r.flat_start(), r.flat_stop()};
    for (size_t a = 0; a < t.global_offset.size() && a < t.global_shape.size(); ++a) {
      if (t.global_offset[a] < 0 || t.global_offset[a] > t.global_shape[a]) {
        fail(fmt::format("'{}': offset {} outside shape {}", t.key, to_string(t.global_offset),
                         to_string(t.global_shape)));
      }
    }
    try {
      t.validate_metadata_integrity();
    } catch (const ShardingError& err) {
      fail(err.what());
    }
    e.held = r.held();
    e.device = str(r.device(), "a device");
    e.byte_offset = r.byte_offset();
    e.byte_length = r.byte_length();
    e.block_checksums = budget_.copy_vector(r.block_checksums());
    const auto expected = checked_mul(static_cast<uint64_t>(t.held_numel()), dtype_size(t.dtype));
    if (e.held && e.byte_length != 0 && (!expected || *expected != e.byte_length)) {
      fail(fmt::format("'{}': {} bytes recorded for {} elements of {}", t.key, e.byte_length, t.held_numel(),
                       dtype_name(t.dtype)));
    }
    if (e.byte_length != 0 && e.block_checksums.size() != fb_support::ceil_div(e.byte_length, block)) {
      fail(fmt::format("'{}': {} checksums for {} bytes", t.key, e.block_checksums.size(), e.byte_length));
    }
    return e;
  }

  ShardedObject object(const fb::LocalObjectRecord& r) {
    budget_.charge_table();
    ShardedObject o;
    o.key = str(r.key(), "an object key");
    o.global_shape = budget_.copy_vector(r.global_shape());
    o.global_offset = budget_.copy_vector(r.global_offset());
    o.replica_id = ReplicaId(budget_.copy_vector(r.replica_id()));
    if (r.data() != nullptr) {
      budget_.charge_vector(r.data());
      o.data.assign(reinterpret_cast<const char*>(r.data()->data()), r.data()->size());
    }
    try {
      o.validate_metadata_integrity();
    } catch (const ShardingError& err) {
      fail(err.what());
    }
    return o;
  }

  const std::string& origin_;
  fb_support::ExpansionBudget budget_;
};

}  // namespace

std::string encode_local_state(const LocalState& state) {
  flatbuffers::FlatBufferBuilder fbb;
  const std::string common = encode_common_state(state.common.is_none() ? Value::dict() : state.common);
  fb_support::ensure_room(fbb, common.size(), "the common state of a local checkpoint");
  const auto common_offset = fbb.CreateVector(reinterpret_cast<const uint8_t*>(common.data()), common.size());
  std::vector<flatbuffers::Offset<fb::LocalTensorRecord>> tensors;
  tensors.reserve(state.tensors.size());
  for (const LocalTensorEntry& e : state.tensors) tensors.push_back(encode_tensor(fbb, e));
  std::vector<flatbuffers::Offset<fb::LocalObjectRecord>> objects;
  objects.reserve(state.objects.size());
  for (const ShardedObject& o : state.objects) objects.push_back(encode_object(fbb, o));
  const auto tensors_offset = fbb.CreateVector(tensors);
  const auto objects_offset = fbb.CreateVector(objects);
  const auto algorithm = fbb.CreateString(state.algorithm);
  fbb.Finish(fb::CreateLocalState(fbb, kLocalFormatVersion, state.owner_rank, state.world_size, state.iteration,
                                  algorithm, state.checksum_block_size, tensors_offset, objects_offset, common_offset),
             kLocalIdentifier);
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

LocalState decode_local_state(std::string_view bytes, const std::string& origin) {
  if (bytes.size() >= fb_support::kMaxBufferSize) {
    throw CorruptionError(fmt::format("{}: local checkpoint metadata of {} bytes is too large", origin, bytes.size()));
  }
  const fb_support::AlignedBytes aligned(bytes);
  flatbuffers::Verifier verifier(aligned.data(), aligned.size(),
                                 fb_support::verifier_options(aligned.size(), kMaxVerifierDepth));
  if (!verifier.VerifyBuffer<fb::LocalState>(kLocalIdentifier)) {
    throw CorruptionError(
        fmt::format("{}: not a valid local checkpoint metadata buffer (failed FlatBuffers verification)", origin));
  }
  return Decoder(aligned.size(), origin).decode(*flatbuffers::GetRoot<fb::LocalState>(aligned.data()));
}

}  // namespace distckpt
