#include "io/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace distckpt::io {

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Streaming stores need 16-byte aligned destinations: copy the head normally.
  const size_t head = std::min(n, static_cast<size_t>((16 - reinterpret_cast<uintptr_t>(d) % 16) % 16));
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  auto* out = reinterpret_cast<__m128i*>(d);
  const auto* in = reinterpret_cast<const __m128i*>(s);
  const size_t vectors = n / 16;
  size_t i = 0;
  for (; i + 4 <= vectors; i += 4) {
    const __m128i a = _mm_loadu_si128(in + i), b = _mm_loadu_si128(in + i + 1);
    const __m128i c = _mm_loadu_si128(in + i + 2), e = _mm_loadu_si128(in + i + 3);
    _mm_stream_si128(out + i, a);
    _mm_stream_si128(out + i + 1, b);
    _mm_stream_si128(out + i + 2, c);
    _mm_stream_si128(out + i + 3, e);
  }
  for (; i < vectors; ++i) _mm_stream_si128(out + i, _mm_loadu_si128(in + i));
  _mm_sfence();  // order the streaming stores before whoever reads the buffer next
  std::memcpy(d + vectors * 16, s + vectors * 16, n - vectors * 16);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace distckpt::io
