// The AVX2 + FMA + F16C variant of the quantized kernels (the module's base flags, setup.py).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant.h"

namespace strata {
namespace quant {
namespace avx2 {
#define QK_VNNI 0
#define QK_NAME "avx2"
#include "quant_blocks.inc"
#include "quant_x8.inc"
#include "quant_dots.inc"
#undef QK_NAME
#undef QK_VNNI
}  // namespace avx2

const Kernels& avx2_kernels() { return avx2::kKernels; }

}  // namespace quant
}  // namespace strata
