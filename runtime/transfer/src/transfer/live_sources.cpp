#include "transfer/live_sources.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <tuple>

#include "distckpt/core/errors.h"
#include "plan/global_plan.h"

namespace distckpt::transferring {
namespace {

// Elements [first, first + count) of `src`'s row-major flattening into `out`
// (views of `src`, copied once, from any device).
void copy_elements(const at::Tensor& src, int64_t first, int64_t count, uint8_t* out) {
  const auto options = at::TensorOptions().dtype(src.scalar_type());
  if (src.dim() == 0) {
    at::from_blob(out, {}, options).copy_(src);
    return;
  }
  const Box whole{Shape(static_cast<size_t>(src.dim()), 0), Shape(src.sizes().begin(), src.sizes().end())};
  const auto element = static_cast<int64_t>(src.element_size());
  for (const FlatPiece& piece : decompose_flat_range(whole, FlatRange{first, first + count})) {
    at::Tensor view = src;
    for (size_t d = 0; d < piece.box.ndim(); ++d) {
      view = view.narrow(static_cast<int64_t>(d), piece.box.offset[d], piece.box.length[d]);
    }
    at::from_blob(out + (piece.flat_start - first) * element, piece.box.length, options).copy_(view);
  }
}

}  // namespace

SourceLayout::ShardKey SourceLayout::key_of(const std::string& key, const Box& box,
                                            const std::optional<FlatRange>& flat) {
  return {key, box.offset, box.length, flat ? flat->start : -1, flat ? flat->stop : -1};
}

SourceLayout::SourceLayout(const std::vector<plan::LocalPlan>& plans) {
  // Validated as a save's plan is; its chunks (one per distinct shard) are the stored chunks.
  plan::GlobalSavePlan global = plan::make_global_save_plan(plans, WriterPolicy::kLowestRank);
  index = std::move(static_cast<StorageIndex&>(global.skeleton));
  index.checksum_block_size = 0;  // nothing is stored: no checksums to check
  holders.resize(index.tensors.size());
  for (uint32_t t = 0; t < index.tensors.size(); ++t) {
    const TensorRecord& record = index.tensors[t];
    holders[t].resize(record.chunks.size());
    for (uint32_t c = 0; c < record.chunks.size(); ++c) {
      chunks.emplace(key_of(record.key, record.chunks[c].box, record.chunks[c].flat), std::make_pair(t, c));
    }
  }
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const plan::ShardPlan& s : plans[r].tensors) {
      const auto at = chunks.find(key_of(s.key, s.box, s.flat));
      if (at == chunks.end()) continue;  // an empty shard, or a replica group without a main (never read)
      std::vector<int>& h = holders[at->second.first][at->second.second];
      if (h.empty() || h.back() != static_cast<int>(r)) h.push_back(static_cast<int>(r));
    }
  }
}

void SourceLayout::add_direct_readers(const std::vector<plan::LocalPlan>& plans, const std::vector<Reach>& reaches,
                                      const std::vector<int>& groups) {
  std::map<int, std::vector<int>> members;  // group -> its ranks, ascending
  for (size_t r = 0; r < groups.size(); ++r) {
    if (groups[r] >= 0) members[groups[r]].push_back(static_cast<int>(r));
  }
  if (members.empty()) return;
  in_memory.resize(index.tensors.size());
  for (uint32_t t = 0; t < index.tensors.size(); ++t) in_memory[t].resize(index.tensors[t].chunks.size());
  pids.resize(reaches.size());
  for (size_t r = 0; r < reaches.size(); ++r) pids[r] = reaches[r].pid;
  group_of_rank = groups;
  for (size_t r = 0; r < plans.size(); ++r) {
    const std::vector<uint64_t>& addresses = reaches[r].addresses;
    if (groups[r] < 0 || addresses.empty()) continue;
    for (size_t k = 0; k < plans[r].tensors.size(); ++k) {
      const plan::ShardPlan& s = plans[r].tensors[k];
      const auto at = chunks.find(key_of(s.key, s.box, s.flat));
      if (addresses[k] == 0 || at == chunks.end()) continue;
      InMemory& m = in_memory[at->second.first][at->second.second];
      if (m.rank < 0) m = InMemory{static_cast<int>(r), addresses[k]};
    }
  }
  for (uint32_t t = 0; t < index.tensors.size(); ++t) {
    for (uint32_t c = 0; c < in_memory[t].size(); ++c) {
      if (in_memory[t][c].rank < 0) continue;
      const std::vector<int>& group = members.at(groups[static_cast<size_t>(in_memory[t][c].rank)]);
      std::vector<int> merged;
      std::set_union(holders[t][c].begin(), holders[t][c].end(), group.begin(), group.end(),
                     std::back_inserter(merged));
      holders[t][c] = std::move(merged);
    }
  }
}

