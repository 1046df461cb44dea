// Start-up: every rank announces itself in the store before the process
// groups connect, so a rank that never starts is named, not just waited for.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>

namespace c10d {
class Store;
}

namespace distckpt {

// Returns once all `world_size` ranks have called it on `store`; after
// `timeout` throws TimeoutError naming the ranks that did not arrive (rank 0
// lists them; the others wait a short while for its list). O(1) store
// operations per rank while every rank arrives, O(world) on rank 0 when one
// does not.
void wait_for_every_rank(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                         std::chrono::milliseconds timeout);

}  // namespace distckpt
