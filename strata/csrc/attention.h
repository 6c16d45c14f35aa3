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
  const void* k;  // the first cell's key row (one K/V head), `count` cells `cell_stride` apart
  const void* v;  // its value row, the same way
  // int8 cells: the first cell's float16 scale (bits) of its key and of its value row, the
  // next cells' following it; null for float cells.
  const uint16_t* k_scale;
  const uint16_t* v_scale;
  int64_t count;
};

// One task: query heads qf[group][dim] (float32, scaled) over one block's segments of K/V
// (float32, bfloat16 as uint16_t bits, or int8 with a float16 scale per cell), `len` positions. Writes part[g * (dim + 2) ...] =
// (max, sum of exp, dim sums of exp * v). A block's segments may lie in different storages.
using BlockF32 = void (*)(const float* qf, int64_t group, int64_t dim, int64_t cell_stride, const Segment* seg,
                          int nseg, int64_t len, float* part);
using BlockBF16 = BlockF32;  // the same signature: segments say where, the variant says the type

struct Kernels {
  const char* name;
  BlockF32 f32;
  BlockBF16 bf16;
  BlockF32 i8_f32;  // int8 cells dequantised to float32 (int8 x scale)
  BlockF32 i8_bf16;  // the same rounded to bfloat16, as a bfloat16 model's reads of int8 cells
};

const Kernels& avx2_kernels();
const Kernels& avx512_kernels();  // AVX-512 F/BW/VL/DQ
const Kernels& avx512_bf16_kernels();  // the same and AVX-512 BF16

}  // namespace attn
}  // namespace strata
