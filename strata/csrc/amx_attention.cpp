// Causal attention of a prompt piece on AMX tiles (AMX-BF16), bfloat16:
//   prompt_attention(q, k_cache, v_cache, spans, scale) -> out
//   q [rows, heads, dim] bfloat16 (dim % 32 == 0, dim <= 256; rows and heads any strides, dims
//   contiguous); k_cache, v_cache [kv_heads, cells, dim] bfloat16 (dims contiguous); spans
//   [runs, 2] long: (first flat cell, cells), in position order, n cells in all (n >= rows).
//   Row r is position n - rows + r and attends to positions 0..n - rows + r. out [rows, heads, dim].
// Each K/V head's keys and values are first copied into tdpbf16ps's B-tile layouts (keys
// zero-padded to a multiple of 32); then each query head's rows, 32 at a time: scores over every
// key the block sees (float32 sums of bfloat16 products), a softmax per row in float32 (e^x as
// 2^x, a polynomial and a scaling), its weights rounded to bfloat16 and summed with the values in float32,
// divided by the row's float32 weight sum, rounded once to bfloat16. A row's result depends on
// its own query and the cells it sees, not on the rows beside it.
// Only the kernel functions are compiled for AMX and AVX-512 (target pragma); the op checks
// amx_permitted() first.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "decode_ops.h"

