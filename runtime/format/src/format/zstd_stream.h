// Zstandard streams, as PyTorch DCP's "stream.zstd" transform writes an
// item (one or more frames, with or without their content size), read as
// untrusted input: the output is bounded by the caller's limit, and a
// damaged, truncated or oversized stream is a CorruptionError, never a
// partial result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distckpt::zstd {

// The bytes `data[0, size)` decompress to; CorruptionError starting with
// `what` when they are not a complete zstd stream or would pass `limit` bytes.
std::string inflate(const uint8_t* data, size_t size, uint64_t limit, const std::string& what);

// `data` compressed as one frame (level 3, content size recorded), as
// tests make compressed items.
std::string deflate(const uint8_t* data, size_t size);

}  // namespace distckpt::zstd
