#include "plan/local_plan.h"

#include <flatbuffers/flatbuffers.h>

#include "distckpt/core/errors.h"
#include "distckpt/fb/plan_generated.h"
#include "distckpt/format/dtype.h"

namespace distckpt::plan {
namespace {

Shape to_shape(const flatbuffers::Vector<int64_t>* v) {
  return v ? Shape(v->begin(), v->end()) : Shape{};
}

}  // namespace

std::string ObjectPlan::unique_key() const {
  ShardedObject object{key, {}, global_shape, global_offset, replica_id};
  return object.unique_key();
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
  return ObjectPlan{object.key, object.global_shape, object.global_offset, object.replica_id};
}

std::string encode_local_plan(const LocalPlan& plan) {
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
                                           b.CreateVector(o.global_offset),
                                           b.CreateVector(o.replica_id)));
  }
  b.Finish(fb::CreateLocalPlan(b, plan.rank, b.CreateVector(tensors), b.CreateVector(objects)),
           fb::LocalPlanIdentifier());
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

LocalPlan decode_local_plan(std::string_view bytes, const std::string& origin) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  flatbuffers::Verifier verifier(data, bytes.size(), 64, 1u << 30);
  if (!fb::VerifyLocalPlanBuffer(verifier)) {
    throw CorruptionError(fmt::format("save plan from {} failed FlatBuffers verification", origin));
  }
  const fb::LocalPlan* root = fb::GetLocalPlan(data);
  LocalPlan plan;
  plan.rank = root->rank();
  if (root->tensors()) {
    plan.tensors.reserve(root->tensors()->size());
    for (const fb::ShardPlan* t : *root->tensors()) {
      ShardPlan p;
      p.key = t->key()->str();
      p.dtype = dtype_from_name(t->dtype()->str());
      p.global_shape = to_shape(t->global_shape());
      p.box = Box{to_shape(t->offset()), to_shape(t->length())};
      if (t->flat_start() >= 0) p.flat = FlatRange{t->flat_start(), t->flat_stop()};
      p.replica_id = to_shape(t->replica_id());
      p.allow_shape_mismatch = t->allow_shape_mismatch();
      if (p.box.offset.size() != p.global_shape.size() || p.box.length.size() != p.global_shape.size()) {
        throw CorruptionError(fmt::format("save plan from {}: '{}' has a box of the wrong rank", origin, p.key));
      }
      plan.tensors.push_back(std::move(p));
    }
  }
  if (root->objects()) {
    plan.objects.reserve(root->objects()->size());
    for (const fb::ObjectPlan* o : *root->objects()) {
      plan.objects.push_back(ObjectPlan{o->key()->str(), to_shape(o->global_shape()),
                                        to_shape(o->global_offset()), to_shape(o->replica_id())});
    }
  }
  return plan;
}

}  // namespace distckpt::plan
