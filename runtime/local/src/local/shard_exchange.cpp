#include "local/shard_exchange.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <unordered_map>

#include "comm/agreement.h"
#include "comm/exchange.h"
#include "distckpt/core/errors.h"
#include "local/messages.h"
#include "plan/balance.h"
#include "plan/partitioned_plan.h"

namespace distckpt::local {
namespace {

// A flat byte view of a contiguous tensor (the payload of a shard).
at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

// Every rank's needs (identity and bytes), by rank.
std::vector<std::vector<ShardNeedMessage>> gather_needs(const std::vector<NeededShard>& needed, Communicator& comm,
                                                        uint64_t batch_bytes) {
  std::vector<ShardNeedMessage> mine;
  mine.reserve(needed.size());
  for (const NeededShard& n : needed) {
    mine.push_back(ShardNeedMessage{n.identity, static_cast<uint64_t>(n.dest.numel()) * n.dest.element_size()});
  }
  const std::vector<std::string> gathered = comm.all_gather_bytes(encode_shard_needs(mine, batch_bytes));
  std::vector<std::vector<ShardNeedMessage>> needs(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    uint64_t batch = 0;
    needs[r] = decode_shard_needs(gathered[r], fmt::format("rank {}", r), &batch);
    if (batch != batch_bytes) {
      // Rounds cut with other batches would not meet: every rank sees this and stops alike.
      throw UsageError(fmt::format(
          "LoadExchange::kAllGather cuts its rounds on every rank alike, but rank {} passed exchange_batch_bytes = {} "
          "and rank {} {}: pass the same value on every rank (or use the point-to-point exchange)",
          r, batch, comm.rank(), batch_bytes));
    }
  }
  return needs;
}

// Offers the wanted shards this rank keeps (`my_kept`: identity -> index
// into kept); returns the ranks keeping each wanted shard, ascending.
std::map<std::string, std::vector<int>> gather_keepers(const std::vector<KeptShard>& kept,
                                                       const std::set<std::string>& wanted, Communicator& comm,
                                                       std::unordered_map<std::string, size_t>& my_kept) {
  std::vector<std::string> offered;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (wanted.count(kept[i].identity) && my_kept.emplace(kept[i].identity, i).second) {
      offered.push_back(kept[i].identity);
    }
  }
  const std::vector<std::string> gathered = comm.all_gather_bytes(encode_shard_offers(offered));
  std::map<std::string, std::vector<int>> keepers;
  for (size_t r = 0; r < gathered.size(); ++r) {
    for (std::string& id : decode_shard_offers(gathered[r], fmt::format("rank {}", r))) {
      keepers[std::move(id)].push_back(static_cast<int>(r));
    }
  }
  return keepers;
}

// Identically on every rank: a needed shard no rank keeps is a ShardingError.
void check_kept(const std::vector<std::vector<ShardNeedMessage>>& needs,
                const std::map<std::string, std::vector<int>>& keepers, const std::vector<NeededShard>& needed) {
  std::vector<std::string> orphans;
  for (size_t r = 0; r < needs.size(); ++r) {
    for (size_t n = 0; n < needs[r].size(); ++n) {
      if (!keepers.count(needs[r][n].identity)) orphans.push_back(fmt::format("rank {} need #{}", r, n));
    }
  }
  if (orphans.empty()) return;
  std::string mine;
  for (const NeededShard& n : needed) {
    if (!keepers.count(n.identity)) mine += (mine.empty() ? "" : "; ") + n.description;
  }
  throw ShardingError(fmt::format(
      "{} shard(s) that ranks need were kept by no rank ({}){}; the tensor-aware state dicts do not come "
      "from one fully parallel save of this job — load the global checkpoint instead",
      orphans.size(), fmt::join(orphans.begin(), orphans.begin() + std::min<size_t>(orphans.size(), 8), ", "),
      mine.empty() ? "" : fmt::format(" [this rank: {}]", mine)));
}

// One transfer per need, in (receiver, need) order; each sent by the keeper
// plan/balance.h picks. need_of[k]: the receiver's need index of transfer k.
struct TransferPlan {
  std::vector<comm::Transfer> transfers;
  std::vector<size_t> need_of;
};

TransferPlan plan_transfers(const std::vector<std::vector<ShardNeedMessage>>& needs,
                            const std::map<std::string, std::vector<int>>& keepers) {
  TransferPlan plan;
  std::vector<plan::BalanceItem> items;
  for (size_t r = 0; r < needs.size(); ++r) {
    for (size_t n = 0; n < needs[r].size(); ++n) {
      items.push_back(plan::BalanceItem{needs[r][n].bytes, keepers.at(needs[r][n].identity)});
      plan.transfers.push_back(comm::Transfer{-1, static_cast<int>(r), needs[r][n].bytes});
      plan.need_of.push_back(n);
    }
  }
  const plan::Balance balance = plan::balance_least_loaded(items, std::vector<uint64_t>(needs.size(), 0));
  for (size_t k = 0; k < plan.transfers.size(); ++k) plan.transfers[k].from = balance.choice[k];
  return plan;
}

// ---- Partitioned (point to point): each identity's scheduler matches its
// needs with its keepers, so no rank holds the world's needs or offers.

uint64_t bytes_of(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

}  // namespace

std::vector<std::string> route_shards(const std::vector<KeptShard>& kept, const std::vector<NeededShard>& needed,
                                      int world, std::map<int, std::vector<size_t>>& routed_kept) {
  std::map<int, ShardRouting> parts;
  for (uint32_t i = 0; i < needed.size(); ++i) {
    ShardRouting& r = parts[plan::planner_of(needed[i].identity, world)];
    r.needs.push_back(ShardNeedMessage{needed[i].identity, bytes_of(needed[i].dest)});
    r.indices.push_back(i);
  }
  std::set<std::string> routed;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (!routed.insert(kept[i].identity).second) continue;  // one offer per identity
    const int s = plan::planner_of(kept[i].identity, world);
    parts[s].kept.push_back(kept[i].identity);
    routed_kept[s].push_back(i);
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (const auto& [s, r] : parts) out[static_cast<size_t>(s)] = encode_shard_routing(r);
  return out;
}

std::vector<std::string> schedule_shard_transfers(const std::vector<std::string>& routed, int me,
                                                  uint64_t batch_bytes) {
  const int world = static_cast<int>(routed.size());
  struct Need {
    int rank;
    uint32_t index;
    uint64_t bytes;
    std::string identity;
  };
  std::vector<Need> needs;
  std::unordered_map<std::string, std::vector<std::pair<int, uint32_t>>> keepers;  // ascending rank
  for (int r = 0; r < world; ++r) {
    if (routed[static_cast<size_t>(r)].empty()) continue;
    const std::string origin = fmt::format("rank {}", r);
    ShardRouting m = decode_shard_routing(routed[static_cast<size_t>(r)], origin);
    const auto check = [&](const std::string& id) {
      if (plan::planner_of(id, world) != me) {
        throw ProtocolError(fmt::format("{} routed shard {} to rank {}, not its scheduler", origin, id, me));
      }
    };
    for (size_t i = 0; i < m.needs.size(); ++i) {
      check(m.needs[i].identity);
      needs.push_back(Need{r, m.indices[i], m.needs[i].bytes, std::move(m.needs[i].identity)});
    }
    for (uint32_t j = 0; j < m.kept.size(); ++j) {
      check(m.kept[j]);
      keepers[m.kept[j]].emplace_back(r, j);
    }
  }
  std::vector<std::string> orphans;
  for (const Need& n : needs) {
    if (!keepers.count(n.identity)) orphans.push_back(fmt::format("rank {} needs {}", n.rank, n.identity));
  }
  if (!orphans.empty()) {
    throw ShardingError(fmt::format(
        "{} shard(s) that ranks need were kept by no rank ({}); the tensor-aware state dicts do not come from one "
        "fully parallel save of this job — load the global checkpoint instead",
        orphans.size(), fmt::join(orphans.begin(), orphans.begin() + std::min<size_t>(orphans.size(), 8), "; ")));
  }
  // Senders balanced among each shard's keepers (ranks numbered densely here).
  std::map<int, size_t> dense;
  for (const auto& [id, ks] : keepers) {
    for (const auto& k : ks) dense.emplace(k.first, 0);
  }
  std::vector<int> ranks;
  for (auto& [rank, d] : dense) {
    d = ranks.size();
    ranks.push_back(rank);
  }
  std::vector<plan::BalanceItem> items;
  for (const Need& n : needs) {
    plan::BalanceItem item{n.bytes, {}};
    for (const auto& k : keepers.at(n.identity)) item.candidates.push_back(static_cast<int>(dense.at(k.first)));
    items.push_back(std::move(item));
  }
  // Ties start at this scheduler's rank, so that schedulers do not all prefer the lowest ranks.
  const auto tie_start = static_cast<size_t>(std::lower_bound(ranks.begin(), ranks.end(), me) - ranks.begin());
  const plan::Balance balance = plan::balance_least_loaded(items, std::vector<uint64_t>(ranks.size(), 0), tie_start);
  std::vector<comm::Transfer> transfers;
  for (size_t k = 0; k < needs.size(); ++k) {
    transfers.push_back(comm::Transfer{ranks[static_cast<size_t>(balance.choice[k])], needs[k].rank, needs[k].bytes});
  }
  std::map<int, ShardTransferList> answers;
  const std::vector<comm::KeyedTransfer> keyed =
      comm::cut_windows(transfers, static_cast<size_t>(world), comm::ExchangeMode::kPointToPoint, batch_bytes);
  for (size_t k = 0; k < needs.size(); ++k) {
    const comm::Transfer& t = transfers[k];
    const uint64_t window = uint64_t(static_cast<uint32_t>(me)) << 32 | keyed[k].window;
    uint32_t kept = 0;
    for (const auto& [rank, j] : keepers.at(needs[k].identity)) {
      if (rank == t.from) kept = j;
    }
    answers[t.to].receives.push_back({needs[k].index, t.from, t.bytes, window, keyed[k].tag});
    answers[t.from].sends.push_back({kept, t.to, t.bytes, window, keyed[k].tag});
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (const auto& [r, list] : answers) out[static_cast<size_t>(r)] = encode_shard_transfers(list);
  return out;
}

std::vector<ShardMove> merge_shard_transfers(const std::vector<std::string>& answers, int me,
                                             const std::vector<KeptShard>& kept, const std::vector<NeededShard>& needed,
                                             const std::map<int, std::vector<size_t>>& routed_kept) {
  struct Entry {
    ShardMove move;
    bool sends = false, receives = false;
  };
  std::map<std::pair<uint64_t, uint32_t>, Entry> moves;  // by (window, tag)
  std::vector<bool> received(needed.size(), false);
  for (size_t s = 0; s < answers.size(); ++s) {
    if (answers[s].empty()) continue;
    const std::string origin = fmt::format("rank {}", s);
    const ShardTransferList list = decode_shard_transfers(answers[s], origin);
    const auto bad = [&](const std::string& why) {
      throw ProtocolError(fmt::format("{} scheduled a shard transfer that {}", origin, why));
    };
    // One entry per (window, tag), in the scheduler's own windows; two only
    // as the halves of a transfer to oneself.
    const auto entry = [&](uint64_t window, uint32_t tag, bool sending, int from, int to) -> Entry& {
      if (window >> 32 != s) bad("lies in another scheduler's window");
      auto [at, fresh] = moves.try_emplace({window, tag});
      Entry& e = at->second;
      const bool other_half = !fresh && from == me && to == me && e.move.keyed.transfer.from == me &&
                              e.move.keyed.transfer.to == me &&
                              (sending ? !e.sends && e.receives : e.sends && !e.receives);
      if (!fresh && !other_half) bad("shares its window and tag with another transfer");
      (sending ? e.sends : e.receives) = true;
      return e;
    };
    for (const auto& r : list.receives) {
      if (r.need >= needed.size() || received[r.need]) bad(fmt::format("names need {} of rank {}", r.need, me));
      if (r.bytes != bytes_of(needed[r.need].dest)) bad("has the wrong size");
      if (r.from < 0 || r.from >= static_cast<int>(answers.size())) bad(fmt::format("comes from rank {}", r.from));
      received[r.need] = true;
      Entry& e = entry(r.window, r.tag, false, r.from, me);
      e.move.keyed = comm::KeyedTransfer{comm::Transfer{r.from, me, r.bytes}, r.window, r.tag};
      e.move.need = r.need;
    }
    const auto routed = routed_kept.find(static_cast<int>(s));
    for (const auto& x : list.sends) {
      if (routed == routed_kept.end() || x.kept >= routed->second.size()) bad("names a shard not kept here");
      const size_t k = routed->second[x.kept];
      if (x.bytes != bytes_of(kept[k].data)) bad("has the wrong size");
      if (x.to < 0 || x.to >= static_cast<int>(answers.size())) bad(fmt::format("goes to rank {}", x.to));
      Entry& e = entry(x.window, x.tag, true, me, x.to);
      e.move.keyed = comm::KeyedTransfer{comm::Transfer{me, x.to, x.bytes}, x.window, x.tag};
      e.move.kept = k;
    }
  }
  for (size_t i = 0; i < needed.size(); ++i) {
    if (!received[i]) throw ProtocolError(fmt::format("no scheduler sent rank {} its need {}", me, i));
  }
  std::vector<ShardMove> out;
  out.reserve(moves.size());
  for (auto& [key, e] : moves) {
    const comm::Transfer& t = e.move.keyed.transfer;
    if (t.from == me && t.to == me && !(e.sends && e.receives)) {
      throw ProtocolError(fmt::format("a scheduler gave rank {} half of a transfer to itself", me));
    }
    out.push_back(std::move(e.move));
  }
  return out;
}

namespace {

void exchange_partitioned(const std::vector<KeptShard>& kept, std::vector<NeededShard>& needed, Communicator& comm,
                          uint64_t batch_bytes) {
  std::map<int, std::vector<size_t>> routed_kept;
  const std::vector<std::string> routed = all_to_all_agreed(comm, "route the shards ranks need and keep", [&] {
    return route_shards(kept, needed, comm.size(), routed_kept);
  });
  const std::vector<std::string> answers = all_to_all_agreed(comm, "match the needed shards with their keepers", [&] {
    return schedule_shard_transfers(routed, comm.rank(), batch_bytes);
  });
  // Agreed: a malformed answer (a bug) must not leave the peers waiting for this rank's transfers.
  std::vector<ShardMove> moves;
  run_agreed(comm, "check the shard transfers the schedulers sent",
             [&] { moves = merge_shard_transfers(answers, comm.rank(), kept, needed, routed_kept); });
  std::vector<comm::KeyedTransfer> mine;
  for (const ShardMove& m : moves) mine.push_back(m.keyed);
  const at::Device device = comm.tensor_device();
  comm::ExchangeCallbacks callbacks;
  callbacks.produce = [&](size_t k) { return as_bytes(kept[moves[k].kept].data.contiguous()); };
  callbacks.landing = [&](size_t k) {
    const at::Tensor& dest = needed[moves[k].need].dest;
    return dest.is_contiguous() && dest.device() == device ? as_bytes(dest) : at::Tensor();
  };
  callbacks.deliver = [&](size_t k, const at::Tensor& payload) {
    at::Tensor& dest = needed[moves[k].need].dest;
    dest.copy_(payload.to(dest.device()).view(dest.scalar_type()).view(dest.sizes()));
  };
  comm::exchange_keyed(comm, mine, callbacks, comm::ExchangeMode::kPointToPoint);
}

}  // namespace

std::string shard_identity(const ShardedTensor& meta) {
  // The key's length first, so no key can pass for another key and position.
  return fmt::format("{}:{}@{}[{}:{}]", meta.key.size(), meta.key, fmt::join(meta.global_offset, ","),
                     meta.flattened_range ? meta.flattened_range->start : -1,
                     meta.flattened_range ? meta.flattened_range->stop : -1);
}

void exchange_kept_shards(const std::vector<KeptShard>& kept, std::vector<NeededShard>& needed, Communicator& comm,
                          LoadExchange mode, uint64_t batch_bytes) {
  if (mode != LoadExchange::kAllGather) return exchange_partitioned(kept, needed, comm, batch_bytes);
  // The rounds are cut over every rank's transfers: every rank gathers every rank's needs and offers.
  const std::vector<std::vector<ShardNeedMessage>> needs = gather_needs(needed, comm, batch_bytes);
  std::set<std::string> wanted;
  for (const auto& rank_needs : needs) {
    for (const ShardNeedMessage& n : rank_needs) wanted.insert(n.identity);
  }
  if (wanted.empty()) return;  // nothing anywhere (the atomic algorithm)
  std::unordered_map<std::string, size_t> my_kept;
  const auto keepers = gather_keepers(kept, wanted, comm, my_kept);
  check_kept(needs, keepers, needed);
  const TransferPlan plan = plan_transfers(needs, keepers);

  const at::Device device = comm.tensor_device();
  comm::ExchangeCallbacks callbacks;
  callbacks.produce = [&](size_t k) {
    const std::string& id = needs[static_cast<size_t>(plan.transfers[k].to)][plan.need_of[k]].identity;
    return as_bytes(kept[my_kept.at(id)].data.contiguous());
  };
  // A destination that is contiguous on the communicator's device receives in place.
  callbacks.landing = [&](size_t k) {
    const at::Tensor& dest = needed[plan.need_of[k]].dest;
    return dest.is_contiguous() && dest.device() == device ? as_bytes(dest) : at::Tensor();
  };
  callbacks.deliver = [&](size_t k, const at::Tensor& payload) {
    at::Tensor& dest = needed[plan.need_of[k]].dest;
    dest.copy_(payload.to(dest.device()).view(dest.scalar_type()).view(dest.sizes()));
  };
  comm::exchange(comm, plan.transfers, callbacks, comm::ExchangeMode::kRounds, batch_bytes);
}

}  // namespace distckpt::local
