#include "load/read_planning.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "comm/exchange.h"
#include "distckpt/core/errors.h"
#include "load/exchange.h"
#include "plan/messages.h"
#include "plan/wire.h"

namespace distckpt::loading {
namespace {

std::vector<plan::PieceNeed> needs_of(const std::vector<TensorRead>& reads) {
  std::vector<plan::PieceNeed> needs;
  needs.reserve(reads.size());
  for (const TensorRead& r : reads) needs.push_back(r.need);
  return needs;
}

// What the exchange moves for a slab transfer: the elements and a status word.
uint64_t moved_bytes(const plan::SlabTransfer& t, int from, int to) {
  return from == to ? 0 : t.bytes + kSlabStatusBytes;
}

// Window keys and tags of a schedule's transfers (`ranks[i]`: the rank of
// needs[i]), cut as `mode` cuts them; `scheduler` leads the keys so that
// different schedulers' windows never mix.
std::vector<plan::TransferKey> cut_keys(const plan::LoadSchedule& schedule,
                                        const std::vector<std::vector<plan::PieceNeed>>& needs, size_t world,
                                        comm::ExchangeMode mode, uint64_t batch_bytes, uint64_t scheduler,
                                        uint64_t& count) {
  std::vector<comm::Transfer> transfers;
  for (const plan::SlabTransfer& t : plan::slab_transfers(schedule, needs)) {
    const plan::SharedPiece& s = schedule.shared[t.shared];
    const int to = s.needers[t.needer].rank;
    transfers.push_back(comm::Transfer{s.reader, to, moved_bytes(t, s.reader, to)});
  }
  std::vector<plan::TransferKey> keys;
  keys.reserve(transfers.size());
  for (const comm::KeyedTransfer& k : comm::cut_windows(transfers, world, mode, batch_bytes, &count)) {
    keys.push_back(plan::TransferKey{scheduler << 32 | k.window, k.tag});
  }
  return keys;
}

// A scheduler's staging round: the ranks that routed needs here (ascending),
// their needs, indices and hosts.
struct Senders {
  std::vector<int> ranks;
  std::vector<std::vector<plan::PieceNeed>> needs;
  std::vector<std::vector<uint32_t>> indices;
  std::vector<int> hosts;
};

// Pieces only their holders can read (a live transfer's): every holder of
// a piece routed here joins the round without needs (on its host), so that
// the schedule can choose it to read.
void take_in_holders(const PieceCatalog& catalog, Senders& s, const std::vector<int>& host_of_rank) {
  std::vector<int> holders;
  for (const std::vector<plan::PieceNeed>& needs : s.needs) {
    for (const plan::PieceNeed& n : needs) {
      const plan::PieceGeometry g = catalog.lookup(n.tensor, n.piece);
      holders.insert(holders.end(), g.holders.begin(), g.holders.end());
    }
  }
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  Senders merged;
  size_t i = 0;
  const auto take = [&](size_t from) {
    merged.ranks.push_back(s.ranks[from]);
    merged.needs.push_back(std::move(s.needs[from]));
    merged.indices.push_back(std::move(s.indices[from]));
    merged.hosts.push_back(s.hosts[from]);
  };
  for (const int h : holders) {
    for (; i < s.ranks.size() && s.ranks[i] < h; ++i) take(i);
    if (i < s.ranks.size() && s.ranks[i] == h) continue;
    merged.ranks.push_back(h);
    merged.needs.emplace_back();
    merged.indices.emplace_back();
    merged.hosts.push_back(host_of_rank.at(static_cast<size_t>(h)));
  }
  for (; i < s.ranks.size(); ++i) take(i);
  s = std::move(merged);
}

// `lookup` with each piece's holders numbered as the schedule numbers its
// ranks: their places in `ranks` (every holder is there: take_in_holders).
plan::PieceLookup dense_holders(const plan::PieceLookup& lookup, const std::vector<int>& ranks) {
  return [&lookup, &ranks](uint32_t tensor, uint32_t piece) {
    plan::PieceGeometry g = lookup(tensor, piece);
    for (int& h : g.holders) h = static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), h) - ranks.begin());
    return g;
  };
}

}  // namespace

