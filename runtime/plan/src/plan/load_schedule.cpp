#include "plan/load_schedule.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "plan/balance.h"
#include "plan/wire.h"

namespace distckpt::plan {
namespace {

struct NeedRef {
  uint32_t tensor, piece;
  int rank;
  uint32_t index;
};

uint64_t row_bytes(const Box& piece, uint64_t element_size) {
  uint64_t n = element_size;
  for (size_t d = 1; d < piece.ndim(); ++d) n *= static_cast<uint64_t>(piece.length[d]);
  return n;
}

uint64_t span_bytes(const PieceGeometry& g, std::pair<int64_t, int64_t> rows) {
  return static_cast<uint64_t>(rows.second - rows.first) * row_bytes(g.box, g.element_size);
}

}  // namespace

std::pair<int64_t, int64_t> row_span(const Box& piece, const std::vector<const Box*>& parts) {
  if (piece.ndim() == 0) return {0, 1};
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const Box* p : parts) {
    lo = std::min(lo, p->offset[0]);
    hi = std::max(hi, p->offset[0] + p->length[0]);
  }
  return {lo - piece.offset[0], hi - piece.offset[0]};
}

std::vector<Box> cut_slabs(const Box& piece, int64_t first_row, int64_t last_row, uint64_t element_size,
                           uint64_t slab_bytes) {
  if (piece.ndim() == 0) return {piece};
  const uint64_t row = std::max<uint64_t>(1, row_bytes(piece, element_size));
  const auto rows = static_cast<int64_t>(std::max<uint64_t>(1, slab_bytes / row));
  std::vector<Box> slabs;
  for (int64_t r = first_row; r < last_row; r += rows) {
    Box b = piece;
    b.offset[0] += r;
    b.length[0] = std::min(rows, last_row - r);
    slabs.push_back(std::move(b));
  }
  return slabs;
}

uint64_t bytes_in_slab(const std::vector<const Box*>& parts, const Box& slab, uint64_t element_size) {
  uint64_t bytes = 0;
  for (const Box* part : parts) {
    if (const auto cut = intersect(*part, slab)) bytes += static_cast<uint64_t>(cut->numel()) * element_size;
  }
  return bytes;
}

uint64_t SharedPiece::message_bytes(const std::vector<std::vector<PieceNeed>>& needs, const Needer& needer,
                                    size_t slab) const {
  std::vector<const Box*> parts;
  for (uint32_t i : needer.needs) parts.push_back(&needs[static_cast<size_t>(needer.rank)][i].part);
  return bytes_in_slab(parts, slabs[slab], geometry.element_size);
}

uint64_t SharedPiece::read_bytes() const {
  uint64_t bytes = 0;
  for (const Box& s : slabs) bytes += static_cast<uint64_t>(s.numel()) * geometry.element_size;
  return bytes;
}

LoadSchedule make_load_schedule(const std::vector<std::vector<PieceNeed>>& needs, const PieceLookup& lookup,
                                uint64_t slab_bytes, bool share, const std::vector<int>& host_of_rank,
                                size_t tie_start) {
  if (!host_of_rank.empty() && host_of_rank.size() != needs.size()) {
    throw UsageError(fmt::format("{} host numbers for {} ranks", host_of_rank.size(), needs.size()));
  }
  LoadSchedule schedule;
  const size_t world = needs.size();
  schedule.read_bytes.assign(world, 0);
  schedule.shared_slot.resize(world);
  std::vector<NeedRef> refs;
  for (size_t r = 0; r < world; ++r) {
    schedule.shared_slot[r].assign(needs[r].size(), -1);
    for (uint32_t i = 0; i < needs[r].size(); ++i) {
      refs.push_back(NeedRef{needs[r][i].tensor, needs[r][i].piece, static_cast<int>(r), i});
    }
  }
  std::sort(refs.begin(), refs.end(), [](const NeedRef& a, const NeedRef& b) {
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    if (a.piece != b.piece) return a.piece < b.piece;
    return a.rank != b.rank ? a.rank < b.rank : a.index < b.index;
  });

  std::vector<uint64_t> shared_bytes;
  for (size_t i = 0; i < refs.size();) {
    size_t j = i;
    while (j < refs.size() && refs[j].tensor == refs[i].tensor && refs[j].piece == refs[i].piece) ++j;
    const PieceGeometry g = lookup(refs[i].tensor, refs[i].piece);
    const bool one_rank = refs[i].rank == refs[j - 1].rank;
    for (const int h : g.holders) {
      if (h < 0 || static_cast<size_t>(h) >= world) {
        throw UsageError(
            fmt::format("holder {} of a piece of tensor {} is not one of the {} ranks", h, refs[i].tensor, world));
      }
    }
    // Each rank reads the rows its own parts of refs[from, to) span.
    const auto read_privately = [&](size_t from, size_t to) {
      for (size_t k = from; k < to;) {
        size_t m = k;
        std::vector<const Box*> parts;
        for (; m < to && refs[m].rank == refs[k].rank; ++m)
          parts.push_back(&needs[static_cast<size_t>(refs[m].rank)][refs[m].index].part);
        schedule.read_bytes[static_cast<size_t>(refs[k].rank)] += span_bytes(g, row_span(g.box, parts));
        k = m;
      }
    };
    if (!g.holders.empty()) {
      // Needers that hold the piece take their parts from their own copy; a holder sends the others theirs.
      const auto first_other = std::stable_partition(
          refs.begin() + static_cast<ptrdiff_t>(i), refs.begin() + static_cast<ptrdiff_t>(j),
          [&](const NeedRef& r) { return std::binary_search(g.holders.begin(), g.holders.end(), r.rank); });
      const auto others = static_cast<size_t>(first_other - refs.begin());
      read_privately(i, others);
      if (others == j) {
        i = j;
        continue;
      }
      i = others;
    } else if (!share || one_rank) {
      read_privately(i, j);
      i = j;
      continue;
    }
    SharedPiece shared;
    shared.tensor = refs[i].tensor;
    shared.piece = refs[i].piece;
    shared.geometry = g;
    std::vector<const Box*> parts;
    for (size_t k = i; k < j; ++k) {
      if (shared.needers.empty() || shared.needers.back().rank != refs[k].rank)
        shared.needers.push_back({refs[k].rank, {}});
      shared.needers.back().needs.push_back(refs[k].index);
      parts.push_back(&needs[static_cast<size_t>(refs[k].rank)][refs[k].index].part);
      schedule.shared_slot[static_cast<size_t>(refs[k].rank)][refs[k].index] =
          static_cast<int32_t>(schedule.shared.size());
    }
    const auto rows = row_span(g.box, parts);
    shared.slabs = cut_slabs(g.box, rows.first, rows.second, g.element_size, slab_bytes);
    shared_bytes.push_back(span_bytes(g, rows));
    schedule.shared.push_back(std::move(shared));
    i = j;
  }

  // Readers: balanced over the needers of each piece (plan/balance.h), or
  // over its holders when only they can read it.
  std::vector<BalanceItem> items(schedule.shared.size());
  for (size_t k = 0; k < items.size(); ++k) {
    const SharedPiece& s = schedule.shared[k];
    items[k].bytes = shared_bytes[k];
    if (!s.geometry.holders.empty()) {
      items[k].candidates = s.geometry.holders;
      continue;
    }
    for (const SharedPiece::Needer& n : s.needers) items[k].candidates.push_back(n.rank);
  }
  Balance balance = balance_least_loaded(items, std::move(schedule.read_bytes), tie_start);
  for (size_t k = 0; k < items.size(); ++k) {
    SharedPiece& s = schedule.shared[k];
    s.reader = balance.choice[k];
    // A holder that needs none of the piece reads it for the others: a needer without needs.
    const auto at = std::lower_bound(s.needers.begin(), s.needers.end(), s.reader,
                                     [](const SharedPiece::Needer& n, int rank) { return n.rank < rank; });
    if (at == s.needers.end() || at->rank != s.reader) s.needers.insert(at, SharedPiece::Needer{s.reader, {}});
    s.same_host = !host_of_rank.empty();
    for (const SharedPiece::Needer& n : s.needers) {
      if (host_of_rank.empty() ||
          host_of_rank[static_cast<size_t>(n.rank)] != host_of_rank[static_cast<size_t>(s.needers[0].rank)])
        s.same_host = false;
    }
  }
  schedule.read_bytes = std::move(balance.load);
  return schedule;
}

