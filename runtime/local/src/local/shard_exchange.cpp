#include "local/shard_exchange.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <unordered_map>

#include "comm/exchange.h"
#include "distckpt/core/errors.h"
#include "local/messages.h"
#include "plan/balance.h"

namespace distckpt::local {
namespace {

// A flat byte view of a contiguous tensor (the payload of a shard).
at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

// Every rank's needs (identity and bytes), by rank.
std::vector<std::vector<ShardNeedMessage>> gather_needs(const std::vector<NeededShard>& needed, Communicator& comm) {
  std::vector<ShardNeedMessage> mine;
  mine.reserve(needed.size());
  for (const NeededShard& n : needed) {
    mine.push_back(ShardNeedMessage{n.identity, static_cast<uint64_t>(n.dest.numel()) * n.dest.element_size()});
  }
  const std::vector<std::string> gathered = comm.all_gather_bytes(encode_shard_needs(mine));
  std::vector<std::vector<ShardNeedMessage>> needs(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) needs[r] = decode_shard_needs(gathered[r], fmt::format("rank {}", r));
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

}  // namespace

std::string shard_identity(const ShardedTensor& meta) {
  // The key's length first, so no key can pass for another key and position.
  return fmt::format("{}:{}@{}[{}:{}]", meta.key.size(), meta.key, fmt::join(meta.global_offset, ","),
                     meta.flattened_range ? meta.flattened_range->start : -1,
                     meta.flattened_range ? meta.flattened_range->stop : -1);
}

void exchange_kept_shards(const std::vector<KeptShard>& kept, std::vector<NeededShard>& needed, Communicator& comm,
                          LoadExchange mode, uint64_t batch_bytes) {
  const std::vector<std::vector<ShardNeedMessage>> needs = gather_needs(needed, comm);
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
  comm::exchange(comm, plan.transfers, callbacks,
                 mode == LoadExchange::kAllGather ? comm::ExchangeMode::kRounds : comm::ExchangeMode::kPointToPoint,
                 batch_bytes);
}

}  // namespace distckpt::local
