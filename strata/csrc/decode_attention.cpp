// Decode attention over spans of K/V storage, for every decoding lane in one call.
//
//   decode_attention(q, k_cache, v_cache, spans, row_spans, scale, k_more=None, v_more=None,
//                    k_scales=[], v_scales=[]) -> out
//     q         [rows, heads, dim]: one query row per lane (rows may be strided; dim contiguous)
//     k_cache   [kv_heads, cells, dim], v_cache the same: storage, dim contiguous; q's dtype,
//               or int8 with k_scales/v_scales: float16 [kv_heads, cells] per storage (k_cache's,
//               then k_more's), cells contiguous, read as int8 x scale rounded to q's dtype
//     k_more    optional second storage [kv_heads, more cells, dim] (v_more the same) with the
//               same cell stride: flat cells cells .. cells + more - 1 are its cells 0 .. more - 1
//               (the ring's staging beside its arena); a span lies in one storage
//     spans     [S, 2] int64: (first flat cell, cells) runs of storage
//     row_spans [rows + 1] int64: row r attends to spans[row_spans[r] : row_spans[r + 1]], in order
//     out       [rows, heads, dim] = softmax(scale q K^T) V over the row's cells, grouped-query:
//               query head h reads K/V head h / (heads / kv_heads).
//
// Work is split into tasks (row, kv head, block of BLOCK consecutive positions); each task
// writes its block's (max, sum of exp, sum of exp * V) for the group's query heads, and a
// second pass merges a row's blocks by their maxima (flash-decoding). Every read of K/V is
// in place: a lane's cells are never gathered, padded or masked. Accumulation is float32,
// bfloat16 or float32 K/V. The block work runs the instruction set chosen at run time
// (attention.h): AVX-512 where cpuid has it (with AVX-512 BF16: bfloat16 keys' dot products by
// vdpbf16ps), else AVX2 + FMA (the module's build flags).
//
//   attention_isa() / attention_isas() / set_attention_isa(name): the variant that runs
//       ("avx2", "avx512", "avx512_bf16"), the ones this CPU has, and a choice among them ("auto": the best).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "attention.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <cmath>
#include <vector>

