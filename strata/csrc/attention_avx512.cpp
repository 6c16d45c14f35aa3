// The AVX-512 variant of decode attention's block work: 16-lane keys, dot products and V
// sums. Only this file is compiled for these instructions (the pragma below, after every
// include); decode_attention.cpp calls it only where cpuid says the CPU has them.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

namespace strata {
namespace attn {
namespace avx512 {
#define AB_WIDE 1
#define AB_NAME "avx512"
#include "attention_block.inc"
#undef AB_NAME
#undef AB_WIDE
}  // namespace avx512

const Kernels& avx512_kernels() { return avx512::kKernels; }

}  // namespace attn
}  // namespace strata

#pragma GCC pop_options
