// Zstandard streams as DCP items hold them, read as untrusted input: what
// was compressed comes back (one frame or several, with or without a
// recorded size), and a stream that is damaged, truncated, empty or larger
// than the caller's limit is refused with the reason. (Frames carry no
// checksum unless asked, and PyTorch does not ask: a flipped byte inside
// one is caught by the CRC-32 of the torch.save record it decompresses to.)
#include "format/zstd_stream.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <string>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

std::string sample(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((i * 7) % 251 + (i / 4096) % 3);
  return out;
}

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// A frame without its content size, as a streaming compressor writes it
// (PyTorch's ZstdCompressor().stream_writer does).
std::string streamed(const std::string& data) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::string out(ZSTD_compressBound(data.size()) + 64, '\0');
  ZSTD_outBuffer to{out.data(), out.size(), 0};
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  size_t left = 0;
  do {
    left = ZSTD_compressStream2(cctx, &to, &in, ZSTD_e_end);
    EXPECT_FALSE(ZSTD_isError(left));
  } while (left != 0);
  ZSTD_freeCCtx(cctx);
  out.resize(to.pos);
  return out;
}

TEST(ZstdStream, WhatWasCompressedComesBack) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{3} << 20}) {
    const std::string data = sample(n);
    const std::string framed = zstd::deflate(bytes(data), data.size());
    EXPECT_EQ(zstd::inflate(bytes(framed), framed.size(), n, "item"), data) << n << " bytes, size recorded";
    const std::string unsized = streamed(data);
    EXPECT_EQ(ZSTD_getFrameContentSize(unsized.data(), unsized.size()), ZSTD_CONTENTSIZE_UNKNOWN);
    EXPECT_EQ(zstd::inflate(bytes(unsized), unsized.size(), n, "item"), data) << n << " bytes, size not recorded";
  }
}

TEST(ZstdStream, ConcatenatedFramesAreOneStream) {
  const std::string a = sample(70000), b = sample(123);
  const std::string two = zstd::deflate(bytes(a), a.size()) + streamed(b);
  EXPECT_EQ(zstd::inflate(bytes(two), two.size(), a.size() + b.size(), "item"), a + b);
}

TEST(ZstdStream, MoreThanTheLimitIsRefused) {
  const std::string data = sample(1 << 20);
  for (const std::string& packed : {zstd::deflate(bytes(data), data.size()), streamed(data)}) {
    EXPECT_TRUE(
        throws_with<CorruptionError>([&] { zstd::inflate(bytes(packed), packed.size(), data.size() - 1, "'x' item"); },
                                     "'x' item: its zstd stream holds more than 1048575 bytes"));
  }
}

TEST(ZstdStream, DamagedTruncatedAndEmptyStreamsAreRefused) {
  const std::string data = sample(200000);
  const std::string packed = streamed(data);
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { zstd::inflate(bytes(packed), packed.size() / 2, data.size(), "item"); },
                                   "item: its zstd stream is truncated: it ends inside a frame"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { zstd::inflate(bytes(packed), 0, data.size(), "item"); },
                                           "item: its zstd stream is truncated"));
  const std::string garbage = "PK\x03\x04 not zstd at all";
  EXPECT_TRUE(throws_with<CorruptionError>([&] { zstd::inflate(bytes(garbage), garbage.size(), 100, "item"); },
                                           "item: its zstd stream is damaged ("));
}

}  // namespace
}  // namespace distckpt
