#include "local/shard_exchange.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "distckpt/core/errors.h"
#include "local/wire.h"

namespace distckpt::local {
namespace {

struct Transfer {
  int from;
  int to;
  size_t need;      // index into the receiver's announced needs
  uint64_t bytes;
};

struct Announced {
  std::vector<std::string> identities;
  std::vector<uint64_t> bytes;  // needs only
};

std::string encode_needs(const std::vector<NeededShard>& needed) {
  WireWriter w;
  w.u64(needed.size());
  for (const NeededShard& n : needed) {
    w.str(n.identity);
    w.u64(static_cast<uint64_t>(n.dest.numel()) * n.dest.element_size());
  }
  return w.take();
}

Announced decode(const std::string& bytes, bool with_sizes, int rank) {
  WireReader r(bytes, fmt::format("shard announcement of rank {}", rank));
  Announced out;
  const uint64_t n = r.count(1);
  out.identities.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    out.identities.push_back(r.str());
    if (with_sizes) out.bytes.push_back(r.u64());
  }
  return out;
}

// A flat byte view of a contiguous tensor (the wire format of a shard).
at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

}  // namespace

std::string shard_identity(const ShardedTensor& meta) {
  WireWriter w;
  w.str(meta.key);
  w.u64(meta.global_offset.size());
  for (int64_t o : meta.global_offset) w.i64(o);
  w.i64(meta.flattened_range ? meta.flattened_range->start : -1);
  w.i64(meta.flattened_range ? meta.flattened_range->stop : -1);
  return w.take();
}

