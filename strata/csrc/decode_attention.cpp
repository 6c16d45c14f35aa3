// Decode attention over spans of K/V storage, for every decoding lane in one call.
//
//   decode_attention(q, k_cache, v_cache, spans, row_spans, scale) -> out
//     q         [rows, heads, dim]: one query row per lane (rows may be strided; dim contiguous)
//     k_cache   [kv_heads, cells, dim], v_cache the same: storage, dim contiguous
//     spans     [S, 2] int64: (first flat cell, cells) runs of storage
//     row_spans [rows + 1] int64: row r attends to spans[row_spans[r] : row_spans[r + 1]], in order
//     out       [rows, heads, dim] = softmax(scale q K^T) V over the row's cells, grouped-query:
//               query head h reads K/V head h / (heads / kv_heads).
//
// Work is split into tasks (row, kv head, block of BLOCK consecutive positions); each task
// writes its block's (max, sum of exp, sum of exp * V) for the group's query heads, and a
// second pass merges a row's blocks by their maxima (flash-decoding). Every read of K/V is
// in place: a lane's cells are never gathered, padded or masked. Accumulation is float32;
// AVX2 + FMA (the module's build flags, vec.h), bfloat16 or float32 K/V.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "vec.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata {
namespace {

constexpr int64_t BLOCK = 128;  // positions per task (a multiple of 8)
constexpr int64_t MAX_GROUP = 16;
constexpr int64_t MAX_DIM = 256;

struct Segment {
  int64_t cell, count;  // flat cells cell .. cell + count - 1
};

// The storage segments of positions [from, to) of a row whose spans are `spans[0 .. n)`.
int cut(const int64_t* spans, int64_t n, int64_t from, int64_t to, Segment* out) {
  int m = 0;
  int64_t pos = 0;
  for (int64_t s = 0; s < n && pos < to; ++s) {
    const int64_t first = spans[2 * s], count = spans[2 * s + 1];
    const int64_t a = std::max(from, pos), b = std::min(to, pos + count);
    if (a < b) out[m++] = {first + (a - pos), b - a};
    pos += count;
  }
  return m;
}

// out[g][0..dim) += sum_j p[g][j] v_j over the segments, for GC query heads at once.
template <typename T, int GC>
void accumulate_v(const float* p, int64_t p_stride, const T* v, int64_t cell_stride, const Segment* seg, int nseg,
                  int64_t dim, float* out, int64_t out_stride) {
  for (int64_t d = 0; d < dim; d += 16) {
    __m256 acc[GC][2];
    for (int g = 0; g < GC; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
    int64_t j = 0;
    for (int s = 0; s < nseg; ++s) {
      const T* row = v + seg[s].cell * cell_stride + d;
      for (int64_t c = 0; c < seg[s].count; ++c, ++j, row += cell_stride) {
        const __m256 v0 = load8(row), v1 = load8(row + 8);
        for (int g = 0; g < GC; ++g) {
          const __m256 w = _mm256_broadcast_ss(p + g * p_stride + j);
          acc[g][0] = _mm256_fmadd_ps(w, v0, acc[g][0]);
          acc[g][1] = _mm256_fmadd_ps(w, v1, acc[g][1]);
        }
      }
    }
    for (int g = 0; g < GC; ++g) {
      _mm256_storeu_ps(out + g * out_stride + d, acc[g][0]);
      _mm256_storeu_ps(out + g * out_stride + d + 8, acc[g][1]);
    }
  }
}

// One task: query heads qf[group][dim] (float, scaled) over one block's segments. Writes
// part[g] = (max, sum of exp, dim sums of exp * v).
template <typename T>
void attend_block(const float* qf, int64_t group, int64_t dim, const T* k, const T* v, int64_t cell_stride,
                  const Segment* seg, int nseg, int64_t len, float* part) {
  alignas(32) float scores[MAX_GROUP * BLOCK];
  alignas(32) float kf[8 * MAX_DIM];  // 8 cells' keys in float32
  const T* rows[8];
  int64_t j = 0;
  int s = 0;
  int64_t c = 0;
  while (j < len) {  // 8 cells at a time: 8 independent dot products per query head
    int n = 0;
    for (; n < 8 && j + n < len; ++n) {
      if (c == seg[s].count) { ++s; c = 0; }
      rows[n] = k + (seg[s].cell + c++) * cell_stride;
    }
    for (int i = 0; i < 8; ++i) {
      float* dst = kf + i * dim;
      if (i < n) {
        for (int64_t d = 0; d < dim; d += 8) _mm256_store_ps(dst + d, load8(rows[i] + d));
      } else {
        for (int64_t d = 0; d < dim; d += 8) _mm256_store_ps(dst + d, _mm256_setzero_ps());
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf + g * dim;
      __m256 a[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < dim; d += 8) {
        const __m256 qv = _mm256_load_ps(qg + d);
        for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, _mm256_load_ps(kf + i * dim + d), a[i]);
      }
      // Transposed reduction: lane i of the result is the sum of a[i].
      const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
      const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
      _mm256_store_ps(scores + g * BLOCK + j, sum);  // j is a multiple of 8 and BLOCK of 8
    }
    j += n;
  }
  // Scores past `len` in the last 8 (zero keys) are padding: -inf for the max, 0 after exp.
  const int64_t padded = (len + 7) / 8 * 8;
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = len; i < padded; ++i) scores[g * BLOCK + i] = -INFINITY;
  const int64_t stride = dim + 2;
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * BLOCK;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < padded; i += 8) mv = _mm256_max_ps(mv, _mm256_load_ps(sg + i));
    mv = _mm256_max_ps(mv, _mm256_permute2f128_ps(mv, mv, 1));
    mv = _mm256_max_ps(mv, _mm256_shuffle_ps(mv, mv, 0x4e));
    mv = _mm256_max_ps(mv, _mm256_shuffle_ps(mv, mv, 0xb1));  // every lane holds the maximum
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < padded; i += 8) {
      const __m256 x = _mm256_load_ps(sg + i);
      // exp8 clamps -inf to e^-87: the padding is zeroed by the mask of real scores.
      const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(x, mv)), _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
      _mm256_store_ps(sg + i, e);
      sum = _mm256_add_ps(sum, e);
    }
    part[g * stride] = _mm256_cvtss_f32(mv);
    part[g * stride + 1] = hsum8(sum);
  }
  for (int64_t g0 = 0; g0 < group; g0 += 4) {
    const int64_t gc = std::min<int64_t>(4, group - g0);
    const float* p = scores + g0 * BLOCK;
    float* out = part + g0 * stride + 2;
    switch (gc) {
      case 1: accumulate_v<T, 1>(p, BLOCK, v, cell_stride, seg, nseg, dim, out, stride); break;
      case 2: accumulate_v<T, 2>(p, BLOCK, v, cell_stride, seg, nseg, dim, out, stride); break;
      case 3: accumulate_v<T, 3>(p, BLOCK, v, cell_stride, seg, nseg, dim, out, stride); break;
      default: accumulate_v<T, 4>(p, BLOCK, v, cell_stride, seg, nseg, dim, out, stride); break;
    }
  }
}

