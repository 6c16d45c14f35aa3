// The MLP activation's AVX-512 rows (activation_avx512.cpp): silu(g) * u over the first
// n - n % 16 values, the same values as decode_ops.cpp's AVX2 row; returns how many it did.
// Call only where the CPU has AVX-512 F/BW/VL/DQ.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace strata {

inline bool silu_mul_avx512_ok() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok;
}

int64_t silu_mul_avx512(const float* g, const float* u, float* y, int64_t n);
int64_t silu_mul_avx512(const c10::BFloat16* g, const c10::BFloat16* u, c10::BFloat16* y, int64_t n);

}  // namespace strata
