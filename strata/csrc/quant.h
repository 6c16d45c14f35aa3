// Quantized GGUF weights read in place: the interface between the torch-facing op
// (quant_ops.cpp) and the instruction-set variants (quant_avx2.cpp, quant_vnni.cpp).
//
// A weight is the file's bytes, uint8 [out, row_bytes]: each row is k / block values in
// GGML blocks of one type (GGML's type ids below). Two ways to multiply it by activation rows:
//   int8:  each activation row is quantized to 8 bits per block (per 32 values for the
//          32-value types, per 256 with sums per 16 for the K-quants, as ggml's Q8_0/Q8_K)
//          and the dot products are integer (AVX2 maddubs/madd, AVX-512 VNNI vpdpbusd);
//   float: each weight block is dequantised to float32 once and multiplied by float32
//          activation rows (exact weights, float32 accumulation).
// Either way a weight row is read once for all activation rows of the call.
// No torch or STL types here: the variants are compiled with their own target options.
#pragma once

#include <cstdint>

namespace strata {
namespace quant {

// GGML type ids (ggml.h's enum ggml_type) of the types read in place.
constexpr int Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14;

// Values per block and bytes per block of `type`; 0 if the type is not read in place.
inline int block_values(int type) {
  switch (type) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return 32;
    case Q4_K: case Q5_K: case Q6_K: return 256;
    default: return 0;
  }
}
inline int block_bytes(int type) {
  switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
  }
}

// Quantized activation rows, each of k values; `pitch` >= rows is a multiple of 8 (a tile
// of 8 rows reads its 8 scales at once). For the 32-value types: q [rows, k] int8, and per
// block b of row j d32[b * pitch + j] (value = d32 * q) and s32[b * pitch + j] = d32 * sum(q
// of the block). For the K-quants: q256 [rows, k], d256[b * pitch + j] per 256 values,
// bsums [rows, k / 16] (sums of q per 16). The x8 kernel's 15-bit activations (quant_x8.inc)
// add ql [rows, k] int8: value = d32 * (128 q + ql), s32 = d32 * sum(128 q + ql). i32, where
// set, holds those block sums as integers (same index as d32; the AVX2 q8x8 kernel's offset).
struct Act {
  int64_t k = 0, pitch = 0;
  int8_t* q = nullptr;
  int8_t* ql = nullptr;
  float* d32 = nullptr;
  float* s32 = nullptr;
  int32_t* i32 = nullptr;
  int8_t* q256 = nullptr;
  float* d256 = nullptr;
  int16_t* bsums = nullptr;
};

// One weight row `w` (k values of `type`) times `rows` activation rows: out[j] for row j.
using Int8Dot = void (*)(int type, const uint8_t* w, const Act& a, int64_t rows, float* out);
// The same with float32 activations x [rows, k] (row stride k); `scratch` holds 256 floats.
using FloatDot = void (*)(int type, const uint8_t* w, int64_t k, const float* x, int64_t rows, float* out,
                          float* scratch);
// Row j of x (float32, or bfloat16 when bf16) into an Act's q/d32/s32 (and/or q256/d256/bsums).
using Quantize = void (*)(const void* x, bool bf16, int64_t j, Act& a, bool want32, bool want256);

// Bytes per 32-value block of a group of 8 interleaved 4-bit columns (quant_x8.inc), of 8
// interleaved 5-bit columns (Q5_0's values, the q5x8 form) and of 8 interleaved 8-bit columns
// (Q8_0's values, the q8x8 form).
constexpr int X8_RECORD_BYTES = 160;
constexpr int X8Q5_RECORD_BYTES = 176;
constexpr int X8Q8_RECORD_BYTES = 272;

// One group of 8 interleaved 4-bit columns (the x8 layout, quant_x8.inc) times `rows`
// activation rows quantized for the 32-value types: out [rows, 8].
using Int8X8 = void (*)(const uint8_t* w, const Act& a, int64_t rows, float* out);
// Row j of x (float32, or bfloat16 when bf16) into an Act's q/ql/d32/s32 at 15 bits per value.
using Quantize15 = void (*)(const void* x, bool bf16, int64_t j, Act& a);

struct Kernels {
  const char* name;
  Int8Dot int8_dot;
  FloatDot float_dot;
  void (*dequant_row)(int type, const uint8_t* w, int64_t k, float* out);
  Quantize quantize;
  Int8X8 int8_x8;     // 8-bit activations (q, d32, s32)
  Int8X8 int15_x8;    // 15-bit activations (q, ql, d32, s32: quantize15's)
  Int8X8 int8_q5x8;   // the same two for the 5-bit (q5x8) form
  Int8X8 int15_q5x8;
  Int8X8 int8_q8x8;   // the same two for the 8-bit (q8x8) form
  Int8X8 int15_q8x8;
  Quantize15 quantize15;
};

const Kernels& avx2_kernels();
const Kernels& vnni_kernels();  // AVX-512 F/BW/VL + VNNI
const Kernels& avxvnni_kernels();  // AVX2 + AVX-VNNI (16 registers)

}  // namespace quant
}  // namespace strata
