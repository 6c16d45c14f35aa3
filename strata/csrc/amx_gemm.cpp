// bfloat16 GEMMs on AMX tiles (Intel AMX-BF16), for the dense projections of prompt pieces:
//   amx_available() -> bool: this CPU has AMX-TILE and AMX-BF16 and the kernel let this process use them
//   amx_pack(w) -> packed: w [n, k] bfloat16 (n % 32 == 0, k % 32 == 0) -> int16 (the bf16 bits) [n / 16, k / 32, 16, 32]:
//       for each block of 16 output columns and 32 input values, the B tile of tdpbf16ps: row r
//       holds the pairs (w[c][2r], w[c][2r + 1]) of the block's 16 columns c side by side.
//   amx_unpack(packed) -> w [n, k] bfloat16 (the inverse)
//   amx_linear(x, packed, bias) -> y: x [rows, k] bfloat16, y [rows, n] bfloat16 = x @ w^T (+ bias),
//       products summed in float32 (tdpbf16ps, 32 values an instruction, in k order), the bias
//       added in float32, rounded once to bfloat16 (nearest even).
// A row's result depends on its own values only: every row runs the same instructions in the
// same order, whatever the number of rows beside it (rows are handled 32 at a time, the last
// block zero-padded). Threads split the output columns 32 at a time (at::parallel_for).
// Only this file's kernel functions are compiled for AMX (target pragma); the ops check
// amx_available() first.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "decode_ops.h"

namespace strata {
namespace {

constexpr int64_t kRows = 32;  // rows a block: two A tiles of 16
constexpr int64_t kCols = 32;  // output columns a block: two B tiles of 16
constexpr int64_t kDepth = 32;  // bfloat16 values a tile row holds (64 bytes)
constexpr int64_t kChunkCols = 256;  // output columns whose weights a thread keeps in L2 at a time

bool cpu_has_amx_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 24 & 1) && (d >> 22 & 1) && __builtin_cpu_supports("avx512bf16");
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

// Tiles: 0-3 the float32 sums of a 32 x 32 block (0: rows 0-15 cols 0-15, 1: rows 0-15 cols
// 16-31, 2: rows 16-31 cols 0-15, 3: rows 16-31 cols 16-31), 4-5 the A rows, 6-7 the B columns.
void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// sums [32][32] float32 = a [32 rows, stride lda] . the two B column blocks b0, b1 ([k/32] tiles each).
void block_sums(const uint16_t* a, int64_t lda, const uint16_t* b0, const uint16_t* b1, int64_t depth_blocks,
                float* sums) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < depth_blocks; ++kb) {
    _tile_loadd(4, a + kb * kDepth, lda * 2);
    _tile_loadd(6, b0 + kb * 16 * kDepth, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + kb * 16 * kDepth, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + 16 * lda + kb * kDepth, lda * 2);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, sums, kCols * 4);
  _tile_stored(1, sums + 16, kCols * 4);
  _tile_stored(2, sums + 16 * kCols, kCols * 4);
  _tile_stored(3, sums + 16 * kCols + 16, kCols * 4);
}

// y[r][0..32) = bf16(sums[r] + bias) for r < rows; y's row stride ldy.
void store_block(const float* sums, const float* bias, int64_t rows, uint16_t* y, int64_t ldy) {
  const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(sums + r * kCols), b0);
    const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(sums + r * kCols + 16), b1);
    const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
    _mm512_storeu_si512(y + r * ldy, (__m512i)v);
  }
}

