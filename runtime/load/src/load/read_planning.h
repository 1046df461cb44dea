// Planning which rank reads each stored piece that several ranks need, and
// what travels to whom (plan/load_schedule.h), across the ranks of a load.
//
// Partitioned (the point-to-point exchanges, the default): every rank routes
// each need to the scheduler of its piece (a hash of (tensor, piece) modulo
// the world) in the load's agreement on planning; a scheduler schedules its
// pieces and tells each rank its share (plan/load_share.h) in one all-to-all:
// the pieces it reads or needs, and the windows of its transfers. A rank
// holds its own needs, the needs routed to it and its share, never the
// world's. Readers are balanced within each scheduler's pieces.
//
// The rounds exchange (LoadExchange::kAllGather) cuts its rounds over every
// rank's transfers, so there every rank gathers every rank's needs and plans
// the whole load, as Megatron's gather rounds do.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "load/checkpoint_reader.h"
#include "load/load_requests.h"
#include "load/read_engine.h"
#include "plan/load_share.h"

namespace distckpt::loading {

// The checkpoint as planning sees it: a piece's geometry (ProtocolError for
// one it does not hold, as a peer may name any) and the check of another
// rank's needs (UsageError: not in this checkpoint).
struct PieceCatalog {
  plan::PieceLookup lookup;
  std::function<void(const std::vector<plan::PieceNeed>& needs, int rank)> check;
  bool has_holders = false;  // some pieces only their holders can read (a live transfer's)
};
PieceCatalog catalog_of(CheckpointReader& reader);

// Whether pieces several ranks need are read once and shared.
bool shares_reads(const ReadEngineOptions& options, const Communicator& comm);
// Whether planning is partitioned (else every rank plans everything).
bool partitioned_reads(const ReadEngineOptions& options);

int scheduler_of(uint32_t tensor, uint32_t piece, int world);

// Not collective: what this rank sends, part r for rank r, as the load
// agrees on planning, partitioned: each scheduler the needs of its pieces.
// Every part carries the rank's number of staging rounds; those with needs
// also its host (empty: not asked).
std::vector<std::string> route_read_plan(const std::vector<std::vector<TensorRead>>& rounds, int rank, int world,
                                         const std::string& host);
// Not collective: the rounds exchange's plan, which every rank gets, with
// this rank's batch (every rank must cut the rounds alike).
std::string whole_read_plan(const std::vector<std::vector<TensorRead>>& rounds, int rank, uint64_t batch_bytes);

// Partitioned, on a scheduler: given what every rank routed here (by rank),
// checked against the checkpoint, the share of every rank, part r for rank r.
std::vector<std::string> schedule_routed_needs(const PieceCatalog& catalog, const std::vector<std::string>& routed,
                                               const ReadEngineOptions& options, int me);

// Partitioned, on a rank: its shares, one per staging round, from what every
// scheduler sent (by rank), and per round whether any rank shares a piece
// within its host. `my_needs`: the rank's needs per staging round. Returns
// the load's number of staging rounds.
size_t merge_shares(const PieceCatalog& catalog, const std::vector<std::string>& messages,
                    const std::vector<std::vector<plan::PieceNeed>>& my_needs, int me,
                    std::vector<plan::LoadShare>& shares, std::vector<bool>& within_host);

// The rounds exchange, on every rank: round `round`'s share of this rank
// from every rank's plan (by rank), and the number of exchange rounds.
plan::LoadShare share_from_all_plans(const PieceCatalog& catalog, const std::vector<std::string>& plans, size_t round,
                                     const ReadEngineOptions& options, int me, uint64_t& exchange_rounds);

// The number of staging rounds in the rounds exchange's plans (the most any rank runs).
size_t staging_rounds(const std::vector<std::string>& plans, int world);

}  // namespace distckpt::loading
