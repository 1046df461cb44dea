#include "format/zstd_stream.h"

#include <fmt/format.h>
#include <zstd.h>

#include <algorithm>
#include <memory>

#include "distckpt/core/errors.h"

namespace distckpt::zstd {
namespace {

struct StreamDeleter {
  void operator()(ZSTD_DStream* s) const { ZSTD_freeDStream(s); }
};

}  // namespace

std::string inflate(const uint8_t* data, size_t size, uint64_t limit, const std::string& what) {
  const auto fail = [&](const std::string& why) {
    return CorruptionError(fmt::format("{}: its zstd stream {}", what, why), what);
  };
  std::unique_ptr<ZSTD_DStream, StreamDeleter> stream(ZSTD_createDStream());
  if (!stream) throw std::bad_alloc();
  // The first frame's recorded size (when there is one) sizes the buffer;
  // it is a hint from the file, so the limit still bounds it. One byte of
  // room past the limit tells a stream that holds more.
  const uint64_t room = limit + 1;
  const unsigned long long recorded = ZSTD_getFrameContentSize(data, size);
  uint64_t capacity = std::max<uint64_t>(uint64_t{64} << 10, uint64_t{4} * size);
  if (recorded != ZSTD_CONTENTSIZE_UNKNOWN && recorded != ZSTD_CONTENTSIZE_ERROR) capacity = recorded;
  std::string out(static_cast<size_t>(std::min(capacity, room)), '\0');
  ZSTD_inBuffer in{data, size, 0};
  ZSTD_outBuffer to{out.data(), out.size(), 0};
  const auto too_large = [&] { return fail(fmt::format("holds more than {} bytes, more than the item can", limit)); };
  size_t pending = 1;  // ZSTD_decompressStream's hint: 0 once a frame is complete
  while (in.pos < in.size || pending != 0) {
    if (to.pos == to.size) {
      if (to.size >= room) throw too_large();
      out.resize(static_cast<size_t>(std::min<uint64_t>(room, std::max<size_t>(64 << 10, 2 * out.size()))));
      to.dst = out.data();
      to.size = out.size();
    }
    const size_t before_in = in.pos, before_out = to.pos;
    pending = ZSTD_decompressStream(stream.get(), &to, &in);
    if (ZSTD_isError(pending)) throw fail(fmt::format("is damaged ({})", ZSTD_getErrorName(pending)));
    // Input consumed and no output room used: the stream ended mid-frame.
    if (in.pos == in.size && pending != 0 && to.pos < to.size && before_in == in.pos && before_out == to.pos) {
      throw fail("is truncated: it ends inside a frame");
    }
  }
  if (to.pos > limit) throw too_large();
  out.resize(to.pos);
  return out;
}

std::string deflate(const uint8_t* data, size_t size) {
  std::string out(ZSTD_compressBound(size), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data, size, 3);
  if (ZSTD_isError(n)) throw Error(fmt::format("zstd compression failed: {}", ZSTD_getErrorName(n)));
  out.resize(n);
  return out;
}

}  // namespace distckpt::zstd
