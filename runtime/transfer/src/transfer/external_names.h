// Requests in another naming (Hugging Face Llama names, say) turned into
// requests of the sources' tensors through a name mapping: each external
// tensor is a region of a source tensor (a layer of a stack, a fused part),
// so an external request for any box of it is a request for the matching
// box of the source tensor, filled into the same data.
#pragma once

#include "distckpt/core/state_dict.h"
#include "distckpt/format/name_mapping.h"

namespace distckpt::transferring {

// `requests` with every ShardedTensor whose key the mapping names as an
// external tensor replaced by the request of its region of the source
// tensor (same data, replica id, path in the dict); other entries are kept.
// ShardingError for an external request whose global shape is not the
// mapping's, or that holds a flat range.
StateDict in_source_names(const StateDict& requests, const NameMapping& mapping);

}  // namespace distckpt::transferring
