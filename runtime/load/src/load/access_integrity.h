// validate_access_integrity on load: the requests of all ranks checked as a
// save's shards would be (LoadOptions / ToStateDictOptions).
#pragma once

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"

namespace distckpt::loading {

// Collective: every rank's requested ShardedTensors and ShardedObjects
// (`sharded`: factories applied) gathered on rank 0 and validated there;
// the ShardingError naming tensor, ranks and boxes is raised on every rank.
void validate_access_integrity(const Value& sharded, Communicator& comm);

}  // namespace distckpt::loading