PieceCatalog catalog_of(CheckpointReader& reader) {
  PieceCatalog c;
  c.lookup = [&reader](uint32_t tensor, uint32_t piece) {
    if (tensor >= reader.tensor_count() || piece >= reader.index_for(reader.tensor_at(tensor)).pieces().size()) {
      throw ProtocolError(
          fmt::format("a peer named piece {} of tensor {}, which the checkpoint does not hold: a bug, "
                      "or ranks loading different checkpoints",
                      piece, tensor));
    }
    const TensorRecord& record = reader.tensor_at(tensor);
    const plan::StoredPiece& stored = reader.index_for(record).pieces()[piece];
    return plan::PieceGeometry{stored.box, record.element_size(), reader.chunk_holders(tensor, stored.chunk)};
  };
  c.check = [&reader](const std::vector<plan::PieceNeed>& needs, int rank) {
    for (const plan::PieceNeed& n : needs) {
      const bool tensor_ok = n.tensor < reader.tensor_count();
      const auto* pieces = tensor_ok ? &reader.index_for(reader.tensor_at(n.tensor)).pieces() : nullptr;
      if (!tensor_ok || n.piece >= pieces->size() || n.part.ndim() != (*pieces)[n.piece].box.ndim() ||
          !contains((*pieces)[n.piece].box, n.part)) {
        throw UsageError(
            fmt::format("rank {} asked for a part ({}) that is not in the checkpoint it should share with this "
                        "rank; every rank must load the same checkpoint",
                        rank, to_string(n.part)));
      }
    }
  };
  c.has_holders = reader.has_chunk_holders();
  return c;
}

bool shares_reads(const ReadEngineOptions& options, const Communicator& comm) {
  return options.exchange != LoadExchange::kNone && comm.size() > 1;
}

bool partitioned_reads(const ReadEngineOptions& options) { return options.exchange != LoadExchange::kAllGather; }

int scheduler_of(uint32_t tensor, uint32_t piece, int world) {
  uint64_t x = (uint64_t{tensor} << 32 | piece) + 0x9e3779b97f4a7c15ull;  // splitmix64
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<int>(x % static_cast<uint64_t>(world));
}

std::string whole_read_plan(const std::vector<std::vector<TensorRead>>& rounds, int rank, uint64_t batch_bytes) {
  std::vector<std::string> round_needs;
  for (const std::vector<TensorRead>& reads : rounds) round_needs.push_back(plan::encode_needs(rank, needs_of(reads)));
  return plan::encode_read_plan("", round_needs, batch_bytes);
}

std::vector<std::string> route_read_plan(const std::vector<std::vector<TensorRead>>& rounds, int rank, int world,
                                         const std::string& host) {
  // Per scheduler with needs here, and round: the needs routed there and their indices.
  struct Routed {
    std::vector<std::vector<plan::PieceNeed>> needs;
    std::vector<std::vector<uint32_t>> indices;
  };
  std::map<int, Routed> routed;
  for (size_t k = 0; k < rounds.size(); ++k) {
    for (uint32_t i = 0; i < rounds[k].size(); ++i) {
      const plan::PieceNeed& need = rounds[k][i].need;
      Routed& r = routed[scheduler_of(need.tensor, need.piece, world)];
      r.needs.resize(rounds.size());
      r.indices.resize(rounds.size());
      r.needs[k].push_back(need);
      r.indices[k].push_back(i);
    }
  }
  // Never empty: every part carries the round count and the host (a scheduler
  // may choose any holder of a live piece to read it: transfer/live_sources.h).
  std::vector<std::string> parts(static_cast<size_t>(world),
                                 plan::encode_read_plan(host, std::vector<std::string>(rounds.size())));
  for (const auto& [s, r] : routed) {
    std::vector<std::string> round_needs;
    for (size_t k = 0; k < rounds.size(); ++k) {
      round_needs.push_back(r.needs[k].empty() ? std::string() : plan::encode_needs(rank, r.needs[k], r.indices[k]));
    }
    parts[static_cast<size_t>(s)] = plan::encode_read_plan(host, round_needs);
  }
  return parts;
}