std::vector<SlabTransfer> slab_transfers(const LoadSchedule& schedule,
                                         const std::vector<std::vector<PieceNeed>>& needs) {
  std::vector<SlabTransfer> transfers;
  for (size_t k = 0; k < schedule.shared.size(); ++k) {
    const SharedPiece& s = schedule.shared[k];
    if (s.same_host) continue;  // load/host_exchange.h
    uint32_t reader = 0;
    while (s.needers[reader].rank != s.reader) ++reader;
    for (size_t i = 0; i < s.slabs.size(); ++i) {
      transfers.push_back(SlabTransfer{static_cast<uint32_t>(k), static_cast<uint32_t>(i), reader, 0});
      for (size_t n = 0; n < s.needers.size(); ++n) {
        if (n == reader) continue;
        const uint64_t bytes = s.message_bytes(needs, s.needers[n], i);
        if (bytes > 0) {
          transfers.push_back(
              SlabTransfer{static_cast<uint32_t>(k), static_cast<uint32_t>(i), static_cast<uint32_t>(n), bytes});
        }
      }
    }
  }
  return transfers;
}

std::string encode_needs(int rank, const std::vector<PieceNeed>& needs, const std::vector<uint32_t>& indices) {
  flatbuffers::FlatBufferBuilder b(256 + 64 * needs.size());
  std::vector<flatbuffers::Offset<fb::PieceNeed>> out;
  out.reserve(needs.size());
  for (const PieceNeed& n : needs) {
    out.push_back(
        fb::CreatePieceNeed(b, n.tensor, n.piece, b.CreateVector(n.part.offset), b.CreateVector(n.part.length)));
  }
  b.Finish(fb::CreateLoadNeeds(b, rank, b.CreateVector(out), indices.empty() ? 0 : b.CreateVector(indices)));
  return message_bytes(b);
}

std::vector<PieceNeed> decode_needs(std::string_view bytes, const std::string& origin, std::vector<uint32_t>* indices) {
  std::vector<PieceNeed> needs;
  const auto* root = &verified_message<fb::LoadNeeds>(bytes, "load needs", origin);
  if (indices) {
    *indices = scalars(root->indices(), "load needs", origin);
    const size_t count = root->needs() ? root->needs()->size() : 0;
    if (indices->empty()) {
      for (uint32_t i = 0; i < count; ++i) indices->push_back(i);
    } else if (indices->size() != count) {
      malformed("load needs", origin, fmt::format("{} indices for {} needs", indices->size(), count));
    }
  }
  if (!root->needs()) return needs;
  needs.reserve(root->needs()->size());
  for (const fb::PieceNeed* n : *root->needs()) {
    PieceNeed need{n->tensor(), n->piece(),
                   Box{scalars(n->offset(), "load needs", origin), scalars(n->length(), "load needs", origin)}};
    if (need.part.offset.size() != need.part.length.size()) {
      malformed("load needs", origin, "a part has offsets and lengths of different ranks");
    }
    needs.push_back(std::move(need));
  }
  return needs;
}

}  // namespace distckpt::plan