namespace strata {
namespace {

constexpr int64_t kBlock = 32;  // query rows a block (two A tiles of 16) and keys a step (two B tiles)
constexpr int64_t kTile = 512;  // uint16 values a B tile holds (16 rows of 64 bytes)

// The keys and values of one K/V head in B-tile layouts, keys [0, n32) (zero past n):
// keys: tile (j, d) at (j * dim / 32 + d) * kTile holds, row r, column c, the pair of dims
//       (32 d + 2 r, + 1) of key 16 j + c (scores: queries . keys);
// values: tile (t, u) at (t * dim / 16 + u) * kTile holds, row r, column c, dim 16 u + c of
//       keys 32 t + 2 r and + 1 (outputs: weights . values).
void pack_step(const uint16_t* k, const uint16_t* v, int64_t cell_stride, const int64_t* cell_of, int64_t n,
               int64_t dim, int64_t t, uint16_t* kp, uint16_t* vp) {
  const int64_t depth = dim / 32, cols = dim / 16;
  for (int64_t c = 0; c < kBlock; ++c) {  // keys: 32-bit pairs of dims, transposed
    const int64_t key = kBlock * t + c;
    const auto* src = key < n ? reinterpret_cast<const uint32_t*>(k + cell_of[key] * cell_stride) : nullptr;
    const int64_t j = key / 16, col = key % 16;
    for (int64_t d = 0; d < depth; ++d) {
      auto* tile = reinterpret_cast<uint32_t*>(kp + (j * depth + d) * kTile);
      for (int64_t r = 0; r < 16; ++r) tile[r * 16 + col] = src ? src[16 * d + r] : 0;
    }
  }
  for (int64_t r = 0; r < 16; ++r) {  // values: two keys' dims interleaved
    const int64_t a = kBlock * t + 2 * r, b = a + 1;
    const uint16_t* va = a < n ? v + cell_of[a] * cell_stride : nullptr;
    const uint16_t* vb = b < n ? v + cell_of[b] * cell_stride : nullptr;
    for (int64_t u = 0; u < cols; ++u) {
      uint16_t* row = vp + (t * cols + u) * kTile + r * 32;
      for (int64_t c = 0; c < 16; ++c) {
        row[2 * c] = va ? va[16 * u + c] : 0;
        row[2 * c + 1] = vb ? vb[16 * u + c] : 0;
      }
    }
  }
}

// A thread's scratch, sized for the longest block: scores and weights [32, n32], the block's
// queries zero-padded [32, dim], one 32 x 32 output block, the rows' 1 / weight sums.
struct Scratch {
  float* scores;
  uint16_t* weights;
  uint16_t* queries;
  float* outs;
  float* inv_sums;
};

// One block of a query head's rows: where its queries, packed K/V, and output are.
struct Block {
  const uint16_t* q;  // row 0's query
  int64_t q_stride;  // uint16 values from a row's query to the next's
  int64_t rows;  // 1..32
  int64_t first;  // the position of row 0 (it sees keys 0..first)
  const uint16_t* kp;
  const uint16_t* vp;
  uint16_t* out;  // row 0's output
  int64_t out_stride;
};

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

void configure_tiles() {  // 8 tiles of 16 rows x 64 bytes: 0-3 sums, 4-5 A, 6-7 B
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// 2^t for t <= 0 (t = -inf gives 0): 2^(t - n) by a degree-5 polynomial on [-1/2, 1/2] (relative
// error about 2e-7), scaled by 2^n; far below the weights' bfloat16 rounding.
inline __m512 exp2_16(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 first_lanes(int64_t count) {  // lanes [0, count) of 16
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

// scores [32, keys] (row stride keys) = the block's queries . keys [0, keys), keys % 32 == 0.
void block_scores(const uint16_t* a, int64_t lda, const uint16_t* kp, int64_t dim, int64_t keys, float* scores) {
  const int64_t depth = dim / 32;
  for (int64_t step = 0; step < keys / kBlock; ++step) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* b0 = kp + 2 * step * depth * kTile;
    const uint16_t* b1 = b0 + depth * kTile;
    for (int64_t d = 0; d < depth; ++d) {
      _tile_loadd(4, a + d * 32, lda * 2);
      _tile_loadd(6, b0 + d * kTile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b1 + d * kTile, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a + 16 * lda + d * 32, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* s = scores + step * kBlock;
    _tile_stored(0, s, keys * 4);
    _tile_stored(1, s + 16, keys * 4);
    _tile_stored(2, s + 16 * keys, keys * 4);
    _tile_stored(3, s + 16 * keys + 16, keys * 4);
  }
}

// weights[i] = bf16(e^(scale s - max)) over row i's keys [0, seen), 0 past them; returns 1 / their float32 sum.
float row_weights(const float* s, int64_t seen, int64_t keys, float scale, uint16_t* w) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < seen; j += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), first_lanes(seen - j), s + j));
  // e^(scale s - m) = 2^(s scale log2(e) - m log2(e)): one fused multiply-subtract a score
  const float to2 = scale * 1.44269504088896341f;
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx) * to2), sc = _mm512_set1_ps(to2);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < keys; j += 16) {
    __m512 e = _mm512_setzero_ps();
    if (j < seen) {
      e = _mm512_maskz_mov_ps(first_lanes(seen - j), exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), sc, m)));
      sum = _mm512_add_ps(sum, e);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + j), (__m256i)_mm512_cvtneps_pbh(e));
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// outs [32, 32] = weights [32, keys] . values' dims [32 c, 32 c + 32).
void block_outputs(const uint16_t* w, int64_t keys, const uint16_t* vp, int64_t dim, int64_t c, float* outs) {
  const int64_t cols = dim / 16;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t step = 0; step < keys / kBlock; ++step) {
    const uint16_t* b0 = vp + (step * cols + 2 * c) * kTile;
    _tile_loadd(4, w + step * kBlock, keys * 2);
    _tile_loadd(6, b0, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b0 + kTile, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, w + 16 * keys + step * kBlock, keys * 2);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, outs, kBlock * 4);
  _tile_stored(1, outs + 16, kBlock * 4);
  _tile_stored(2, outs + 16 * kBlock, kBlock * 4);
  _tile_stored(3, outs + 16 * kBlock + 16, kBlock * 4);
}

