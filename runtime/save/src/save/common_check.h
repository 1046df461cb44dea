// Common (non-sharded) state that differs between ranks: only the
// coordinator's is saved, so the others learn which key paths of theirs are lost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/save/options.h"
#include "plan/messages.h"

namespace distckpt::saving {

plan::CommonLeafHashes hash_common_leaves(const Value& common);

// Paths where `mine` differs from `coordinator`'s (a value, or present on one side only).
std::vector<std::string> differing_paths(const plan::CommonLeafHashes& mine, const plan::CommonLeafHashes& coordinator);

// Collective, called by every rank once `digests` (every rank's
// plan::CommonLeafHashes::digest) are known to differ: `coordinator` broadcasts its leaf
// hashes, every differing rank warns or (kError) fails naming its paths; the
// outcome is agreed.
void check_common_state(const plan::CommonLeafHashes& mine, const std::vector<uint64_t>& digests, CommonStateCheck mode,
                        int coordinator, Communicator& comm);

}  // namespace distckpt::saving