namespace strata {
namespace {

using attn::BLOCK;
using attn::MAX_DIM;
using attn::MAX_GROUP;
using attn::Segment;

// One K/V head's rows in up to two storages: flat cell c is base[0] + c * cell_stride below
// `split`, else base[1] + (c - split) * cell_stride (K and V alike).
struct HeadRows {
  const char* k[2];
  const char* v[2];
  const uint16_t* ks[2];  // int8 cells' scales (float16 bits), one per cell; null for float cells
  const uint16_t* vs[2];
  int64_t split, cell_bytes;
  const void* key(int64_t c) const { return c < split ? k[0] + c * cell_bytes : k[1] + (c - split) * cell_bytes; }
  const void* value(int64_t c) const { return c < split ? v[0] + c * cell_bytes : v[1] + (c - split) * cell_bytes; }
  const uint16_t* key_scale(int64_t c) const { return ks[0] == nullptr ? nullptr : c < split ? ks[0] + c : ks[1] + (c - split); }
  const uint16_t* value_scale(int64_t c) const { return vs[0] == nullptr ? nullptr : c < split ? vs[0] + c : vs[1] + (c - split); }
};

// The storage segments of positions [from, to) of a row whose spans are `spans[0 .. n)`.
int cut(const int64_t* spans, int64_t n, int64_t from, int64_t to, const HeadRows& head, Segment* out) {
  int m = 0;
  int64_t pos = 0;
  for (int64_t s = 0; s < n && pos < to; ++s) {
    const int64_t first = spans[2 * s], count = spans[2 * s + 1];
    const int64_t a = std::max(from, pos), b = std::min(to, pos + count);
    if (a < b) {
      const int64_t c = first + (a - pos);
      out[m++] = {head.key(c), head.value(c), head.key_scale(c), head.value_scale(c), b - a};
    }
    pos += count;
  }
  return m;
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool cpu_has_avx512_bf16() { return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16"); }

const attn::Kernels* best_kernels() {
  if (cpu_has_avx512_bf16()) return &attn::avx512_bf16_kernels();
  return cpu_has_avx512() ? &attn::avx512_kernels() : &attn::avx2_kernels();
}

std::atomic<const attn::Kernels*>& chosen() {
  static std::atomic<const attn::Kernels*> kernels{best_kernels()};
  return kernels;
}

// The block work for q's dtype over cells of q's dtype, or over int8 cells (`int8`).
inline attn::BlockF32 block_kernel(const attn::Kernels& kern, float, bool int8) { return int8 ? kern.i8_f32 : kern.f32; }
inline attn::BlockF32 block_kernel(const attn::Kernels& kern, c10::BFloat16, bool int8) {
  return int8 ? kern.i8_bf16 : kern.bf16;
}

// Head h's row of storage i's [kv_heads, cells] scales (null: float cells). With one storage,
// storage 1 names storage 0's, as head_rows' k1/v1 do.
const uint16_t* scale_row(const std::vector<torch::Tensor>& scales, size_t i, int64_t h) {
  if (scales.empty()) return nullptr;
  const torch::Tensor& s = scales[std::min(i, scales.size() - 1)];
  return reinterpret_cast<const uint16_t*>(s.data_ptr<at::Half>()) + h * s.stride(0);
}

// K/V head h's rows: storage 0 (`cache`), then storage 1 (`more`, or none) past its cells.
HeadRows head_rows(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor* k_more,
                   const torch::Tensor* v_more, const std::vector<torch::Tensor>& k_scales,
                   const std::vector<torch::Tensor>& v_scales, int64_t h) {
  const int64_t es = k.element_size();
  const char* k0 = static_cast<const char*>(k.data_ptr()) + h * k.stride(0) * es;
  const char* v0 = static_cast<const char*>(v.data_ptr()) + h * v.stride(0) * es;
  const char* k1 = k_more ? static_cast<const char*>(k_more->data_ptr()) + h * k_more->stride(0) * es : k0;
  const char* v1 = v_more ? static_cast<const char*>(v_more->data_ptr()) + h * v_more->stride(0) * es : v0;
  return HeadRows{{k0, k1}, {v0, v1}, {scale_row(k_scales, 0, h), scale_row(k_scales, 1, h)},
                  {scale_row(v_scales, 0, h), scale_row(v_scales, 1, h)}, k.size(1), k.stride(1) * es};
}

template <typename scalar_t>
void run(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const torch::Tensor* k_more, const torch::Tensor* v_more, const std::vector<torch::Tensor>& k_scales,
         const std::vector<torch::Tensor>& v_scales, const int64_t* sp, const int64_t* rs,
         double scale, int64_t rows, int64_t heads, int64_t dim, int64_t kv_heads, int64_t group,
         const std::vector<int64_t>& length, const std::vector<int64_t>& blocks,
         const std::vector<int64_t>& task_first, std::vector<float>& parts, torch::Tensor& out) {
  const int64_t tasks = task_first[rows], stride = dim + 2;
  const attn::BlockF32 block = block_kernel(*chosen().load(), scalar_t{}, !k_scales.empty());
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const int64_t cell_stride = k_cache.stride(1);
    std::vector<HeadRows> head(kv_heads);
    for (int64_t h = 0; h < kv_heads; ++h) head[h] = head_rows(k_cache, v_cache, k_more, v_more, k_scales, v_scales, h);
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      alignas(32) float qf[MAX_GROUP * MAX_DIM];
      Segment seg[BLOCK];
      int64_t r = std::upper_bound(task_first.begin(), task_first.end(), begin) - task_first.begin() - 1;
      for (int64_t t = begin; t < end; ++t) {
        while (t >= task_first[r + 1]) ++r;
        const int64_t h = (t - task_first[r]) / blocks[r], b = (t - task_first[r]) % blocks[r];
        const int64_t from = b * BLOCK, to = std::min(length[r], from + BLOCK);
        const int nseg = cut(sp + 2 * rs[r], rs[r + 1] - rs[r], from, to, head[h], seg);
        for (int64_t g = 0; g < group; ++g) {
          const scalar_t* qh = qp + r * q.stride(0) + (h * group + g) * q.stride(1);
          for (int64_t d = 0; d < dim; ++d) qf[g * dim + d] = static_cast<float>(qh[d]) * static_cast<float>(scale);
        }
        block(qf, group, dim, cell_stride, seg, nseg, to - from, parts.data() + t * group * stride);
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
                               torch::Tensor row_spans, double scale, c10::optional<torch::Tensor> k_more,
                               c10::optional<torch::Tensor> v_more, std::vector<torch::Tensor> k_scales,
                               std::vector<torch::Tensor> v_scales) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(0), split = k_cache.size(1);
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(2) == 1 && v_cache.stride(2) == 1, "decode_attention: dim not contiguous");
  TORCH_CHECK(k_cache.strides() == v_cache.strides() && k_cache.sizes() == v_cache.sizes(), "decode_attention: k and v differ");
  // int8 cells come with a scale tensor per storage, for K and V alike; float cells in q's dtype
  const at::ScalarType cell_type = k_scales.empty() ? q.scalar_type() : at::kChar;
  TORCH_CHECK(cell_type == k_cache.scalar_type() && cell_type == v_cache.scalar_type(),
              "decode_attention: K/V must be q's dtype, or int8 with k_scales and v_scales");
  const size_t storages = k_more ? 2 : 1;
  TORCH_CHECK(k_scales.size() == v_scales.size() && (k_scales.empty() || k_scales.size() == storages),
              "decode_attention: one k and one v scale tensor per storage");
  for (size_t i = 0; i < k_scales.size(); ++i) {
    const torch::Tensor& cells = i == 0 ? k_cache : *k_more;
    for (const torch::Tensor* s : {&k_scales[i], &v_scales[i]})
      TORCH_CHECK(s->scalar_type() == at::kHalf && s->dim() == 2 && s->size(0) == kv_heads &&
                      s->size(1) == cells.size(1) && s->stride(1) == 1,
                  "decode_attention: scales must be float16 [kv_heads, cells], cells contiguous");
  }
  TORCH_CHECK(k_more.has_value() == v_more.has_value(), "decode_attention: k_more and v_more come together");
  int64_t cells = split;
  if (k_more) {
    const torch::Tensor& km = *k_more;
    const torch::Tensor& vm = *v_more;
    TORCH_CHECK(km.sizes() == vm.sizes() && km.strides() == vm.strides(), "decode_attention: k_more and v_more differ");
    TORCH_CHECK(km.dim() == 3 && km.size(0) == kv_heads && km.size(2) == dim && km.stride(2) == 1 &&
                    km.stride(1) == k_cache.stride(1), "decode_attention: k_more's heads, dim or cell stride");
    TORCH_CHECK(km.scalar_type() == cell_type && vm.scalar_type() == cell_type, "decode_attention: dtypes differ");
    cells += km.size(1);
  }
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
      TORCH_CHECK(sp[2 * s] >= split || sp[2 * s] + sp[2 * s + 1] <= split, "decode_attention: a span crosses into k_more");
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
  const torch::Tensor* km = k_more ? &*k_more : nullptr;
  const torch::Tensor* vm = v_more ? &*v_more : nullptr;
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "decode_attention: float32 or bfloat16");
  AT_DISPATCH_SWITCH(q.scalar_type(), "decode_attention", AT_DISPATCH_CASE(at::kFloat, [&] {
    run<scalar_t>(q, k_cache, v_cache, km, vm, k_scales, v_scales, sp, rs, scale, rows, heads, dim, kv_heads, group, length, blocks, task_first, parts, out);
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    run<scalar_t>(q, k_cache, v_cache, km, vm, k_scales, v_scales, sp, rs, scale, rows, heads, dim, kv_heads, group, length, blocks, task_first, parts, out);
  }));
  return out;
}

std::string attention_isa() { return chosen().load()->name; }

std::vector<std::string> attention_isas() {
  std::vector<std::string> names{attn::avx2_kernels().name};
  if (cpu_has_avx512()) names.push_back(attn::avx512_kernels().name);
  if (cpu_has_avx512_bf16()) names.push_back(attn::avx512_bf16_kernels().name);
  return names;
}

void set_attention_isa(const std::string& name) {
  if (name == "auto") return chosen().store(best_kernels());
  if (name == attn::avx2_kernels().name) return chosen().store(&attn::avx2_kernels());
  if (name == attn::avx512_kernels().name) {
    TORCH_CHECK(cpu_has_avx512(), "set_attention_isa: this CPU has no AVX-512 (F, BW, VL, DQ)");
    return chosen().store(&attn::avx512_kernels());
  }
  if (name == attn::avx512_bf16_kernels().name) {
    TORCH_CHECK(cpu_has_avx512_bf16(), "set_attention_isa: this CPU has no AVX-512 BF16");
    return chosen().store(&attn::avx512_bf16_kernels());
  }
  TORCH_CHECK(false, "set_attention_isa: unknown instruction set '", name, "' (auto, avx2, avx512, avx512_bf16)");
}

}  // namespace strata