void exchange_kept_shards(const std::vector<KeptShard>& kept, std::vector<NeededShard>& needed, Communicator& comm,
                          LoadExchange mode, uint64_t batch_bytes) {
  const int me = comm.rank();
  const size_t world = static_cast<size_t>(comm.size());
  // 1. Who needs what. Nothing anywhere (the atomic algorithm): done.
  const std::vector<std::string> all_needs = comm.all_gather_bytes(encode_needs(needed));
  std::vector<Announced> needs(world);
  std::set<std::string> wanted;
  for (size_t r = 0; r < world; ++r) {
    needs[r] = decode(all_needs[r], true, static_cast<int>(r));
    wanted.insert(needs[r].identities.begin(), needs[r].identities.end());
  }
  if (wanted.empty()) return;

  // 2. Who keeps what is wanted.
  std::unordered_map<std::string, size_t> my_kept;
  WireWriter offer;
  std::vector<const KeptShard*> offered;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (wanted.count(kept[i].identity) && my_kept.emplace(kept[i].identity, i).second) offered.push_back(&kept[i]);
  }
  offer.u64(offered.size());
  for (const KeptShard* k : offered) offer.str(k->identity);
  const std::vector<std::string> all_offers = comm.all_gather_bytes(offer.take());
  std::map<std::string, std::vector<int>> keepers;  // ranks ascending
  for (size_t r = 0; r < world; ++r) {
    for (std::string& id : decode(all_offers[r], false, static_cast<int>(r)).identities) {
      keepers[std::move(id)].push_back(static_cast<int>(r));
    }
  }

  // 3. The same transfer list on every rank: each need to the keeper that
  // has sent the fewest bytes so far (ties to the lowest rank).
  std::vector<Transfer> transfers;
  std::vector<uint64_t> sent(world, 0);
  std::vector<std::string> orphans;
  for (size_t r = 0; r < world; ++r) {
    for (size_t n = 0; n < needs[r].identities.size(); ++n) {
      const auto it = keepers.find(needs[r].identities[n]);
      if (it == keepers.end()) {
        orphans.push_back(fmt::format("rank {} need #{}", r, n));
        continue;
      }
      int best = it->second.front();
      for (int k : it->second) {
        if (sent[static_cast<size_t>(k)] < sent[static_cast<size_t>(best)]) best = k;
      }
      sent[static_cast<size_t>(best)] += needs[r].bytes[n];
      transfers.push_back(Transfer{best, static_cast<int>(r), n, needs[r].bytes[n]});
    }
  }
  if (!orphans.empty()) {
    std::string mine;
    for (size_t n = 0; n < needed.size(); ++n) {
      if (!keepers.count(needed[n].identity)) mine += (mine.empty() ? "" : "; ") + needed[n].description;
    }
    throw ShardingError(fmt::format(
        "{} shard(s) that ranks need were kept by no rank ({}){}; the tensor-aware state dicts do not come "
        "from one fully parallel save of this job — load the global checkpoint instead",
        orphans.size(), fmt::join(orphans.begin(), orphans.begin() + std::min<size_t>(orphans.size(), 8), ", "),
        mine.empty() ? "" : fmt::format(" [this rank: {}]", mine)));
  }

  const at::Device device = comm.tensor_device();
  auto source = [&](const Transfer& t) {
    const at::Tensor& data = kept[my_kept.at(needs[static_cast<size_t>(t.to)].identities[t.need])].data;
    return as_bytes(data.to(device).contiguous());
  };
  auto deliver = [&](const Transfer& t, const at::Tensor& bytes) {
    at::Tensor& dest = needed[t.need].dest;
    if (static_cast<uint64_t>(bytes.numel()) != t.bytes) {
      throw CommError(fmt::format("rank {} sent {} bytes for {}, {} expected", t.from, bytes.numel(),
                                  needed[t.need].description, t.bytes));
    }
    dest.copy_(bytes.to(dest.device()).view(dest.scalar_type()).view(dest.sizes()));
  };
  // dest can receive in place when it is contiguous on the wire device.
  auto in_place = [&](const at::Tensor& dest) { return dest.is_contiguous() && dest.device() == device; };

  if (mode != LoadExchange::kAllGather) {
    for (size_t k = 0; k < transfers.size(); ++k) {
      const Transfer& t = transfers[k];
      const int tag = static_cast<int>(k & 0x3fffffff);
      if (t.from == me) {
        comm.send_tensor(source(t), t.to, tag);
      } else if (t.to == me) {
        at::Tensor& dest = needed[t.need].dest;
        if (in_place(dest)) {
          at::Tensor wire = as_bytes(dest);
          comm.recv_tensor(wire, t.from, tag);
        } else {
          at::Tensor wire = at::empty({static_cast<int64_t>(t.bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
          comm.recv_tensor(wire, t.from, tag);
          deliver(t, wire);
        }
      }
    }
    return;
  }

  // Batched: rounds of about batch_bytes in transfer order; in each round
  // every sender contributes its transfers' bytes, concatenated.
  size_t begin = 0;
  while (begin < transfers.size()) {
    size_t end = begin;
    uint64_t round_bytes = 0;
    while (end < transfers.size() && (end == begin || round_bytes + transfers[end].bytes <= batch_bytes)) {
      round_bytes += transfers[end++].bytes;
    }
    std::string contribution;
    for (size_t k = begin; k < end; ++k) {
      if (transfers[k].from != me) continue;
      const at::Tensor bytes = source(transfers[k]).cpu();
      contribution.append(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
    }
    const std::vector<std::string> gathered = comm.all_gather_bytes(contribution);
    std::vector<uint64_t> at_offset(world, 0);
    for (size_t k = begin; k < end; ++k) {
      const Transfer& t = transfers[k];
      const std::string& from = gathered[static_cast<size_t>(t.from)];
      uint64_t& at = at_offset[static_cast<size_t>(t.from)];
      if (at + t.bytes > from.size()) {
        throw CommError(fmt::format("rank {} sent {} bytes in an exchange round, fewer than planned", t.from,
                                    from.size()));
      }
      if (t.to == me) {
        const at::Tensor view = at::from_blob(const_cast<char*>(from.data() + at), {static_cast<int64_t>(t.bytes)},
                                              at::TensorOptions().dtype(at::kByte));
        deliver(t, view);
      }
      at += t.bytes;
    }
    begin = end;
  }
}

}  // namespace distckpt::local
