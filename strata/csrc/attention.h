// Decode attention's per-block work (attention_block.inc), compiled once per instruction set
// (attention_avx2.cpp, attention_avx512.cpp); decode_attention.cpp picks one at run time.
// No torch or STL types here: the variants are compiled with their own target options, and
// everything they define has internal linkage, so no inline function compiled for AVX-512
// can stand in for another file's on a CPU without it.
#pragma once

#include <cstdint>

namespace strata {
namespace attn {

constexpr int64_t BLOCK = 128;  // positions per task (a multiple of 16)
constexpr int64_t MAX_GROUP = 16;
constexpr int64_t MAX_DIM = 256;

struct Segment {
  int64_t cell, count;  // flat cells cell .. cell + count - 1
};

// One task: query heads qf[group][dim] (float32, scaled) over one block's segments of K/V
// (float32, or bfloat16 as uint16_t bits), `len` positions. Writes part[g * (dim + 2) ...] =
// (max, sum of exp, dim sums of exp * v).
using BlockF32 = void (*)(const float* qf, int64_t group, int64_t dim, const float* k, const float* v,
                          int64_t cell_stride, const Segment* seg, int nseg, int64_t len, float* part);
using BlockBF16 = void (*)(const float* qf, int64_t group, int64_t dim, const uint16_t* k, const uint16_t* v,
                           int64_t cell_stride, const Segment* seg, int nseg, int64_t len, float* part);

struct Kernels {
  const char* name;
  BlockF32 f32;
  BlockBF16 bf16;
};

const Kernels& avx2_kernels();
const Kernels& avx512_kernels();  // AVX-512 F/BW/VL/DQ

}  // namespace attn
}  // namespace strata
