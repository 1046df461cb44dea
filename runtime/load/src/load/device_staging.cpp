#include "load/device_staging.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "distckpt/core/errors.h"

namespace distckpt::loading {
namespace {

uint64_t aligned(uint64_t bytes) {
  return (bytes + DeviceStaging::kAlignment - 1) / DeviceStaging::kAlignment * DeviceStaging::kAlignment;
}

uint64_t read_bytes(const TensorRead& read) {
  return static_cast<uint64_t>(read.dest.numel()) * static_cast<uint64_t>(read.dest.element_size());
}

// Appends parts of `read` of at most `limit` bytes each (aligned).
void split_read(const TensorRead& read, uint64_t limit, std::vector<TensorRead>& out) {
  const uint64_t bytes = read_bytes(read);
  if (aligned(bytes) <= limit) {
    out.push_back(read);
    return;
  }
  const Box& part = read.need.part;
  size_t axis = 0;  // more bytes than one element, so some axis is longer than one
  while (part.length[axis] == 1) ++axis;
  const uint64_t row = bytes / static_cast<uint64_t>(part.length[axis]);
  // `limit` is a multiple of the alignment, so a part within it stays within it aligned.
  const auto rows = static_cast<int64_t>(std::max<uint64_t>(1, limit / row));
  for (int64_t start = 0; start < part.length[axis]; start += rows) {
    const int64_t n = std::min(rows, part.length[axis] - start);
    TensorRead sub = read;
    sub.need.part.offset[axis] += start;
    sub.need.part.length[axis] = n;
    sub.dest = read.dest.narrow(static_cast<int64_t>(axis), start, n);
    split_read(sub, limit, out);  // one row still too large: its inner axes
  }
}

// The largest power of two not above `bytes` (0 for 0).
uint64_t power_of_two_below(uint64_t bytes) {
  uint64_t p = 1;
  while (p <= bytes / 2) p *= 2;
  return bytes == 0 ? 0 : p;
}

}  // namespace

// Windows are powers of two: LibTorch's caching host allocator rounds every
// pinned allocation up to one, so any other size would pin more than asked.
DeviceStaging::DeviceStaging(uint64_t staging_bytes, Staged staged)
    : staged_(std::move(staged)), window_bytes_(power_of_two_below(staging_bytes / 2)) {
  if (window_bytes_ < kAlignment) {
    throw UsageError(
        fmt::format("LoadOptions::device_staging_bytes is {}; it must hold two windows of at least {} bytes",
                    staging_bytes, kAlignment));
  }
}

std::vector<std::vector<TensorRead>> DeviceStaging::plan_rounds(std::vector<TensorRead> reads) {
  std::vector<std::vector<TensorRead>> rounds(1);
  std::vector<TensorRead> parts;
  uint64_t used = 0;  // staged bytes of the last round
  for (TensorRead& read : reads) {
    if (!staged_(read.dest)) {
      rounds.front().push_back(std::move(read));
      continue;
    }
    pinned_ = pinned_ || read.dest.is_cuda();
    parts.clear();
    split_read(read, window_bytes_, parts);
    for (TensorRead& part : parts) {
      const uint64_t bytes = aligned(read_bytes(part));
      if (used > 0 && used + bytes > window_bytes_) {
        rounds.emplace_back();
        used = 0;
      }
      rounds.back().push_back(std::move(part));
      used += bytes;
      largest_round_ = std::max(largest_round_, used);
    }
  }
  return rounds;
}

void DeviceStaging::stage(std::vector<TensorRead>& round, size_t k) {
  pending_.clear();
  current_ = k % 2;
  Window& window = windows_[current_];
  if (window.copies) {
    window.copies->wait();  // round k - 2's copies still read this memory
    window.copies.reset();
  }
  uint64_t offset = 0;
  for (TensorRead& read : round) {
    if (!staged_(read.dest)) continue;
    if (!window.memory.defined()) {
      window.memory = at::empty({static_cast<int64_t>(largest_round_)},
                                at::TensorOptions().dtype(at::kByte).pinned_memory(pinned_));
      peak_bytes_ += largest_round_;
    }
    const uint64_t bytes = read_bytes(read);
    at::Tensor host = window.memory.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(bytes))
                          .view(read.dest.scalar_type())
                          .view(read.dest.sizes());
    pending_.emplace_back(host, read.dest);
    read.dest = std::move(host);
    offset += aligned(bytes);
  }
}

void DeviceStaging::deliver() {
  io::HostToDevice copies;
  try {
    for (const auto& [host, dest] : pending_) {
      if (dest.is_cpu()) {
        at::Tensor(dest).copy_(host);  // staged in tests only: nothing to overlap with
      } else {
        copies.copy(host, dest);
      }
    }
  } catch (...) {
    // The copies already queued still write the caller's tensors: the
    // caller's stream and the window's next use wait for them all the same.
    pending_.clear();
    windows_[current_].copies = copies.done();
    throw;
  }
  pending_.clear();
  windows_[current_].copies = copies.done();
}

}  // namespace distckpt::loading
