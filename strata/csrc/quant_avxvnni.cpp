// The AVX-VNNI variant of the quantized kernels: AVX2 with the VEX-encoded vpdpbusd (Alder
// Lake and later Intel cores, Zen 5), for CPUs without AVX-512 VNNI. The same code as the
// AVX-512 VNNI variant (QK_VNNI: the byte dot products in one instruction, exact 32-bit sums,
// so the outputs are bit-identical to every other variant's) on 16 registers (QK_YMM16: the x8
// kernel's tiles of 4 rows). Only this file is compiled for AVX-VNNI (the pragma below, after
// every include); quant_ops.cpp calls it only where the CPU has it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avxvnni")

namespace strata {
namespace quant {
namespace avxvnni {
#define QK_VNNI 1
#define QK_YMM16 1
#define QK_NAME "avx_vnni"
#include "quant_blocks.inc"
#include "quant_x8.inc"
#include "quant_dots.inc"
#undef QK_NAME
#undef QK_YMM16
#undef QK_VNNI
}  // namespace avxvnni

const Kernels& avxvnni_kernels() { return avxvnni::kKernels; }

}  // namespace quant
}  // namespace strata

#pragma GCC pop_options