void attend_block(const Block& b, int64_t dim, float scale, const Scratch& sc) {
  // Keys the block reads: through its last row's own, rounded up to whole steps (masked).
  const int64_t keys = (b.first + b.rows + kBlock - 1) / kBlock * kBlock;
  const uint16_t* a = b.q;
  int64_t lda = b.q_stride;
  if (b.rows < kBlock) {  // a last, short block: its queries zero-padded to 32 rows
    std::memset(sc.queries, 0, kBlock * dim * 2);
    for (int64_t i = 0; i < b.rows; ++i) std::memcpy(sc.queries + i * dim, b.q + i * b.q_stride, dim * 2);
    a = sc.queries;
    lda = dim;
  }
  block_scores(a, lda, b.kp, dim, keys, sc.scores);
  for (int64_t i = 0; i < kBlock; ++i) {
    if (i < b.rows) {
      sc.inv_sums[i] = row_weights(sc.scores + i * keys, b.first + i + 1, keys, scale, sc.weights + i * keys);
    } else {
      std::memset(sc.weights + i * keys, 0, keys * 2);
    }
  }
  for (int64_t c = 0; c < dim / kBlock; ++c) {
    block_outputs(sc.weights, keys, b.vp, dim, c, sc.outs);
    for (int64_t i = 0; i < b.rows; ++i) {
      const __m512 inv = _mm512_set1_ps(sc.inv_sums[i]);
      const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(sc.outs + i * kBlock), inv);
      const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(sc.outs + i * kBlock + 16), inv);
      _mm512_storeu_si512(b.out + i * b.out_stride + c * kBlock, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

void attend_blocks(const Block* blocks, int64_t count, int64_t dim, float scale, const Scratch& sc) {
  configure_tiles();
  for (int64_t i = 0; i < count; ++i) attend_block(blocks[i], dim, scale, sc);
  _tile_release();
}

#pragma GCC pop_options

}  // namespace

torch::Tensor prompt_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor spans,
                               double scale) {
  TORCH_CHECK(amx_permitted(), "prompt_attention: this CPU has no AMX-BF16 (or the kernel did not grant its tiles)");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16,
              "prompt_attention: bfloat16 q and caches");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(),
              "prompt_attention: q [rows, heads, dim], caches [kv_heads, cells, dim]");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = k_cache.size(0);
  TORCH_CHECK(dim % 32 == 0 && dim <= 256 && k_cache.size(2) == dim, "prompt_attention: dim a multiple of 32 up to 256");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "prompt_attention: heads a multiple of kv_heads");
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(2) == 1 && v_cache.stride(2) == 1 &&
                  k_cache.strides() == v_cache.strides() && k_cache.stride(1) >= dim,
              "prompt_attention: dims contiguous, the caches alike");
  TORCH_CHECK(spans.scalar_type() == at::kLong && spans.dim() == 2 && spans.size(1) == 2 && spans.is_contiguous(),
              "prompt_attention: spans long [runs, 2]");
  const int64_t* sp = spans.data_ptr<int64_t>();
  std::vector<int64_t> cell_of;  // the flat cell of each position
  for (int64_t s = 0; s < spans.size(0); ++s) {
    TORCH_CHECK(sp[2 * s] >= 0 && sp[2 * s + 1] >= 0 && sp[2 * s] + sp[2 * s + 1] <= k_cache.size(1),
                "prompt_attention: a span past the cache");
    for (int64_t c = 0; c < sp[2 * s + 1]; ++c) cell_of.push_back(sp[2 * s] + c);
  }
  const int64_t n = static_cast<int64_t>(cell_of.size());
  TORCH_CHECK(rows <= n, "prompt_attention: ", rows, " rows over ", n, " cells");
  auto out = torch::empty({rows, heads, dim}, q.options());
  if (rows == 0) return out;
  const int64_t steps = (n + kBlock - 1) / kBlock, n32 = steps * kBlock, per_head = n32 * dim;
  std::vector<uint16_t> kp(kv_heads * per_head), vp(kv_heads * per_head);
  const auto* kc = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>());
  const auto* vc = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>());
  at::parallel_for(0, kv_heads * steps, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / steps, t = i % steps;
      pack_step(kc + g * k_cache.stride(0), vc + g * v_cache.stride(0), k_cache.stride(1), cell_of.data(), n, dim, t,
                kp.data() + g * per_head, vp.data() + g * per_head);
    }
  });
  const int64_t blocks = (rows + kBlock - 1) / kBlock, group = heads / kv_heads;
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  std::vector<Block> work(heads * blocks);  // head-major: a thread's range holds whole heads' rows, long and short
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t bl = 0; bl < blocks; ++bl) {
      const int64_t r0 = bl * kBlock;
      work[h * blocks + bl] = Block{qp + r0 * q.stride(0) + h * q.stride(1), q.stride(0),
                                    std::min(kBlock, rows - r0), n - rows + r0,
                                    kp.data() + (h / group) * per_head, vp.data() + (h / group) * per_head,
                                    op + (r0 * heads + h) * dim, heads * dim};
    }
  }
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kBlock * n32), outs(kBlock * kBlock), inv(kBlock);
    std::vector<uint16_t> weights(kBlock * n32), queries(kBlock * dim);
    const Scratch sc{scores.data(), weights.data(), queries.data(), outs.data(), inv.data()};
    attend_blocks(work.data() + begin, end - begin, dim, static_cast<float>(scale), sc);
  });
  return out;
}

void bind_amx_attention(pybind11::module_& m) {
  m.def("prompt_attention", &prompt_attention, NoGil(), pybind11::arg("q"), pybind11::arg("k_cache"),
        pybind11::arg("v_cache"), pybind11::arg("spans"), pybind11::arg("scale"));
}

}  // namespace strata
