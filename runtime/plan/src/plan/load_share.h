// One rank's part in sharing a load round's pieces (plan/load_schedule.h):
// the shared pieces it reads or needs part of, and the message transfers it
// sends or receives, each with the window and tag (comm/exchange.h) that its
// sender and receiver agree on. The read engine runs on a rank's share alone.
//
// Shares come from a schedule: the whole load's (the rounds exchange, where
// every rank plans everything), or a scheduler's schedule of its part of the
// pieces (partitioned planning, load/read_planning.h). The latter travel as
// LoadShareMessage (schema/wire.fbs); a rank merges those of every scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/box.h"
#include "plan/load_schedule.h"

namespace distckpt::plan {

struct ShareNeeder {
  int rank = 0;
  std::vector<Box> parts;  // in that rank's order
};

struct SharePiece {
  uint32_t tensor = 0;
  uint32_t piece = 0;
  PieceGeometry geometry;
  int reader = 0;
  bool same_host = false;
  std::vector<Box> slabs;
  std::vector<uint32_t> own_needs;  // this rank's needs the piece serves, in its order
  std::vector<ShareNeeder> others;  // on the reader: every other needer, ascending rank
};

// A message transfer of this rank: slab `slab` of pieces[piece], from its
// reader to one of its needers.
struct ShareTransfer {
  uint32_t piece = 0;
  uint32_t slab = 0;
  int32_t other = -1;  // the receiver in the piece's others; -1: this rank's own parts
  int from = 0;
  int to = 0;
  uint64_t bytes = 0;  // the receiver's elements in the slab (the reader's own parts: 0)
  uint64_t window = 0;
  uint32_t tag = 0;
};

struct LoadShare {
  std::vector<SharePiece> pieces;
  std::vector<int32_t> slot;             // per need of this rank: its piece, or -1 (read by the rank itself)
  std::vector<ShareTransfer> transfers;  // by (window, tag)
};

struct TransferKey {
  uint64_t window = 0;
  uint32_t tag = 0;
};

// The shares of a schedule's needers: `needs[i]` are the needs of rank
// `ranks[i]` (those a scheduler got, or every rank's), `keys[k]` the window
// and tag of slab_transfers(schedule, needs)[k]. Result i is ranks[i]'s share;
// its slot covers needs[i]. `only` >= 0: only that needer's share is made
// (the others are left empty).
std::vector<LoadShare> shares_of(const LoadSchedule& schedule, const std::vector<std::vector<PieceNeed>>& needs,
                                 const std::vector<int>& ranks, const std::vector<TransferKey>& keys, int only = -1);

// A scheduler's message to one rank: its shares, round by round (nullptr
// where it has none), the number of staging rounds the load runs, and the
// rounds in which the scheduler shares some piece within a host.
std::string encode_share_message(uint32_t rounds, const std::vector<const LoadShare*>& shares,
                                 const std::vector<uint32_t>& host_rounds);

struct ShareHeader {
  uint32_t rounds = 0;
  std::vector<uint32_t> host_rounds;
};
// A scheduler's message's round count and host rounds (ProtocolError when malformed).
ShareHeader decode_share_header(std::string_view bytes, const std::string& origin);

// What a rank received from one scheduler, checked against the rank's own
// needs and the checkpoint (through `lookup`, which throws for an unknown
// piece) and merged into `shares` (one per staging round, slot sized to its
// needs); raises ProtocolError for what does not fit. Returns the message's
// round count.
uint32_t merge_share_message(std::string_view bytes, const std::string& origin, int me, int world,
                             const PieceLookup& lookup, const std::vector<std::vector<PieceNeed>>& my_needs,
                             std::vector<LoadShare>& shares);

// Orders a merged share's transfers by (window, tag).
void sort_transfers(LoadShare& share);

}  // namespace distckpt::plan
