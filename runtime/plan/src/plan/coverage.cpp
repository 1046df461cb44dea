#include "plan/coverage.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>

#include "distckpt/core/errors.h"

namespace distckpt::plan {
namespace {

[[noreturn]] void throw_overlap(const std::string& key, const Shape& global_shape, const OwnedBox& a, const OwnedBox& b,
                                CoverSubject subject) {
  if (subject == CoverSubject::kStoredChunks) {
    throw CorruptionError(
        fmt::format("the stored chunks of '{}' (global shape {}) overlap: {} (written by rank {}) "
                    "and {} (written by rank {})",
                    key, to_string(global_shape), to_string(a.box), a.rank, to_string(b.box), b.rank));
  }
  throw ShardingError(
      fmt::format("invalid sharding of '{}' (global shape {}): main replicas overlap: rank {} holds {} and rank {} "
                  "holds {}. Every element must have exactly one main replica (replica_id all zeros); give the copies "
                  "non-zero replica ids or fix their offsets.",
                  key, to_string(global_shape), a.rank, to_string(a.box), b.rank, to_string(b.box)));
}

[[noreturn]] void throw_gap(const std::string& key, const Shape& global_shape, const Box& hole, int64_t covered,
                            int64_t total, CoverSubject subject) {
  const std::string where = hole.ndim() ? to_string(hole) : std::string("some elements");
  if (subject == CoverSubject::kStoredChunks) {
    throw CorruptionError(fmt::format("no stored chunk of '{}' (global shape {}) holds {} ({} of {} elements stored)",
                                      key, to_string(global_shape), where, covered, total));
  }
  throw ShardingError(
      fmt::format("invalid sharding of '{}' (global shape {}): no rank holds a main replica of {} ({} of {} elements "
                  "covered). Check the offsets/fragments of that tensor on every rank.",
                  key, to_string(global_shape), where, covered, total));
}

// A box of another rank than the tensor, or reaching past it: `relation`
// joins the box and the global shape in the message.
[[noreturn]] void throw_misplaced(const std::string& key, const Shape& global_shape, const OwnedBox& b,
                                  const char* relation, CoverSubject subject) {
  if (subject == CoverSubject::kStoredChunks) {
    throw CorruptionError(
        fmt::format("a stored chunk of '{}' is {}{} {}", key, to_string(b.box), relation, to_string(global_shape)));
  }
  throw ShardingError(fmt::format("invalid sharding of '{}': rank {} holds {}{} {}", key, b.rank, to_string(b.box),
                                  relation, to_string(global_shape)));
}

// Sorted distinct cut coordinates per axis.
std::vector<std::vector<int64_t>> grid_cuts(const Shape& global_shape, const std::vector<OwnedBox>& boxes) {
  std::vector<std::vector<int64_t>> cuts(global_shape.size());
  for (size_t d = 0; d < global_shape.size(); ++d) {
    cuts[d] = {0, global_shape[d]};
    cuts[d].reserve(2 * boxes.size() + 2);
    for (const OwnedBox& b : boxes) {
      cuts[d].push_back(b.box.offset[d]);
      cuts[d].push_back(b.box.offset[d] + b.box.length[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  return cuts;
}

size_t cut_index(const std::vector<int64_t>& cuts, int64_t v) {
  return static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), v) - cuts.begin());
}

// Calls f(cell) for every cell of the sub-grid [lo, hi) (row-major order).
template <typename F>
void for_each_cell(const std::vector<size_t>& lo, const std::vector<size_t>& hi, const std::vector<size_t>& strides,
                   F&& f) {
  const size_t nd = lo.size();
  for (size_t d = 0; d < nd; ++d) {
    if (lo[d] >= hi[d]) return;
  }
  std::vector<size_t> idx = lo;
  while (true) {
    size_t cell = 0;
    for (size_t d = 0; d < nd; ++d) cell += idx[d] * strides[d];
    f(cell);
    size_t d = nd;
    while (d > 0 && ++idx[d - 1] == hi[d - 1]) {
      idx[d - 1] = lo[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

// Marks every grid cell each box covers; the first cell marked twice is an
// overlap, the first cell never marked is a gap.
void check_on_grid(const std::string& key, const Shape& global_shape, const std::vector<OwnedBox>& boxes,
                   const std::vector<std::vector<int64_t>>& cuts, size_t cells, int64_t covered, int64_t total,
                   CoverSubject subject) {
  const size_t nd = global_shape.size();
  std::vector<size_t> dims(nd), strides(nd);
  size_t stride = 1;
  for (size_t d = nd; d-- > 0;) {
    dims[d] = cuts[d].size() - 1;
    strides[d] = stride;
    stride *= dims[d];
  }
  std::vector<int32_t> owner(cells, -1);  // index into boxes
  std::vector<size_t> lo(nd), hi(nd);
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = cut_index(cuts[d], boxes[i].box.offset[d]);
      hi[d] = cut_index(cuts[d], boxes[i].box.offset[d] + boxes[i].box.length[d]);
    }
    for_each_cell(lo, hi, strides, [&](size_t cell) {
      if (owner[cell] >= 0) throw_overlap(key, global_shape, boxes[owner[cell]], boxes[i], subject);
      owner[cell] = static_cast<int32_t>(i);
    });
  }
  for (size_t cell = 0; cell < cells; ++cell) {
    if (owner[cell] >= 0) continue;
    Box hole{Shape(nd), Shape(nd)};
    size_t rest = cell;
    for (size_t d = 0; d < nd; ++d) {
      size_t i = rest / strides[d];
      rest %= strides[d];
      hole.offset[d] = cuts[d][i];
      hole.length[d] = cuts[d][i + 1] - cuts[d][i];
    }
    throw_gap(key, global_shape, hole, covered, total, subject);
  }
}

// Sweep along the first axis the boxes split: each box is compared only with
// the still-open boxes (whose range on that axis reaches it) that can meet it
// on the next split axis. Axes every box spans whole (a stacked axis of
// length 1, say) are skipped. With at most two split axes the open boxes of a
// valid cover are disjoint on the second, so only a box's neighbours there
// are checked: O(n log n). With more, every open box starting before its end
// on the second axis is compared; for stored chunks (untrusted) that work is
// bounded.
void check_by_sweep(const std::string& key, const Shape& global_shape, std::vector<OwnedBox> boxes, int64_t covered,
                    int64_t total, CoverSubject subject) {
  std::vector<size_t> split;  // the axes some box does not span whole
  for (size_t d = 0; d < global_shape.size(); ++d) {
    for (const OwnedBox& b : boxes) {
      if (b.box.offset[d] != 0 || b.box.length[d] != global_shape[d]) {
        split.push_back(d);
        break;
      }
    }
  }
  if (split.empty()) {  // every box is the whole tensor
    if (boxes.size() > 1) throw_overlap(key, global_shape, boxes[0], boxes[1], subject);
    if (covered != total) throw_gap(key, global_shape, Box{}, covered, total, subject);
    return;
  }
  const size_t a0 = split[0];
  std::sort(boxes.begin(), boxes.end(),
            [&](const OwnedBox& a, const OwnedBox& b) { return a.box.offset[a0] < b.box.offset[a0]; });
  const bool two = split.size() > 1;
  const auto start1 = [&](size_t i) { return two ? boxes[i].box.offset[split[1]] : 0; };
  const auto end1 = [&](size_t i) { return two ? boxes[i].box.offset[split[1]] + boxes[i].box.length[split[1]] : 1; };
  constexpr uint64_t kMaxComparisons = uint64_t{1} << 28;  // a few seconds
  uint64_t comparisons = 0;
  std::multimap<int64_t, size_t> closing;  // end on a0 -> box
  std::multimap<int64_t, size_t> open;     // start on the second split axis -> box
  std::vector<std::multimap<int64_t, size_t>::iterator> open_at(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const int64_t start = boxes[i].box.offset[a0];
    while (!closing.empty() && closing.begin()->first <= start) {
      open.erase(open_at[closing.begin()->second]);
      closing.erase(closing.begin());
    }
    const auto overlap = [&](size_t j) { throw_overlap(key, global_shape, boxes[j], boxes[i], subject); };
    if (split.size() <= 2) {
      const auto next = open.upper_bound(start1(i));
      if (next != open.end() && next->first < end1(i)) overlap(next->second);
      if (next != open.begin() && end1(std::prev(next)->second) > start1(i)) overlap(std::prev(next)->second);
    } else {
      for (auto it = open.begin(); it != open.end() && it->first < end1(i); ++it) {
        if (intersect(boxes[i].box, boxes[it->second].box)) overlap(it->second);
        if (++comparisons > kMaxComparisons && subject == CoverSubject::kStoredChunks) {
          throw CorruptionError(
              fmt::format("the {} stored chunks of '{}' (global shape {}) are too irregular to check "
                          "for overlaps; no distckpt save writes such a tiling",
                          boxes.size(), key, to_string(global_shape)));
        }
      }
    }
    open_at[i] = open.emplace(start1(i), i);
    closing.emplace(start + boxes[i].box.length[a0], i);
  }
  if (covered != total) throw_gap(key, global_shape, Box{}, covered, total, subject);
}

}  // namespace

void check_exact_cover(const std::string& key, const Shape& global_shape, const std::vector<OwnedBox>& all,
                       CoverSubject subject) {
  std::vector<OwnedBox> boxes;
  boxes.reserve(all.size());
  const Box whole{Shape(global_shape.size(), 0), global_shape};
  for (const OwnedBox& b : all) {
    if (b.box.ndim() != global_shape.size()) throw_misplaced(key, global_shape, b, " but the global shape is", subject);
    if (b.box.empty()) continue;
    if (!contains(whole, b.box)) throw_misplaced(key, global_shape, b, ", outside the global shape", subject);
    boxes.push_back(b);
  }
  const int64_t total = numel(global_shape);
  __int128 covered = 0;
  for (const OwnedBox& b : boxes) covered += b.box.numel();
  const int64_t covered64 = covered > total ? total + 1 : static_cast<int64_t>(covered);
  if (total == 0) return;
  if (global_shape.empty()) {  // a scalar: exactly one holder
    if (boxes.size() > 1) throw_overlap(key, global_shape, boxes[0], boxes[1], subject);
    if (boxes.empty()) throw_gap(key, global_shape, whole, 0, 1, subject);
    return;
  }
  const auto cuts = grid_cuts(global_shape, boxes);
  __int128 cells = 1;
  for (const auto& c : cuts) cells *= static_cast<__int128>(c.size() - 1);
  const __int128 grid_budget = 8 * static_cast<__int128>(boxes.size()) + 4096;
  if (cells <= grid_budget) {
    check_on_grid(key, global_shape, boxes, cuts, static_cast<size_t>(cells), covered64, total, subject);
  } else {
    check_by_sweep(key, global_shape, std::move(boxes), covered64, total, subject);
  }
}

}  // namespace distckpt::plan
