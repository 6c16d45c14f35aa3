// The AVX-512 BF16 variant of decode attention's block work: the AVX-512 one, with bfloat16
// keys' dot products by vdpbf16ps (attention_block.inc, AB_BF16DOT). Only this file is
// compiled for these instructions; decode_attention.cpp calls it only where cpuid has them.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace strata {
namespace attn {
namespace avx512bf16 {
#define AB_WIDE 1
#define AB_BF16DOT 1
#define AB_NAME "avx512_bf16"
#include "attention_block.inc"
#undef AB_NAME
#undef AB_BF16DOT
#undef AB_WIDE
}  // namespace avx512bf16

const Kernels& avx512_bf16_kernels() { return avx512bf16::kKernels; }

}  // namespace attn
}  // namespace strata

#pragma GCC pop_options
