// Rank 0's ncclUniqueId on every rank, through a c10d store: the one piece
// of NCCL's rendezvous that must travel outside NCCL.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <nccl.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
}  // namespace c10d

namespace distckpt::nccl {

// Rank 0 makes the id and sets `key`; the other ranks wait up to `timeout`
// for it. When rank 0 cannot make one, it stores its error instead, so the
// others fail at once with rank 0's cause rather than at the timeout. Throws
// CommError naming the key, the rank and the cause.
ncclUniqueId share_unique_id(c10d::Store& store, const std::string& key, int rank, std::chrono::milliseconds timeout);

// A fresh key under "distckpt/nccl/" for each communicator this process
// creates (ranks create them in the same order, so the keys match).
std::string next_unique_id_key();

}  // namespace distckpt::nccl