LiveSources::LiveSources(std::shared_ptr<const SourceLayout> layout, const std::vector<const ShardedTensor*>& mine,
                         int rank)
    : layout_(std::move(layout)), rank_(rank) {
  for (const ShardedTensor* t : mine) {
    if (!t->data.defined() || t->held_numel() == 0) continue;
    const auto at = layout_->chunks.find(SourceLayout::key_of(t->key, t->global_box(), t->flattened_range));
    if (at != layout_->chunks.end()) held_.emplace(at->second, t->data);
  }
}

void LiveSources::check_range(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end) const {
  const uint64_t bytes = static_cast<uint64_t>(tensor.chunks.at(chunk).stored_numel()) * tensor.element_size();
  if (end < begin || end > bytes) {
    throw UsageError(
        fmt::format("bytes [{}, {}) of chunk {} of '{}' are past its {} bytes", begin, end, chunk, tensor.key, bytes));
  }
}

const SourceLayout::InMemory* LiveSources::elsewhere(uint32_t t, uint32_t chunk) const {
  if (layout_->in_memory.empty() || layout_->in_memory[t][chunk].rank < 0) return nullptr;
  const SourceLayout::InMemory& m = layout_->in_memory[t][chunk];
  // Only ranks of its host (those that checked they can read it) read a rank's memory.
  const std::vector<int>& g = layout_->group_of_rank;
  if (g.at(static_cast<size_t>(rank_)) < 0 || g.at(static_cast<size_t>(rank_)) != g.at(static_cast<size_t>(m.rank))) {
    return nullptr;
  }
  return &m;
}

void LiveSources::read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) {
  const auto t = static_cast<uint32_t>(&tensor - layout_->index.tensors.data());
  const auto held = held_.find({t, chunk});
  const SourceLayout::InMemory* there = held == held_.end() ? elsewhere(t, chunk) : nullptr;
  const bool here_dense = held != held_.end() && held->second.device().is_cpu() && held->second.is_contiguous();
  if (!there && !here_dense) {
    StorageReader::read_chunk_runs(tensor, chunk, runs);  // through a window
    return;
  }
  uint64_t bytes = 0;
  for (const ByteRun& r : runs) {
    check_range(tensor, chunk, r.offset, r.offset + r.bytes);
    bytes += r.bytes;
  }
  if (there) {
    read_peer(layout_->pids[static_cast<size_t>(there->rank)], there->address, runs,
              [&] { return fmt::format("chunk {} of '{}' (rank {})", chunk, tensor.key, there->rank); });
    bytes_read_directly_ += bytes;
  } else {
    const auto* base = static_cast<const uint8_t*>(held->second.data_ptr());
    for (const ByteRun& r : runs) std::memcpy(r.out, base + r.offset, r.bytes);
  }
  bytes_read_ += bytes;
}

void LiveSources::read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) {
  const auto t = static_cast<uint32_t>(&tensor - layout_->index.tensors.data());  // records come from index()
  const auto held = held_.find({t, chunk});
  if (held == held_.end()) {
    if (elsewhere(t, chunk)) {
      read_chunk_runs(tensor, chunk, {ByteRun{begin, end - begin, out}});
      return;
    }
    throw UsageError(fmt::format("this rank does not hold chunk {} of '{}' it was asked to send: a planning bug", chunk,
                                 tensor.key));
  }
  const at::Tensor& src = held->second;
  const auto element = static_cast<uint64_t>(src.element_size());
  check_range(tensor, chunk, begin, end);
  if (src.device().is_cpu() && src.is_contiguous()) {
    std::memcpy(out, static_cast<const uint8_t*>(src.data_ptr()) + begin, end - begin);
  } else if (begin % element == 0 && end % element == 0) {
    copy_elements(src, static_cast<int64_t>(begin / element), static_cast<int64_t>((end - begin) / element), out);
  } else {  // a byte range inside elements: the elements around it, then its bytes
    const uint64_t first = begin / element, last = (end + element - 1) / element;
    std::vector<uint8_t> around((last - first) * element);
    copy_elements(src, static_cast<int64_t>(first), static_cast<int64_t>(last - first), around.data());
    std::memcpy(out, around.data() + (begin - first * element), end - begin);
  }
  bytes_read_ += end - begin;
}

std::string LiveSources::read_object(const ObjectRecord& object) {
  throw UsageError(fmt::format("a transfer moves tensors, not objects ('{}')", object.key));
}

Value LiveSources::read_common_state() const { return Value::dict(); }

void LiveSources::verify(VerifyReport&, const VerifyProgress&) {
  throw UsageError("a transfer's sources are live tensors: there is nothing stored to verify");
}

}  // namespace distckpt::transferring
