#include "transfer/live_sources.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
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

LiveSources::LiveSources(std::shared_ptr<const SourceLayout> layout, const std::vector<const ShardedTensor*>& mine)
    : layout_(std::move(layout)) {
  for (const ShardedTensor* t : mine) {
    if (!t->data.defined() || t->held_numel() == 0) continue;
    const auto at = layout_->chunks.find(SourceLayout::key_of(t->key, t->global_box(), t->flattened_range));
    if (at != layout_->chunks.end()) held_.emplace(at->second, t->data);
  }
}

void LiveSources::read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) {
  const auto t = static_cast<uint32_t>(&tensor - layout_->index.tensors.data());  // records come from index()
  const auto held = held_.find({t, chunk});
  if (held == held_.end()) {
    throw UsageError(fmt::format("this rank does not hold chunk {} of '{}' it was asked to send: a planning bug", chunk,
                                 tensor.key));
  }
  const at::Tensor& src = held->second;
  const auto element = static_cast<uint64_t>(src.element_size());
  if (end < begin || end > static_cast<uint64_t>(src.numel()) * element) {
    throw UsageError(fmt::format("bytes [{}, {}) of chunk {} of '{}' are past its {} bytes", begin, end, chunk,
                                 tensor.key, static_cast<uint64_t>(src.numel()) * element));
  }
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
