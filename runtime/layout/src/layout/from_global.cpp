#include "distckpt/layout/from_global.h"

#include <fmt/format.h>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"

namespace distckpt::layout {
namespace {

at::Tensor slice(const ShardedTensor& t, const GlobalTensorFn& global) {
  at::Tensor whole = global(t.key, t.global_shape);
  if (Shape(whole.sizes().begin(), whole.sizes().end()) != t.global_shape) {
    throw ShardingError(fmt::format("global tensor for '{}' has shape {}, expected {}", t.key,
                                    to_string(Shape(whole.sizes().begin(), whole.sizes().end())),
                                    to_string(t.global_shape)));
  }
  const Box box = t.global_box();
  for (size_t d = 0; d < box.ndim(); ++d) whole = whole.narrow(static_cast<int64_t>(d), box.offset[d], box.length[d]);
  at::Tensor local = whole.reshape(t.local_shape);
  if (t.flattened_range) local = local.flatten().slice(0, t.flattened_range->start, t.flattened_range->stop);
  return local.clone();
}

}  // namespace

at::Tensor local_from_global(const Value& entry, const GlobalTensorFn& global) {
  if (entry.kind() == Kind::kShardedTensor) return slice(entry.as_sharded_tensor(), global);
  const ShardedTensorFactory& factory = entry.as_factory();
  return factory.merge(map_outplace(factory.build_subtree(),
                                    [&](const Value& leaf) { return Value(slice(leaf.as_sharded_tensor(), global)); }));
}

}  // namespace distckpt::layout
