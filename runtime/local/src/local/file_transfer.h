// Moving a whole file from one rank to another over the communicator, in
// bounded slabs, for replicas and recoveries. The sender first sends a status
// and the size, so a sender that cannot read its file still sends (a failure)
// and the receiver never waits for bytes that will not come.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "distckpt/comm/communicator.h"

namespace distckpt::local {

// Sends `path` to `dst`. Returns the local failure (unreadable file), if any.
std::exception_ptr send_file(Communicator& comm, const std::string& path, int dst, int tag, uint64_t slab_bytes);

// Receives a file from `src` into `path` (created or truncated, fsync'ed).
// Returns false, with `why` set, when the sender had no file to send; a
// local write failure is thrown in its own class (IoError), once every slab
// has been received (the sender never blocks).
bool recv_file(Communicator& comm, int src, int tag, const std::string& path, uint64_t slab_bytes, std::string& why);

}  // namespace distckpt::local
