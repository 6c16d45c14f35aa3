// The AVX2 + FMA variant of decode attention's block work (the module's base flags, setup.py).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention.h"

namespace strata {
namespace attn {
namespace avx2 {
#define AB_WIDE 0
#define AB_NAME "avx2"
#include "attention_block.inc"
#undef AB_NAME
#undef AB_WIDE
}  // namespace avx2

const Kernels& avx2_kernels() { return avx2::kKernels; }

}  // namespace attn
}  // namespace strata
