// The AVX-512 VNNI variant of the quantized kernels: vpdpbusd for the byte dot products
// (and the 32 vector registers of AVX-512). Only this file is compiled for these
// instructions (the pragma below, after every include); quant_ops.cpp calls it only where
// the CPU has them. It includes no torch or standard library code, so nothing compiled
// here can stand in for another file's inline functions on a CPU without AVX-512.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

namespace strata {
namespace quant {
namespace vnni {
#define QK_VNNI 1
#define QK_YMM16 0
#define QK_NAME "avx512_vnni"
#include "quant_blocks.inc"
#include "quant_x8.inc"
#include "quant_dots.inc"
#undef QK_NAME
#undef QK_YMM16
#undef QK_VNNI
}  // namespace vnni

const Kernels& vnni_kernels() { return vnni::kKernels; }

}  // namespace quant
}  // namespace strata

#pragma GCC pop_options
