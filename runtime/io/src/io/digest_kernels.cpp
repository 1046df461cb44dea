#include "io/digest_kernels.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace distckpt::io::digest_kernels {
namespace {

template <typename T>
uint64_t portable_terms(const uint8_t* p, uint64_t count, uint64_t first) {
  uint64_t sum = 0, place = first * kStep + kOrigin;
  for (uint64_t i = 0; i < count; ++i, place += kStep) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));  // any alignment
    sum += term(static_cast<uint64_t>(v), place);
  }
  return sum;
}

// `sum` called with a value of the unsigned type of `element_size` bytes.
template <typename Sum>
uint64_t by_width(size_t element_size, const Sum& sum) {
  switch (element_size) {
    case 1:
      return sum(uint8_t{});
    case 2:
      return sum(uint16_t{});
    case 4:
      return sum(uint32_t{});
    default:
      return sum(uint64_t{});
  }
}

uint64_t portable(const void* data, uint64_t count, size_t element_size, uint64_t first) {
  return by_width(element_size, [&](auto width) {
    return portable_terms<decltype(width)>(static_cast<const uint8_t*>(data), count, first);
  });
}

#if defined(__x86_64__)

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined operands (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// 8 elements at once: AVX-512 multiplies 64-bit lanes itself.
template <typename T>
__attribute__((target("avx512f,avx512dq"))) uint64_t avx512_terms(const uint8_t* p, uint64_t count, uint64_t first) {
  const __m512i mix1 = _mm512_set1_epi64(static_cast<long long>(kMix1));
  const __m512i mix2 = _mm512_set1_epi64(static_cast<long long>(kMix2));
  const __m512i step = _mm512_set1_epi64(static_cast<long long>(8 * kStep));
  const uint64_t base = first * kStep + kOrigin;
  __m512i place = _mm512_add_epi64(
      _mm512_set1_epi64(static_cast<long long>(base)),
      _mm512_mullo_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi64(static_cast<long long>(kStep))));
  __m512i sum = _mm512_setzero_si512();
  uint64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const uint8_t* at = p + i * sizeof(T);
    __m512i x;
    if constexpr (sizeof(T) == 1) {
      x = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
    } else if constexpr (sizeof(T) == 2) {
      x = _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    } else if constexpr (sizeof(T) == 4) {
      x = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
    } else {
      x = _mm512_loadu_si512(at);
    }
    x = _mm512_xor_si512(x, place);
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)), mix1);
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)), mix2);
    sum = _mm512_add_epi64(sum, _mm512_xor_si512(x, _mm512_srli_epi64(x, 31)));
    place = _mm512_add_epi64(place, step);
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, sum);
  uint64_t total = 0;
  for (const uint64_t lane : lanes) total += lane;
  return total + portable_terms<T>(p + i * sizeof(T), count - i, first + i);
}

uint64_t avx512(const void* data, uint64_t count, size_t element_size, uint64_t first) {
  return by_width(element_size, [&](auto width) {
    return avx512_terms<decltype(width)>(static_cast<const uint8_t*>(data), count, first);
  });
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// a * b (mod 2^64) per 64-bit lane from 32-bit products; `b_high` holds b >> 32.
__attribute__((target("avx2"))) inline __m256i mullo64(__m256i a, __m256i b, __m256i b_high) {
  const __m256i low = _mm256_mul_epu32(a, b);
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b), _mm256_mul_epu32(a, b_high));
  return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
}

// 4 elements at once.
template <typename T>
__attribute__((target("avx2"))) uint64_t avx2_terms(const uint8_t* p, uint64_t count, uint64_t first) {
  const __m256i mix1 = _mm256_set1_epi64x(static_cast<long long>(kMix1));
  const __m256i mix1_high = _mm256_set1_epi64x(static_cast<long long>(kMix1 >> 32));
  const __m256i mix2 = _mm256_set1_epi64x(static_cast<long long>(kMix2));
  const __m256i mix2_high = _mm256_set1_epi64x(static_cast<long long>(kMix2 >> 32));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(4 * kStep));
  const uint64_t base = first * kStep + kOrigin;
  __m256i place = _mm256_set_epi64x(static_cast<long long>(base + 3 * kStep), static_cast<long long>(base + 2 * kStep),
                                    static_cast<long long>(base + kStep), static_cast<long long>(base));
  __m256i sum = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const uint8_t* at = p + i * sizeof(T);
    __m256i x;
    if constexpr (sizeof(T) == 1) {
      int32_t four;
      std::memcpy(&four, at, sizeof four);
      x = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(four));
    } else if constexpr (sizeof(T) == 2) {
      x = _mm256_cvtepu16_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
    } else if constexpr (sizeof(T) == 4) {
      x = _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    } else {
      x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
    }
    x = _mm256_xor_si256(x, place);
    x = mullo64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 30)), mix1, mix1_high);
    x = mullo64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 27)), mix2, mix2_high);
    sum = _mm256_add_epi64(sum, _mm256_xor_si256(x, _mm256_srli_epi64(x, 31)));
    place = _mm256_add_epi64(place, step);
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + portable_terms<T>(p + i * sizeof(T), count - i, first + i);
}

uint64_t avx2(const void* data, uint64_t count, size_t element_size, uint64_t first) {
  return by_width(element_size, [&](auto width) {
    return avx2_terms<decltype(width)>(static_cast<const uint8_t*>(data), count, first);
  });
}

#endif

}  // namespace

const std::vector<Kernel>& available() {
  static const std::vector<Kernel> kernels = [] {
    std::vector<Kernel> k{{"portable", portable}};
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) k.push_back({"avx2", avx2});
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) k.push_back({"avx512", avx512});
#endif
    return k;
  }();
  return kernels;
}

}  // namespace distckpt::io::digest_kernels