std::vector<std::string> schedule_routed_needs(const PieceCatalog& catalog, const std::vector<std::string>& routed,
                                               const ReadEngineOptions& options, int me) {
  const size_t world = routed.size();
  size_t rounds = 0;
  std::vector<Senders> by_round;
  std::map<std::string, int> host_ids;
  std::vector<int> host_of_rank(world);
  for (size_t r = 0; r < world; ++r) {
    const std::string origin = fmt::format("rank {}", r);
    if (routed[r].empty()) throw ProtocolError(fmt::format("{} routed no read plan to rank {}", origin, me));
    const plan::ReadPlanMessage m = plan::decode_read_plan(routed[r], origin);
    rounds = std::max(rounds, m.rounds.size());
    if (by_round.size() < rounds) by_round.resize(rounds);
    const int host = host_ids.emplace(m.host, static_cast<int>(host_ids.size())).first->second;
    host_of_rank[r] = host;
    for (size_t k = 0; k < m.rounds.size(); ++k) {
      if (m.rounds[k].empty()) continue;
      std::vector<uint32_t> indices;
      std::vector<plan::PieceNeed> needs = plan::decode_needs(std::string(m.rounds[k]), origin, &indices);
      catalog.check(needs, static_cast<int>(r));
      for (const plan::PieceNeed& n : needs) {
        if (scheduler_of(n.tensor, n.piece, static_cast<int>(world)) != me) {
          throw ProtocolError(fmt::format("{} routed a need of piece {} of tensor {} to rank {}, not its scheduler",
                                          origin, n.piece, n.tensor, me));
        }
      }
      Senders& s = by_round[k];
      s.ranks.push_back(static_cast<int>(r));
      s.needs.push_back(std::move(needs));
      s.indices.push_back(std::move(indices));
      s.hosts.push_back(host);
    }
  }
  rounds = std::max<size_t>(rounds, 1);  // a load runs at least one staging round
  by_round.resize(rounds);
  if (catalog.has_holders) {
    for (Senders& s : by_round) take_in_holders(catalog, s, host_of_rank);
  }
  std::map<int, std::vector<plan::LoadShare>> shares;  // of the ranks that routed needs here, per round
  std::vector<uint32_t> host_rounds;
  for (size_t k = 0; k < rounds; ++k) {
    Senders& s = by_round[k];
    const plan::PieceLookup lookup = dense_holders(catalog.lookup, s.ranks);
    const std::vector<int> no_hosts;
    // Ties go first to the senders at or after this scheduler's rank, so that
    // schedulers with few pieces each do not all pick the lowest ranks.
    const auto tie_start = static_cast<size_t>(std::lower_bound(s.ranks.begin(), s.ranks.end(), me) - s.ranks.begin());
    const plan::LoadSchedule schedule =
        plan::make_load_schedule(s.needs, lookup, options.slab_bytes, true,
                                 options.exchange == LoadExchange::kAuto ? s.hosts : no_hosts, tie_start);
    uint64_t windows = 0;
    const std::vector<plan::TransferKey> keys =
        cut_keys(schedule, s.needs, s.needs.size(), comm::ExchangeMode::kPointToPoint, options.slab_bytes,
                 static_cast<uint64_t>(me), windows);
    for (const plan::SharedPiece& p : schedule.shared) {
      if (p.same_host) {
        host_rounds.push_back(static_cast<uint32_t>(k));
        break;
      }
    }
    std::vector<plan::LoadShare> dense = plan::shares_of(schedule, s.needs, s.ranks, keys);
    for (size_t i = 0; i < dense.size(); ++i) {
      for (plan::SharePiece& p : dense[i].pieces) {
        for (uint32_t& need : p.own_needs) need = s.indices[i][need];  // the rank's own numbering
      }
      std::vector<plan::LoadShare>& of_rank = shares[s.ranks[i]];
      of_rank.resize(rounds);
      of_rank[k] = std::move(dense[i]);
    }
  }
  // Every rank hears the round count and the host rounds; those with pieces here, their shares.
  std::vector<std::string> parts(world, plan::encode_share_message(static_cast<uint32_t>(rounds), {}, host_rounds));
  for (const auto& [r, of_rank] : shares) {
    std::vector<const plan::LoadShare*> mine;
    for (const plan::LoadShare& share : of_rank) mine.push_back(share.pieces.empty() ? nullptr : &share);
    parts[static_cast<size_t>(r)] = plan::encode_share_message(static_cast<uint32_t>(rounds), mine, host_rounds);
  }
  return parts;
}

