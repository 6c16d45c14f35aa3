// The AVX-512 variant of the MLP's activation, silu(gate) * up: 16 float32 lanes doing, lane
// for lane, the AVX2 row's operations (vec.h's exp8 polynomial, the division, the rounding to
// bfloat16 after silu and after the product), so both give the same values. Only this file is
// compiled for these instructions (the pragma below, after every include); decode_ops.cpp calls
// it only where cpuid says the CPU has them.
#include <immintrin.h>

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "activation.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

namespace strata {
namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // bf16 is the top half of a float32
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// x rounded to bfloat16 (nearest, ties to even; x finite), kept as float32: vec.h's round_bf16.
inline __m512 round_bf16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline __m512 round_to(__m512 x, const float*) { return x; }
inline __m512 round_to(__m512 x, const c10::BFloat16*) { return round_bf16(x); }

inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(c10::BFloat16* p, __m512 x) {
  const __m512i hi = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(x)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(hi));
}

// e^x, x clamped to [-87, 88]: vec.h's exp8, the same operations in the same order.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

template <typename T>
int64_t silu_mul_16(const T* g, const T* u, T* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = load16(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));
    const __m512 s = round_to(_mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.f), e)), g);
    store16(y + i, _mm512_mul_ps(s, load16(u + i)));
  }
  return i;
}

}  // namespace

int64_t silu_mul_avx512(const float* g, const float* u, float* y, int64_t n) { return silu_mul_16(g, u, y, n); }
int64_t silu_mul_avx512(const c10::BFloat16* g, const c10::BFloat16* u, c10::BFloat16* y, int64_t n) {
  return silu_mul_16(g, u, y, n);
}

}  // namespace strata

#pragma GCC pop_options
