// Fully parallel load, as a plan: which rank reads each stored piece that
// several ranks need, and what travels to whom.
//
// Every rank lists the parts of stored pieces it needs (a piece is a
// row-major, contiguous box of one stored chunk: plan/chunk_index.h). A piece
// needed by one rank is read by that rank. A piece needed by several is read
// once, by one of them chosen to balance the bytes each rank reads (largest
// pieces first, to the needer that reads the least so far, ties to the lowest
// rank), in slabs of whole rows (a piece only some ranks can read, as a live
// transfer's: by one of those, PieceGeometry::holders); from each slab every other needer receives
// exactly the elements of its parts, packed in its own order. When the ranks'
// hosts are known, a piece whose needers all run on one host is marked so:
// its slabs reach them through shared memory instead of messages. A
// scheduler computes the schedule of the pieces routed to it
// (load/read_planning.h); in the rounds exchange every rank computes the
// whole load's from every rank's needs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt::plan {

struct PieceNeed {
  uint32_t tensor = 0;  // index into the checkpoint metadata's tensors
  uint32_t piece = 0;   // index into that tensor's ChunkIndex::pieces()
  Box part;             // global coordinates, inside the piece's box
};

struct PieceGeometry {
  Box box;
  uint64_t element_size = 1;
  // The ranks that can read the piece (ascending; in the rank numbering of
  // the needs it is scheduled with), when not every rank can: a live
  // transfer's sources, whose pieces are in their holders' memory. A needer
  // that holds such a piece reads its own parts from its copy; the other
  // needers get theirs from the holder that reads the least so far, which
  // takes part in the piece without a need of its own.
  std::vector<int> holders;
};
using PieceLookup = std::function<PieceGeometry(uint32_t tensor, uint32_t piece)>;

struct SharedPiece {
  uint32_t tensor = 0;
  uint32_t piece = 0;
  PieceGeometry geometry;
  int reader = 0;
  bool same_host = false;  // every needer runs on one host (known hosts only)
  std::vector<Box> slabs;  // consecutive row ranges covering the rows anyone needs
  struct Needer {
    int rank = 0;
    std::vector<uint32_t> needs;  // indices into that rank's needs, in its order
  };
  std::vector<Needer> needers;  // ascending rank; the reader among them

  // Bytes `needer` receives from slab `slab` (its parts cut to the slab).
  uint64_t message_bytes(const std::vector<std::vector<PieceNeed>>& needs, const Needer& needer, size_t slab) const;
  uint64_t read_bytes() const;  // the slabs' bytes
};

struct LoadSchedule {
  std::vector<SharedPiece> shared;  // in (tensor, piece) order: the order of the exchange
  // shared_slot[rank][i]: the shared piece serving need i of rank, or -1
  // when the rank reads that need's piece itself.
  std::vector<std::vector<int32_t>> shared_slot;
  std::vector<uint64_t> read_bytes;  // per rank, from storage (private pieces: rows spanned by their parts)
};

// One message of the exchange of a schedule's shared pieces: slab `slab` of
// shared[shared], from its reader to needers[needer] (the reader itself: its
// own parts, nothing moves).
struct SlabTransfer {
  uint32_t shared = 0;
  uint32_t slab = 0;
  uint32_t needer = 0;
  uint64_t bytes = 0;  // the needer's elements in the slab; the reader's own: 0
};

// The messages of the pieces not served within a host, in exchange order: per
// shared piece and slab, the reader's own parts (so the slab is read even
// when nobody else needs it), then each other needer with bytes in the slab.
std::vector<SlabTransfer> slab_transfers(const LoadSchedule& schedule,
                                         const std::vector<std::vector<PieceNeed>>& needs);

// Rows [first, last) of `piece` that cover `parts` (axis 0; a 0-d piece is one row).
std::pair<int64_t, int64_t> row_span(const Box& piece, const std::vector<const Box*>& parts);
// Bytes of `parts` inside `slab` (a needer's message from that slab).
uint64_t bytes_in_slab(const std::vector<const Box*>& parts, const Box& slab, uint64_t element_size);
// `rows` of `piece` cut into slabs of at most `slab_bytes` (at least one row each).
std::vector<Box> cut_slabs(const Box& piece, int64_t first_row, int64_t last_row, uint64_t element_size,
                           uint64_t slab_bytes);

// `needs[r]` are rank r's needs. `share` false: every rank reads what it
// needs (no shared pieces). `host_of_rank`: a host number per rank, or empty
// when unknown (no piece is same_host). `tie_start`: where the balance's
// ties start (plan/balance.h). Cost O(N log N) in the total number of needs.
LoadSchedule make_load_schedule(const std::vector<std::vector<PieceNeed>>& needs, const PieceLookup& lookup,
                                uint64_t slab_bytes, bool share, const std::vector<int>& host_of_rank = {},
                                size_t tie_start = 0);

// Wire format of a rank's needs (schema/wire.fbs, LoadNeeds). Decoding
// verifies the buffer; the caller checks indices and boxes against the
// checkpoint it opened.
// `indices`: each need's index in the rank's whole list, when only some are
// sent (routed to a scheduler); empty when all are, in order.
std::string encode_needs(int rank, const std::vector<PieceNeed>& needs, const std::vector<uint32_t>& indices = {});
std::vector<PieceNeed> decode_needs(std::string_view bytes, const std::string& origin,
                                    std::vector<uint32_t>* indices = nullptr);

}  // namespace distckpt::plan
