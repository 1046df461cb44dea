// The last step of every load (global or local): one state dict from the
// common values, the loaded entries and the request's non-persistent values,
// with factories merged and key mismatches returned where the mode says so.
#pragma once

#include "api/state_dict_split.h"
#include "api/strict_keys.h"
#include "distckpt/api/checkpoint.h"

namespace distckpt::api {

// `split.sharded` holds the loaded values in place of the requested leaves.
LoadResult assemble_load_result(Value common, const SplitStateDict& split, const Value& request, KeyMismatch mismatch,
                                StrictHandling strict);

}  // namespace distckpt::api
