// int8 K/V cells written in place (strata/cells/int8.py's `quantise`, value for value): one
// K or V head's row x[dim] of a cell -> int8 codes q[dim] and a float16 scale, where
//   scale = float16(max|x| / 127)            (float32 division, rounded to nearest even)
//   q[i]  = clamp(round(x[i] / s), -127, 127) with s = float(scale), or 1 where scale is 0
// (float32 division, rounding half to even as torch.round). rope_write calls it once per
// row and copies the codes and scale to every destination.
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace strata {

template <typename T>
inline c10::Half quantise_kv_row(const T* x, int64_t dim, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
  const c10::Half scale(amax / 127.f);
  const float s = static_cast<float>(scale);
  const float divisor = s > 0.f ? s : 1.f;
  for (int64_t i = 0; i < dim; ++i) {
    const float r = std::nearbyint(static_cast<float>(x[i]) / divisor);  // FE_TONEAREST: half to even
    q[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, r)));
  }
  return scale;
}

}  // namespace strata
