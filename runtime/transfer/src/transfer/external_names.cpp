#include "transfer/external_names.h"

#include <fmt/format.h>

#include <unordered_map>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"

namespace distckpt::transferring {

StateDict in_source_names(const StateDict& requests, const NameMapping& mapping) {
  std::unordered_map<std::string, MappedName> by_external;
  for (MappedName& name : mapping.expand()) by_external.emplace(name.external, std::move(name));
  return map_outplace(requests, [&](const Value& leaf) -> Value {
    if (leaf.kind() != Kind::kShardedTensor) return leaf;
    const ShardedTensor& request = leaf.as_sharded_tensor();
    const auto found = by_external.find(request.key);
    if (found == by_external.end()) return leaf;  // a source name already
    const MappedName& name = found->second;
    if (request.global_shape != name.external_shape() || request.prepend_axis_num != 0) {
      throw ShardingError(fmt::format("request '{}' has global shape {}, but mapping '{}' makes it {} of '{}'",
                                      request.key, to_string(request.global_shape), mapping.name(),
                                      to_string(name.external_shape()), name.key));
    }
    if (request.flattened_range) {
      throw ShardingError(
          fmt::format("request '{}' holds a flat range: a mapped request must hold a box", request.key));
    }
    // The leading (stacked) axes, then the element's axes at the region's offset.
    Shape offset(name.region.offset.begin(), name.region.offset.begin() + name.leading_axes);
    for (size_t d = 0; d < request.global_offset.size(); ++d) {
      offset.push_back(name.region.offset[static_cast<size_t>(name.leading_axes) + d] + request.global_offset[d]);
    }
    ShardedTensor mapped = request;
    mapped.key = name.key;
    mapped.global_shape = name.key_shape;
    mapped.global_offset = std::move(offset);
    mapped.prepend_axis_num = name.leading_axes;
    mapped.axis_fragmentations.clear();  // a region of the source tensor: no grid of its own
    mapped.validate_metadata_integrity();
    return Value(std::move(mapped));
  });
}

}  // namespace distckpt::transferring
