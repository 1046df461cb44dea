// How many I/O threads a rank of a save or a load uses.
#pragma once

namespace distckpt {

// The I/O threads a rank uses for `requested` (SaveOptions/LoadOptions::io_threads):
// itself when positive; for 0, this host's cores divided among the ranks on it
// (LOCAL_WORLD_SIZE, as set by torchrun and distckpt-launch; 1 when unset),
// between 1 and kMaxAutoIoThreads. More threads than cores only make the
// copies and checksums of co-located ranks take turns. Negative: an error.
constexpr int kMaxAutoIoThreads = 4;
int resolve_io_threads(int requested);

}  // namespace distckpt