size_t merge_shares(const PieceCatalog& catalog, const std::vector<std::string>& messages,
                    const std::vector<std::vector<plan::PieceNeed>>& my_needs, int me,
                    std::vector<plan::LoadShare>& shares, std::vector<bool>& within_host) {
  const int world = static_cast<int>(messages.size());
  // The headers first, checked before anything is sized by them: every
  // scheduler counted every rank's staging rounds, this one's too.
  std::vector<plan::ShareHeader> headers;
  for (size_t s = 0; s < messages.size(); ++s) {
    headers.push_back(plan::decode_share_header(messages[s], fmt::format("rank {}", s)));
    if (headers[s].rounds != headers[0].rounds || headers[s].rounds < std::max<size_t>(my_needs.size(), 1)) {
      throw ProtocolError(fmt::format("rank {} counted {} staging rounds, rank 0 {}, and rank {} runs {}", s,
                                      headers[s].rounds, headers[0].rounds, me, my_needs.size()));
    }
  }
  const size_t rounds = headers.empty() ? 1 : headers[0].rounds;
  within_host.assign(rounds, false);
  for (const plan::ShareHeader& h : headers) {
    for (const uint32_t r : h.host_rounds) within_host[r] = true;
  }
  std::vector<std::vector<plan::PieceNeed>> needs = my_needs;
  needs.resize(rounds);
  shares.assign(rounds, plan::LoadShare{});
  for (size_t k = 0; k < rounds; ++k) shares[k].slot.assign(needs[k].size(), -1);
  std::vector<size_t> pieces_before(rounds), transfers_before(rounds);
  for (size_t s = 0; s < messages.size(); ++s) {
    const std::string origin = fmt::format("rank {}", s);
    for (size_t k = 0; k < rounds; ++k) {
      pieces_before[k] = shares[k].pieces.size();
      transfers_before[k] = shares[k].transfers.size();
    }
    plan::merge_share_message(messages[s], origin, me, world, catalog.lookup, needs, shares);
    // What a scheduler sent is of its own pieces, with windows of its own.
    for (size_t k = 0; k < rounds; ++k) {
      for (size_t i = pieces_before[k]; i < shares[k].pieces.size(); ++i) {
        const plan::SharePiece& p = shares[k].pieces[i];
        if (scheduler_of(p.tensor, p.piece, world) != static_cast<int>(s)) {
          throw ProtocolError(fmt::format("{} sent a share of piece {} of tensor {}, which it does not schedule",
                                          origin, p.piece, p.tensor));
        }
      }
      for (size_t i = transfers_before[k]; i < shares[k].transfers.size(); ++i) {
        if (shares[k].transfers[i].window >> 32 != s) {
          throw ProtocolError(fmt::format("{} sent a transfer in another scheduler's window", origin));
        }
      }
    }
  }
  for (plan::LoadShare& share : shares) plan::sort_transfers(share);
  return rounds;
}

size_t staging_rounds(const std::vector<std::string>& plans, int world) {
  if (plans.size() != static_cast<size_t>(world)) {
    throw ProtocolError(fmt::format("{} read plans for {} ranks", plans.size(), world));
  }
  size_t rounds = 0;
  for (size_t r = 0; r < plans.size(); ++r) {
    rounds = std::max(rounds, plan::decode_read_plan(plans[r], fmt::format("rank {}", r)).rounds.size());
  }
  return rounds;
}

plan::LoadShare share_from_all_plans(const PieceCatalog& catalog, const std::vector<std::string>& plans, size_t round,
                                     const ReadEngineOptions& options, int me, uint64_t& exchange_rounds) {
  const size_t world = plans.size();
  std::vector<std::vector<plan::PieceNeed>> needs(world);
  std::vector<int> ranks(world), hosts;
  std::map<std::string, int> host_ids;
  for (size_t r = 0; r < world; ++r) {
    const std::string origin = fmt::format("rank {}", r);
    const plan::ReadPlanMessage m = plan::decode_read_plan(plans[r], origin);
    if (m.batch_bytes != options.slab_bytes) {
      // Rounds cut with other batches would not meet: every rank sees this and stops alike.
      throw UsageError(fmt::format(
          "LoadExchange::kAllGather cuts its rounds on every rank alike, but rank {} passed exchange_batch_bytes = {} "
          "and rank {} {}: pass the same value on every rank (or use the point-to-point exchange)",
          r, m.batch_bytes, me, options.slab_bytes));
    }
    ranks[r] = static_cast<int>(r);
    hosts.push_back(host_ids.emplace(m.host, static_cast<int>(host_ids.size())).first->second);
    if (round >= m.rounds.size()) continue;
    needs[r] = plan::decode_needs(std::string(m.rounds[round]), origin);  // copied: FlatBuffers wants alignment
    catalog.check(needs[r], static_cast<int>(r));
  }
  // The rounds exchange shares across hosts only (no host is known).
  const plan::LoadSchedule schedule = plan::make_load_schedule(needs, catalog.lookup, options.slab_bytes, true, {});
  const std::vector<plan::TransferKey> keys =
      cut_keys(schedule, needs, world, comm::ExchangeMode::kRounds, options.slab_bytes, 0, exchange_rounds);
  std::vector<plan::LoadShare> all = plan::shares_of(schedule, needs, ranks, keys, me);
  return std::move(all[static_cast<size_t>(me)]);
}

}  // namespace distckpt::loading
