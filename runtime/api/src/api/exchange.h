// Fully parallel load, the exchange: each shared piece (plan/load_schedule.h)
// is read by its reader in slabs, and every other rank that needs part of it
// receives exactly those elements.
//
// Every message carries a status word, so a reader that fails to read a slab
// still sends (a failure) and nobody waits for bytes that never come; the
// transfers run to the end and the caller agrees on the errors afterwards.
// Extra memory: one slab and one message (broadcast), or one round's
// contributions from every rank (all-gather).
#pragma once

#include <exception>
#include <vector>

#include "api/checkpoint_reader.h"
#include "api/load_requests.h"
#include "distckpt/comm/communicator.h"
#include "plan/load_schedule.h"

namespace distckpt::api {

struct ExchangeContext {
  CheckpointReader& reader;
  Communicator& comm;
  const plan::LoadSchedule& schedule;
  const std::vector<std::vector<plan::PieceNeed>>& needs;  // every rank's, as all-gathered
  const std::vector<TensorRead>& mine;                      // this rank's reads, in the order of needs[rank]
  uint64_t batch_bytes;                                     // all-gather: a rank's contribution per round
};

// Point to point: for each shared piece in order, the reader sends each
// needer its part of each slab. Returns this rank's first read error;
// communication failures throw.
std::exception_ptr exchange_broadcast(const ExchangeContext& context);
// Batched: every rank packs the messages of its next slabs (up to
// batch_bytes) and one all-gather per round delivers them all.
std::exception_ptr exchange_all_gather(const ExchangeContext& context);

}  // namespace distckpt::api
