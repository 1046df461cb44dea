#include "plan/load_share.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "plan/wire.h"

namespace distckpt::plan {
namespace {

constexpr const char* kWhat = "load share";

// Position of needers[n] among the reader's others (the needers but the reader).
uint32_t other_index(uint32_t n, uint32_t reader) { return n < reader ? n : n - 1; }

std::vector<const Box*> pointers(const std::vector<Box>& boxes) {
  std::vector<const Box*> out;
  for (const Box& b : boxes) out.push_back(&b);
  return out;
}

// The transfers a rank's piece implies, in order (their keys travel apart).
std::vector<ShareTransfer> implied_transfers(const SharePiece& p, uint32_t piece, int me,
                                             const std::vector<Box>& my_parts) {
  std::vector<ShareTransfer> out;
  if (p.same_host) return out;
  // Whose parts travel: every other needer's from the reader, this rank's to it.
  std::vector<std::vector<const Box*>> receivers;
  if (p.reader == me) {
    for (const ShareNeeder& o : p.others) receivers.push_back(pointers(o.parts));
  } else {
    receivers.push_back(pointers(my_parts));
  }
  for (uint32_t i = 0; i < p.slabs.size(); ++i) {
    if (p.reader == me) out.push_back(ShareTransfer{piece, i, -1, me, me, 0, 0, 0});
    for (size_t o = 0; o < receivers.size(); ++o) {
      const uint64_t bytes = bytes_in_slab(receivers[o], p.slabs[i], p.geometry.element_size);
      if (bytes == 0) continue;
      out.push_back(p.reader == me ? ShareTransfer{piece, i, static_cast<int32_t>(o), me, p.others[o].rank, bytes, 0, 0}
                                   : ShareTransfer{piece, i, -1, p.reader, me, bytes, 0, 0});
    }
  }
  return out;
}

std::vector<Box> slabs_from_rows(const Box& piece, const std::vector<int64_t>& rows, const std::string& origin) {
  if (rows.size() % 2 != 0 || rows.empty()) malformed(kWhat, origin, "slab rows do not come in pairs");
  if (piece.ndim() == 0) {
    if (rows.size() != 2 || rows[0] != 0 || rows[1] != 1) malformed(kWhat, origin, "a 0-d piece has one slab");
    return {piece};
  }
  std::vector<Box> slabs;
  int64_t next = rows[0];
  if (next < piece.offset[0]) malformed(kWhat, origin, "a slab before its piece");
  for (size_t i = 0; i < rows.size(); i += 2) {
    const int64_t first = rows[i], count = rows[i + 1];
    if (first != next || count <= 0 || count > piece.offset[0] + piece.length[0] - first) {
      malformed(kWhat, origin, "slabs that are not consecutive rows of their piece");
    }
    Box b = piece;
    b.offset[0] = first;
    b.length[0] = count;
    slabs.push_back(std::move(b));
    next = first + count;
  }
  return slabs;
}

}  // namespace

std::vector<LoadShare> shares_of(const LoadSchedule& schedule, const std::vector<std::vector<PieceNeed>>& needs,
                                 const std::vector<int>& ranks, const std::vector<TransferKey>& keys, int only) {
  const auto made = [only](int dense) { return only < 0 || dense == only; };
  std::vector<LoadShare> out(needs.size());
  for (size_t i = 0; i < needs.size(); ++i) {
    if (made(static_cast<int>(i))) out[i].slot.assign(needs[i].size(), -1);
  }
  std::vector<std::vector<uint32_t>> index(schedule.shared.size());  // per piece and needer: its place in the share
  for (size_t k = 0; k < schedule.shared.size(); ++k) {
    const SharedPiece& s = schedule.shared[k];
    for (const SharedPiece::Needer& n : s.needers) {
      if (!made(n.rank)) {
        index[k].push_back(0);  // never read: that needer's share is not made
        continue;
      }
      LoadShare& share = out[static_cast<size_t>(n.rank)];
      SharePiece p{s.tensor,    s.piece, s.geometry, ranks[static_cast<size_t>(s.reader)],
                   s.same_host, s.slabs, n.needs,    {}};
      if (n.rank == s.reader) {
        for (const SharedPiece::Needer& m : s.needers) {
          if (m.rank == s.reader) continue;
          ShareNeeder other{ranks[static_cast<size_t>(m.rank)], {}};
          for (uint32_t need : m.needs) other.parts.push_back(needs[static_cast<size_t>(m.rank)][need].part);
          p.others.push_back(std::move(other));
        }
      }
      const auto at = static_cast<uint32_t>(share.pieces.size());
      for (uint32_t need : n.needs) share.slot[need] = static_cast<int32_t>(at);
      index[k].push_back(at);
      share.pieces.push_back(std::move(p));
    }
  }
  const std::vector<SlabTransfer> transfers = slab_transfers(schedule, needs);
  if (keys.size() != transfers.size()) {
    throw UsageError(fmt::format("{} transfer keys for {} transfers", keys.size(), transfers.size()));
  }
  for (size_t k = 0; k < transfers.size(); ++k) {
    const SlabTransfer& t = transfers[k];
    const SharedPiece& s = schedule.shared[t.shared];
    uint32_t reader = 0;
    while (s.needers[reader].rank != s.reader) ++reader;
    const int dense_to = s.needers[t.needer].rank;
    const int from = ranks[static_cast<size_t>(s.reader)], to = ranks[static_cast<size_t>(dense_to)];
    const int32_t other = t.needer == reader ? -1 : static_cast<int32_t>(other_index(t.needer, reader));
    if (made(s.reader)) {
      out[static_cast<size_t>(s.reader)].transfers.push_back(
          ShareTransfer{index[t.shared][reader], t.slab, other, from, to, t.bytes, keys[k].window, keys[k].tag});
    }
    if (t.needer != reader && made(dense_to)) {
      out[static_cast<size_t>(dense_to)].transfers.push_back(
          ShareTransfer{index[t.shared][t.needer], t.slab, -1, from, to, t.bytes, keys[k].window, keys[k].tag});
    }
  }
  for (LoadShare& share : out) sort_transfers(share);
  return out;
}

void sort_transfers(LoadShare& share) {
  std::stable_sort(share.transfers.begin(), share.transfers.end(), [](const ShareTransfer& a, const ShareTransfer& b) {
    return std::tie(a.window, a.tag) < std::tie(b.window, b.tag);
  });
}

std::string encode_share_message(uint32_t rounds, const std::vector<const LoadShare*>& shares,
                                 const std::vector<uint32_t>& host_rounds) {
  flatbuffers::FlatBufferBuilder b(256);
  std::vector<flatbuffers::Offset<fb::SharedPieceShare>> pieces;
  for (uint32_t round = 0; round < shares.size(); ++round) {
    const LoadShare* share = shares[round];
    if (!share) continue;
    std::vector<std::vector<const ShareTransfer*>> of_piece(share->pieces.size());
    for (const ShareTransfer& t : share->transfers) of_piece[t.piece].push_back(&t);
    for (size_t k = 0; k < share->pieces.size(); ++k) {
      const SharePiece& p = share->pieces[k];
      // In implied order: by slab, the reader's own parts first, then by receiver.
      std::vector<const ShareTransfer*>& ts = of_piece[k];
      std::stable_sort(ts.begin(), ts.end(), [](const ShareTransfer* x, const ShareTransfer* y) {
        return std::make_tuple(x->slab, x->other) < std::make_tuple(y->slab, y->other);
      });
      std::vector<int64_t> rows, offsets, lengths;
      for (const Box& s : p.slabs) {
        rows.push_back(s.ndim() == 0 ? 0 : s.offset[0]);
        rows.push_back(s.ndim() == 0 ? 1 : s.length[0]);
      }
      std::vector<int> others;
      std::vector<uint32_t> counts;
      for (const ShareNeeder& o : p.others) {
        others.push_back(o.rank);
        counts.push_back(static_cast<uint32_t>(o.parts.size()));
        for (const Box& part : o.parts) {
          offsets.insert(offsets.end(), part.offset.begin(), part.offset.end());
          lengths.insert(lengths.end(), part.length.begin(), part.length.end());
        }
      }
      std::vector<uint64_t> windows;
      std::vector<uint32_t> tags;
      for (const ShareTransfer* t : ts) {
        windows.push_back(t->window);
        tags.push_back(t->tag);
      }
      pieces.push_back(fb::CreateSharedPieceShare(
          b, round, p.tensor, p.piece, p.reader, p.same_host, b.CreateVector(rows), b.CreateVector(p.own_needs),
          b.CreateVector(others), b.CreateVector(counts), b.CreateVector(offsets), b.CreateVector(lengths),
          b.CreateVector(windows), b.CreateVector(tags)));
    }
  }
  b.Finish(fb::CreateLoadShareMessage(b, rounds, b.CreateVector(pieces), b.CreateVector(host_rounds)));
  return message_bytes(b);
}

ShareHeader decode_share_header(std::string_view bytes, const std::string& origin) {
  const auto& m = verified_message<fb::LoadShareMessage>(bytes, kWhat, origin);
  ShareHeader h{m.rounds(), scalars(m.host_rounds(), kWhat, origin)};
  for (const uint32_t r : h.host_rounds) {
    if (r >= h.rounds) malformed(kWhat, origin, fmt::format("host round {} of {}", r, h.rounds));
  }
  return h;
}

uint32_t merge_share_message(std::string_view bytes, const std::string& origin, int me, int world,
                             const PieceLookup& lookup, const std::vector<std::vector<PieceNeed>>& my_needs,
                             std::vector<LoadShare>& shares) {
  const auto& m = verified_message<fb::LoadShareMessage>(bytes, kWhat, origin);
  if (!m.pieces()) return m.rounds();
  std::set<std::tuple<uint32_t, uint32_t, uint32_t>> seen;  // (round, tensor, piece): each once
  for (const fb::SharedPieceShare* x : *m.pieces()) {
    if (x->round() >= m.rounds() || x->round() >= shares.size() || x->round() >= my_needs.size()) {
      malformed(kWhat, origin, fmt::format("a piece of staging round {} of {}", x->round(), m.rounds()));
    }
    if (!seen.emplace(x->round(), x->tensor(), x->piece()).second) malformed(kWhat, origin, "a piece sent twice");
    LoadShare& share = shares[x->round()];
    const std::vector<PieceNeed>& needs = my_needs[x->round()];
    SharePiece p;
    p.tensor = x->tensor();
    p.piece = x->piece();
    p.geometry = lookup(p.tensor, p.piece);
    p.reader = x->reader();
    p.same_host = x->same_host();
    if (p.reader < 0 || p.reader >= world) malformed(kWhat, origin, fmt::format("reader {}", p.reader));
    p.slabs = slabs_from_rows(p.geometry.box, scalars(x->slab_rows(), kWhat, origin), origin);
    p.own_needs = scalars(x->own_needs(), kWhat, origin);
    // Only a holder of a live piece may take part without needs of its own: it reads for the others.
    const bool holds = std::binary_search(p.geometry.holders.begin(), p.geometry.holders.end(), me);
    if (p.own_needs.empty() && (p.reader != me || !holds)) {
      malformed(kWhat, origin, "a piece that serves none of the rank's needs");
    }
    const auto at = static_cast<uint32_t>(share.pieces.size());
    std::vector<Box> my_parts;
    for (uint32_t need : p.own_needs) {
      if (need >= needs.size() || needs[need].tensor != p.tensor || needs[need].piece != p.piece ||
          share.slot[need] != -1) {
        malformed(kWhat, origin, fmt::format("need {} is not one of the rank's needs of that piece", need));
      }
      share.slot[need] = static_cast<int32_t>(at);
      my_parts.push_back(needs[need].part);
    }
    const std::vector<int> others = scalars(x->others(), kWhat, origin);
    const std::vector<uint32_t> counts = scalars(x->part_counts(), kWhat, origin);
    const std::vector<int64_t> offsets = scalars(x->part_offsets(), kWhat, origin);
    const std::vector<int64_t> lengths = scalars(x->part_lengths(), kWhat, origin);
    if (counts.size() != others.size() || offsets.size() != lengths.size() || (p.reader != me && !others.empty())) {
      malformed(kWhat, origin, "other needers that do not match their parts");
    }
    const size_t nd = p.geometry.box.ndim();
    size_t next = 0, zero_d_parts = 0;
    for (size_t o = 0; o < others.size(); ++o) {
      if (others[o] < 0 || others[o] >= world || others[o] == me || (o > 0 && others[o] <= others[o - 1])) {
        malformed(kWhat, origin, fmt::format("other needer {}", others[o]));
      }
      ShareNeeder needer{others[o], {}};
      // Counts are checked against what the boxes can hold before any is made
      // (0-d parts take no room: all of them together, against the message).
      const size_t room = nd == 0 ? bytes.size() - zero_d_parts : (offsets.size() - next) / nd;
      if (counts[o] == 0 || counts[o] > room) malformed(kWhat, origin, "a needer's parts overrun the boxes sent");
      if (nd == 0) zero_d_parts += counts[o];
      for (uint32_t c = 0; c < counts[o]; ++c) {
        Box part{
            Shape(offsets.begin() + static_cast<ptrdiff_t>(next), offsets.begin() + static_cast<ptrdiff_t>(next + nd)),
            Shape(lengths.begin() + static_cast<ptrdiff_t>(next), lengths.begin() + static_cast<ptrdiff_t>(next + nd))};
        if (!contains(p.geometry.box, part)) malformed(kWhat, origin, "a needer's part outside its piece");
        needer.parts.push_back(std::move(part));
        next += nd;
      }
      p.others.push_back(std::move(needer));
    }
    if (next != offsets.size()) malformed(kWhat, origin, "boxes left over after the needers' parts");
    // The slabs span every row of the parts they serve.
    Box span = p.slabs.front();  // slabs are consecutive whole rows of the piece
    if (span.ndim() > 0) span.length[0] = p.slabs.back().offset[0] + p.slabs.back().length[0] - span.offset[0];
    const auto spanned = [&](const Box& part) { return contains(span, part); };
    bool covered = std::all_of(my_parts.begin(), my_parts.end(), spanned);
    for (const ShareNeeder& o : p.others) covered = covered && std::all_of(o.parts.begin(), o.parts.end(), spanned);
    if (!covered) malformed(kWhat, origin, "slabs that miss rows of the parts they serve");
    std::vector<ShareTransfer> transfers = implied_transfers(p, at, me, my_parts);
    const std::vector<uint64_t> windows = scalars(x->windows(), kWhat, origin);
    const std::vector<uint32_t> tags = scalars(x->tags(), kWhat, origin);
    if (windows.size() != transfers.size() || tags.size() != transfers.size()) {
      malformed(kWhat, origin, fmt::format("{} transfer keys for {} transfers", windows.size(), transfers.size()));
    }
    for (size_t k = 0; k < transfers.size(); ++k) {
      transfers[k].window = windows[k];
      transfers[k].tag = tags[k];
      share.transfers.push_back(transfers[k]);
    }
    share.pieces.push_back(std::move(p));
  }
  return m.rounds();
}

}  // namespace distckpt::plan
