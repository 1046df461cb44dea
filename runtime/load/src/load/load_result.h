// The last step of every load (global or local): one state dict from the
// common values, the loaded entries and the request's non-persistent values,
// with factories merged and key mismatches returned where the mode says so.
#pragma once

#include "core/state_dict_split.h"
#include "distckpt/load/load.h"
#include "load/strict_keys.h"

namespace distckpt::loading {

// `split.sharded` holds the loaded values in place of the requested leaves.
LoadResult assemble_load_result(Value common, const SplitStateDict& split, const Value& request, KeyMismatch mismatch,
                                StrictHandling strict);

}  // namespace distckpt::loading
