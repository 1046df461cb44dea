// CRC-32 (ISO-HDLC: zip, gzip, PNG) of zip::Crc32. Reads check every whole
// record they take against it, so it runs at the speed of the disk: on
// x86-64 with carry-less multiplication (PCLMULQDQ) it folds 64 bytes per
// step, four 128-bit lanes at once (Intel's "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ"), several times faster than tables;
// elsewhere, and for the short head and tail, slicing-by-8 tables.
#include <cstdint>
#include <cstring>

#include "format/zip_archive.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace distckpt::zip {
namespace {

// Slicing-by-8: eight table lookups per 8 bytes.
struct CrcTables {
  uint32_t t[8][256];
};

const CrcTables& crc_tables() {
  static const CrcTables tables = [] {
    CrcTables x{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      x.t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s) {
      for (uint32_t i = 0; i < 256; ++i) x.t[s][i] = (x.t[s - 1][i] >> 8) ^ x.t[0][x.t[s - 1][i] & 0xFF];
    }
    return x;
  }();
  return tables;
}

uint32_t update_tables(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = crc_tables().t;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][hi & 0xFF] ^
        t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xFF];
  return c;
}

#if defined(__x86_64__)

// The folding constants of the reflected polynomial 0x04C11DB7: x^(4*128+32)
// and x^(4*128-32) mod P (four lanes ahead), x^(128+32) and x^(128-32) mod P
// (one lane), x^64 mod P, and P with its Barrett constant mu.
alignas(16) constexpr uint64_t kFold4[2] = {0x0154442bd4, 0x01c6e41596};
alignas(16) constexpr uint64_t kFold1[2] = {0x01751997d0, 0x00ccaa009e};
alignas(16) constexpr uint64_t kFold64[2] = {0x0163cd6124, 0};
alignas(16) constexpr uint64_t kBarrett[2] = {0x01db710641, 0x01f7011641};

#define DISTCKPT_FOLDING __attribute__((target("pclmul,sse4.1")))

DISTCKPT_FOLDING inline __m128i load(const uint8_t* at) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
}

// x folded forward by k, onto `next`: its low half times k's low constant,
// its high half times k's high one.
DISTCKPT_FOLDING inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// `c` over n bytes (n >= 64, a multiple of 16).
DISTCKPT_FOLDING uint32_t update_folding(uint32_t c, const uint8_t* p, size_t n) {
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
  p += 64;
  n -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFold4));
  for (; n >= 64; n -= 64, p += 64) {
    x1 = fold(x1, k, load(p));
    x2 = fold(x2, k, load(p + 16));
    x3 = fold(x3, k, load(p + 32));
    x4 = fold(x4, k, load(p + 48));
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFold1));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  for (; n >= 16; n -= 16, p += 16) x1 = fold(x1, k, load(p));
  // 128 bits to 64, then to 32 (Barrett reduction).
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2b = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2b);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kFold64));
  x2b = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2b);
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kBarrett));
  x2b = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10), low32);
  x2b = _mm_clmulepi64_si128(x2b, k, 0x00);
  x1 = _mm_xor_si128(x1, x2b);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

#undef DISTCKPT_FOLDING

bool has_folding() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

#endif

}  // namespace

void Crc32::update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = state_;
#if defined(__x86_64__)
  if (n >= 64 && has_folding()) {
    const size_t folded = n & ~size_t{15};
    c = update_folding(c, p, folded);
    p += folded;
    n -= folded;
  }
#endif
  state_ = update_tables(c, p, n);
}

}  // namespace distckpt::zip