template <typename scalar_t>
void run(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const int64_t* sp,
         const int64_t* rs, double scale, int64_t rows, int64_t heads, int64_t dim, int64_t kv_heads, int64_t group,
         const std::vector<int64_t>& length, const std::vector<int64_t>& blocks,
         const std::vector<int64_t>& task_first, std::vector<float>& parts, torch::Tensor& out) {
  const int64_t tasks = task_first[rows], stride = dim + 2;
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k_cache.data_ptr<scalar_t>();
    const scalar_t* vp = v_cache.data_ptr<scalar_t>();
    const int64_t head_stride = k_cache.stride(0), cell_stride = k_cache.stride(1);
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      alignas(32) float qf[MAX_GROUP * MAX_DIM];
      Segment seg[BLOCK];
      int64_t r = std::upper_bound(task_first.begin(), task_first.end(), begin) - task_first.begin() - 1;
      for (int64_t t = begin; t < end; ++t) {
        while (t >= task_first[r + 1]) ++r;
        const int64_t h = (t - task_first[r]) / blocks[r], b = (t - task_first[r]) % blocks[r];
        const int64_t from = b * BLOCK, to = std::min(length[r], from + BLOCK);
        const int nseg = cut(sp + 2 * rs[r], rs[r + 1] - rs[r], from, to, seg);
        for (int64_t g = 0; g < group; ++g) {
          const scalar_t* qh = qp + r * q.stride(0) + (h * group + g) * q.stride(1);
          for (int64_t d = 0; d < dim; ++d) qf[g * dim + d] = static_cast<float>(qh[d]) * static_cast<float>(scale);
        }
        attend_block(qf, group, dim, kp + h * head_stride, vp + h * head_stride, cell_stride, seg, nseg, to - from,
                     parts.data() + t * group * stride);
      }
    });
    // Merge each (row, kv head)'s blocks: weights e^(m_b - M), normalised by the summed exps.
    at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t rh = begin; rh < end; ++rh) {
        const int64_t r = rh / kv_heads, h = rh % kv_heads;
        const float* first = parts.data() + (task_first[r] + h * blocks[r]) * group * stride;
        for (int64_t g = 0; g < group; ++g) {
          float m = -INFINITY;
          for (int64_t b = 0; b < blocks[r]; ++b) m = std::max(m, first[(b * group + g) * stride]);
          float acc[MAX_DIM] = {0};
          float l = 0.f;
          for (int64_t b = 0; b < blocks[r]; ++b) {
            const float* pb = first + (b * group + g) * stride;
            const float w = std::exp(pb[0] - m);
            l += w * pb[1];
            for (int64_t d = 0; d < dim; ++d) acc[d] += w * pb[2 + d];
          }
          scalar_t* o = out.data_ptr<scalar_t>() + (r * heads + h * group + g) * dim;
          for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<scalar_t>(acc[d] / l);
        }
      }
    });
}

}  // namespace

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor spans,
                               torch::Tensor row_spans, double scale) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(0), cells = k_cache.size(1);
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(2) == 1 && v_cache.stride(2) == 1, "decode_attention: dim not contiguous");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(), "decode_attention: k and v differ");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(), "decode_attention: dtypes differ");
  TORCH_CHECK(heads % kv_heads == 0 && heads / kv_heads <= MAX_GROUP, "decode_attention: query heads per K/V head");
  TORCH_CHECK(dim % 16 == 0 && dim <= MAX_DIM, "decode_attention: head dim must be a multiple of 16, at most 256");
  TORCH_CHECK(spans.is_contiguous() && spans.dim() == 2 && spans.size(1) == 2 && row_spans.numel() == rows + 1,
              "decode_attention: spans layout");
  const int64_t group = heads / kv_heads;
  const int64_t* sp = spans.data_ptr<int64_t>();
  const int64_t* rs = row_spans.data_ptr<int64_t>();
  // Tasks: (row, kv head, block); task_first[r] is row r's first task.
  std::vector<int64_t> length(rows), blocks(rows), task_first(rows + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t n = 0;
    for (int64_t s = rs[r]; s < rs[r + 1]; ++s) {
      TORCH_CHECK(sp[2 * s] >= 0 && sp[2 * s + 1] >= 0 && sp[2 * s] + sp[2 * s + 1] <= cells, "decode_attention: span outside storage");
      n += sp[2 * s + 1];
    }
    TORCH_CHECK(n > 0, "decode_attention: a row with no cells");
    length[r] = n;
    blocks[r] = (n + BLOCK - 1) / BLOCK;
    task_first[r + 1] = task_first[r] + kv_heads * blocks[r];
  }
  const int64_t tasks = task_first[rows], stride = dim + 2;
  std::vector<float> parts(static_cast<size_t>(tasks * group * stride));
  auto out = torch::empty({rows, heads, dim}, q.options());
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "decode_attention: float32 or bfloat16");
  AT_DISPATCH_SWITCH(q.scalar_type(), "decode_attention", AT_DISPATCH_CASE(at::kFloat, [&] {
    run<scalar_t>(q, k_cache, v_cache, sp, rs, scale, rows, heads, dim, kv_heads, group, length, blocks, task_first, parts, out);
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    run<scalar_t>(q, k_cache, v_cache, sp, rs, scale, rows, heads, dim, kv_heads, group, length, blocks, task_first, parts, out);
  }));
  return out;
}

}  // namespace strata
