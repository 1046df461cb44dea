// Fully parallel load, the exchange: each shared piece of a rank's share
// (plan/load_share.h) not served within its host (load/host_exchange.h) is
// read by its reader in slabs, and every other rank that needs part of it
// receives exactly those elements, over the comm layer's exchange engine
// (comm/exchange.h): one transfer per slab and needer, keyed by the plan.
//
// Every message carries a status word, so a reader that fails to read a slab
// still sends (a failure) and nobody waits for bytes that never come; the
// transfers run to the end and the caller agrees on the errors afterwards.
// Extra memory: one slab and one message (point to point), or one round's
// messages from and to this rank (rounds).
#pragma once

#include <exception>
#include <vector>

#include "comm/exchange.h"
#include "distckpt/comm/communicator.h"
#include "load/checkpoint_reader.h"
#include "load/load_requests.h"
#include "plan/load_share.h"

namespace distckpt::loading {

// What every slab message carries after the elements: ok, or the reader failed.
constexpr uint64_t kSlabStatusBytes = sizeof(uint64_t);

struct ExchangeContext {
  CheckpointReader& reader;
  Communicator& comm;
  const plan::LoadShare& share;
  const std::vector<TensorRead>& mine;  // this rank's reads, in the order of its needs
  uint64_t batch_bytes;  // on one host: what a slot of this rank's shared memory holds (the plan cut the windows)
};

// Collective. `rounds`: the rounds mode's number of rounds. Returns this
// rank's first read error (or a peer's malformed status word);
// communication failures throw.
std::exception_ptr exchange_shared_pieces(const ExchangeContext& context, comm::ExchangeMode mode, uint64_t rounds);

}  // namespace distckpt::loading
