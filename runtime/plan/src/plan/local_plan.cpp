#include "plan/local_plan.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "plan/wire.h"

namespace distckpt::plan {
std::string ObjectPlan::unique_key() const {
  ShardedObject object{key, {}, global_shape, global_offset, replica_id};
  return object.unique_key();
}

uint64_t LocalPlan::item_bytes(size_t item) const {
  if (item < tensors.size()) {
    const ShardPlan& t = tensors[item];
    return static_cast<uint64_t>(t.stored_numel()) * dtype_size(t.dtype);
  }
  return objects.at(item - tensors.size()).byte_size;
}

namespace {

class StructureHasher {
 public:
  void add(const std::string& s) {
    add(static_cast<int64_t>(s.size()));
    hash_.update(s.data(), s.size());
  }
  void add(int64_t v) { hash_.update(&v, sizeof v); }
  void add(const std::vector<int64_t>& v) {
    add(static_cast<int64_t>(v.size()));
    if (!v.empty()) hash_.update(v.data(), v.size() * sizeof(int64_t));
  }
  uint64_t digest() const { return hash_.digest(); }

 private:
  io::StreamingHash hash_;
};

}  // namespace

uint64_t structure_hash(const LocalPlan& plan) {
  StructureHasher h;
  h.add(static_cast<int64_t>(plan.tensors.size()));
  for (const ShardPlan& t : plan.tensors) {
    h.add(t.key);
    h.add(static_cast<int64_t>(t.dtype));
    h.add(t.global_shape);
    h.add(t.box.offset);
    h.add(t.box.length);
    h.add(t.flat ? t.flat->start : -1);
    h.add(t.flat ? t.flat->stop : -1);
    h.add(t.replica_id);
    h.add(int64_t{t.allow_shape_mismatch});
  }
  h.add(static_cast<int64_t>(plan.objects.size()));
  for (const ObjectPlan& o : plan.objects) {
    h.add(o.key);
    h.add(o.global_shape);
    h.add(o.global_offset);
    h.add(o.replica_id);
  }
  return h.digest();
}

void sort_canonically(const LocalPlan& plan, std::vector<uint32_t>& items) {
  const size_t n = plan.tensors.size();
  std::vector<std::string> object_keys(plan.objects.size());
  for (uint32_t i : items) {
    if (i >= n) object_keys[i - n] = plan.objects[i - n].unique_key();
  }
  std::sort(items.begin(), items.end(), [&](uint32_t a, uint32_t b) {
    const bool a_obj = a >= n, b_obj = b >= n;
    if (a_obj != b_obj) return b_obj;  // tensors first
    if (a_obj) return object_keys[a - n] < object_keys[b - n];
    const ShardPlan& x = plan.tensors[a];
    const ShardPlan& y = plan.tensors[b];
    if (x.key != y.key) return x.key < y.key;
    if (x.box != y.box) return x.box < y.box;
    return (x.flat ? x.flat->start : 0) < (y.flat ? y.flat->start : 0);
  });
}

ShardPlan plan_of(const ShardedTensor& tensor) {
  ShardPlan p;
  p.key = tensor.key;
  p.dtype = tensor.dtype;
  p.global_shape = tensor.global_shape;
  p.box = tensor.global_box();
  p.flat = tensor.flattened_range;
  p.replica_id = tensor.replica_id;
  p.allow_shape_mismatch = tensor.allow_shape_mismatch;
  return p;
}

ObjectPlan plan_of(const ShardedObject& object) {
  return ObjectPlan{object.key, object.global_shape, object.global_offset, object.replica_id, object.data.size()};
}

namespace {

std::string encode_plan(const LocalPlan& plan, const std::vector<uint32_t>* items) {
  flatbuffers::FlatBufferBuilder b(1024);
  std::vector<flatbuffers::Offset<fb::ShardPlan>> tensors;
  tensors.reserve(plan.tensors.size());
  for (const ShardPlan& t : plan.tensors) {
    tensors.push_back(fb::CreateShardPlan(
        b, b.CreateString(t.key), b.CreateString(dtype_name(t.dtype)), b.CreateVector(t.global_shape),
        b.CreateVector(t.box.offset), b.CreateVector(t.box.length), t.flat ? t.flat->start : -1,
        t.flat ? t.flat->stop : -1, b.CreateVector(t.replica_id), t.allow_shape_mismatch));
  }
  std::vector<flatbuffers::Offset<fb::ObjectPlan>> objects;
  objects.reserve(plan.objects.size());
  for (const ObjectPlan& o : plan.objects) {
    objects.push_back(fb::CreateObjectPlan(b, b.CreateString(o.key), b.CreateVector(o.global_shape),
                                           b.CreateVector(o.global_offset), b.CreateVector(o.replica_id), o.byte_size));
  }
  const auto item_vector = items ? b.CreateVector(*items) : flatbuffers::Offset<flatbuffers::Vector<uint32_t>>();
  b.Finish(fb::CreateLocalPlan(b, plan.rank, b.CreateVector(tensors), b.CreateVector(objects), item_vector),
           fb::LocalPlanIdentifier());
  return message_bytes(b);
}

LocalPlan decode_plan(std::string_view bytes, const std::string& origin, std::vector<uint32_t>* items) {
  const fb::LocalPlan* root = &verified_message<fb::LocalPlan>(bytes, "save plan", origin, fb::LocalPlanIdentifier());
  const auto shape = [&](const flatbuffers::Vector<int64_t>* v) { return scalars(v, "save plan", origin); };
  LocalPlan plan;
  plan.rank = root->rank();
  if (root->tensors()) {
    plan.tensors.reserve(root->tensors()->size());
    for (const fb::ShardPlan* t : *root->tensors()) {
      ShardPlan p;
      p.key = t->key()->str();
      try {
        p.dtype = dtype_from_name(t->dtype()->str());
      } catch (const CorruptionError& e) {
        malformed("save plan", origin, e.what());
      }
      p.global_shape = shape(t->global_shape());
      p.box = Box{shape(t->offset()), shape(t->length())};
      if (t->flat_start() >= 0) p.flat = FlatRange{t->flat_start(), t->flat_stop()};
      p.replica_id = shape(t->replica_id());
      p.allow_shape_mismatch = t->allow_shape_mismatch();
      if (p.box.offset.size() != p.global_shape.size() || p.box.length.size() != p.global_shape.size()) {
        malformed("save plan", origin, fmt::format("'{}' has a box of the wrong rank", p.key));
      }
      plan.tensors.push_back(std::move(p));
    }
  }
  if (root->objects()) {
    plan.objects.reserve(root->objects()->size());
    for (const fb::ObjectPlan* o : *root->objects()) {
      plan.objects.push_back(ObjectPlan{o->key()->str(), shape(o->global_shape()), shape(o->global_offset()),
                                        shape(o->replica_id()), o->byte_size()});
    }
  }
  if (items) {
    *items = scalars(root->items(), "save plan", origin);
    if (items->size() != plan.item_count()) {
      malformed("save plan", origin, fmt::format("{} item indices for {} items", items->size(), plan.item_count()));
    }
  }
  return plan;
}

}  // namespace

std::string encode_local_plan(const LocalPlan& plan) { return encode_plan(plan, nullptr); }

LocalPlan decode_local_plan(std::string_view bytes, const std::string& origin) {
  return decode_plan(bytes, origin, nullptr);
}

std::string encode_plan_part(const LocalPlan& part, const std::vector<uint32_t>& items) {
  return encode_plan(part, &items);
}

LocalPlan decode_plan_part(std::string_view bytes, const std::string& origin, std::vector<uint32_t>& items) {
  return decode_plan(bytes, origin, &items);
}

std::vector<LocalPlan> decode_local_plans(const std::vector<std::string>& gathered) {
  std::vector<LocalPlan> plans;
  plans.reserve(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r)
    plans.push_back(decode_local_plan(gathered[r], fmt::format("rank {}", r)));
  return plans;
}

}  // namespace distckpt::plan
