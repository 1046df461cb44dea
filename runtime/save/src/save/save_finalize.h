// The end of a save, shared by save() and the asynchronous queue: agree that
// every rank's data is durable, gather what each rank's writer reports, and
// commit on the coordinator. Any failure on any rank is raised on every rank
// and leaves nothing that looks committed.
#pragma once

#include <functional>
#include <string>

#include "distckpt/save/save.h"
#include "save/save_plan.h"

namespace distckpt::saving {

// What this rank wrote.
struct RankWritten {
  std::string result;  // for the coordinator's StorageWriter::commit
  uint64_t items = 0;
  uint64_t bytes = 0;
};

// Collective. `write` blocks until this rank's data is durable (or throws).
SaveReport finalize_save(PreparedSave& prepared, const std::function<RankWritten()>& write, Communicator& comm);

}  // namespace distckpt::saving
