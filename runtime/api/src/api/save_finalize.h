// The end of a save, shared by save() and the asynchronous queue: agree that
// every rank's data is durable, gather the write results, fill the metadata
// skeleton and commit on the coordinator. Any failure on any rank is raised
// on every rank and leaves no committed-looking directory.
#pragma once

#include <functional>

#include "api/save_plan.h"
#include "distckpt/api/checkpoint.h"
#include "io/file_write_job.h"

namespace distckpt::api {

// Collective. `written` blocks until this rank's file is durable (or throws).
SaveReport finalize_save(PreparedSave& prepared, const std::function<io::FileWritten()>& written, Communicator& comm);

// The write options a save's file uses.
io::FileWriteOptions file_write_options(const SaveOptions& options);

}  // namespace distckpt::api