// Output columns [c0, c1) (multiples of 32) of y = x @ w^T + bias for every row; `tail`: the
// rows past the last whole block of 32, zero-padded to 32 rows (unused when there are none).
// No std:: templates here: their instances would carry this region's instruction sets.
void linear_columns(const uint16_t* x, const uint16_t* tail, int64_t rows, int64_t depth, const uint16_t* packed,
                    const float* bias, uint16_t* y, int64_t n, int64_t c0, int64_t c1) {
  configure_tiles();
  const int64_t depth_blocks = depth / kDepth, tile_stride = depth_blocks * 16 * kDepth;
  alignas(64) float sums[kRows * kCols];
  const int64_t full = rows / kRows * kRows;
  // Columns in chunks whose B tiles stay in L2 while every block of rows (in L1) passes them.
  for (int64_t cc = c0; cc < c1; cc += kChunkCols) {
    const int64_t ce = cc + kChunkCols < c1 ? cc + kChunkCols : c1;
    for (int64_t r = 0; r < rows; r += kRows) {
      const uint16_t* a = r < full ? x + r * depth : tail;
      const int64_t block_rows = r < full ? kRows : rows - full;
      for (int64_t c = cc; c < ce; c += kCols) {
        const uint16_t* b0 = packed + (c / 16) * tile_stride;
        block_sums(a, depth, b0, b0 + tile_stride, depth_blocks, sums);
        store_block(sums, bias ? bias + c : nullptr, block_rows, y + r * n + c, n);
      }
    }
  }
  _tile_release();
}

#pragma GCC pop_options

void check_packed(const torch::Tensor& p) {
  TORCH_CHECK(p.scalar_type() == at::kShort && p.dim() == 4 && p.size(2) == 16 && p.size(3) == kDepth &&
                  p.size(0) % 2 == 0 && p.is_contiguous() && p.device().is_cpu(),
              "amx: packed weight int16 [n / 16, k / 32, 16, 32] (n a multiple of 32)");
}

}  // namespace

bool amx_permitted() {
  // Linux hands a process the AMX tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
  static const bool ok = cpu_has_amx_bf16() && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

bool amx_available() { return amx_permitted(); }

torch::Tensor amx_pack(torch::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.device().is_cpu(), "amx_pack: bfloat16 [n, k]");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n % kCols == 0 && k % kDepth == 0, "amx_pack: n a multiple of 32 and k of 32, got [", n, ", ", k, "]");
  // [n, k] -> [n/16, 16 (c), k/32, 16 (r), 2] -> [n/16, k/32, r, c, 2]
  return w.contiguous().view(at::kShort).view({n / 16, 16, k / kDepth, 16, 2}).permute({0, 2, 3, 1, 4})
      .contiguous().view({n / 16, k / kDepth, 16, kDepth});
}

torch::Tensor amx_unpack(torch::Tensor p) {
  check_packed(p);
  const int64_t n = p.size(0) * 16, k = p.size(1) * kDepth;
  return p.view({n / 16, k / kDepth, 16, 16, 2}).permute({0, 3, 1, 2, 4}).contiguous().view({n, k}).view(at::kBFloat16);
}

torch::Tensor amx_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(amx_permitted(), "amx_linear: this CPU has no AMX-BF16 (or the kernel did not grant its tiles)");
  check_packed(packed);
  const int64_t n = packed.size(0) * 16, k = packed.size(1) * kDepth;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == k && x.device().is_cpu(),
              "amx_linear: x bfloat16 [rows, ", k, "]");
  x = x.contiguous();
  torch::Tensor b;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n, "amx_linear: bias of ", n, " values");
    b = bias->to(at::kFloat).contiguous();
  }
  const int64_t rows = x.size(0);
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<int16_t>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const int64_t full = rows / kRows * kRows;
  std::vector<uint16_t> tail;  // rows [full, rows), zero-padded to a block of 32
  if (full < rows) {
    tail.assign(kRows * k, 0);
    std::memcpy(tail.data(), xp + full * k, (rows - full) * k * 2);
  }
  at::parallel_for(0, n / kCols, 1, [&](int64_t begin, int64_t end) {
    linear_columns(xp, tail.data(), rows, k, pp, bp, yp, n, begin * kCols, end * kCols);
  });
  return y;
}

void bind_amx(pybind11::module_& m) {
  m.def("amx_available", &amx_available);
  m.def("amx_pack", &amx_pack, NoGil());
  m.def("amx_unpack", &amx_unpack, NoGil());
  m.def("amx_linear", &amx_linear, NoGil(), pybind11::arg("x"), pybind11::arg("packed"),
        pybind11::arg("bias") = pybind11::none());
}

}  // namespace strata
