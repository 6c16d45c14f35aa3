// Fused CPU ops for the decode step (strata/models/fused.py loads them; torch ops otherwise).
//
// A decode step is ~80 small eager ops per layer at one to eight rows: each costs more in
// dispatch and round trips than in work. These do the same arithmetic in one pass each:
//   rms_norm(x, w, eps)                    y = x / sqrt(mean(x^2) + eps) * w, float accumulation
//   add_rms_norm(x, d, w, eps)             x += d (in place), then y = rms_norm(x)
//   rope_write(qkv, cos, sin, k_cache, v_cache, write_index, heads, kv_heads)
//       qkv [tokens, (heads + 2 kv_heads) dim]: rotates q and k (rotate-half, cos/sin
//       [tokens, dim / 2]), writes k and v into cell write_index[t] of the caches
//       [kv_heads, cells, dim], returns q [tokens, heads, dim]
//   decode_attention(q, k, v, spans, row_spans, scale)
//       q [rows, heads, dim] (rows strided, heads and dim contiguous); k, v [kv_heads, cells, dim]; row r attends to the cells of
//       spans[row_spans[r] : row_spans[r + 1]], each span (first cell, count), in order:
//       exact softmax attention (online, float32), K/V read in place, never gathered.
// Tensors are bfloat16 or float32 and contiguous in their last dim (checked in Python).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }

template <typename T>
void rms_row(const T* x, const T* w, T* y, int64_t n, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) { float v = to_f(x[i]); ss += v * v; }
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  // As torch's rms_norm: normalise in float32, round to T, then multiply by the weight.
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<float>(static_cast<T>(to_f(x[i]) * inv)) * to_f(w[i]));
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  auto y = torch::empty_like(x);
  const int64_t rows = x.size(0), n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) rms_row(xp + r * n, wp, yp + r * n, n, static_cast<float>(eps));
    });
  });
  return y;
}

torch::Tensor add_rms_norm(torch::Tensor x, torch::Tensor d, torch::Tensor w, double eps) {
  auto y = torch::empty_like(x);
  const int64_t rows = x.size(0), n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "add_rms_norm", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* dp = d.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* xr = xp + r * n;
        const scalar_t* dr = dp + r * n;
        for (int64_t i = 0; i < n; ++i) xr[i] = static_cast<scalar_t>(to_f(xr[i]) + to_f(dr[i]));
        rms_row(xr, wp, yp + r * n, n, static_cast<float>(eps));
      }
    });
  });
  return y;
}

// exp(x) for x <= 0 in float32 (relative error ~2e-7), written so a loop of it vectorizes:
// x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-6 Taylor polynomial, 2^n by the exponent bits.
inline float exp_nonpos(float x) {
  x = std::max(x, -87.f);
  const float n = std::nearbyint(x * 1.44269504f);
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.f / 720;
  p = p * r + 1.f / 120; p = p * r + 1.f / 24; p = p * r + 1.f / 6; p = p * r + 0.5f; p = p * r + 1.f; p = p * r + 1.f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(n) << 23;
  std::memcpy(&p, &bits, 4);
  return p;
}

template <typename T>
void attend_one(const T* q, int64_t group, int64_t dim, const T* k, const T* v, int64_t cell_stride,
                const int64_t* spans, int64_t num_spans, float scale, T* out) {
  // q: `group` query heads [group, dim] sharing one K/V head; k, v: that head's cells.
  // Online softmax over blocks of cells: scores, block max, rescale, accumulate V.
  constexpr int64_t kMaxGroup = 16, kMaxDim = 256, kBlock = 32;
  alignas(64) float qf[kMaxGroup][kMaxDim], acc[kMaxGroup][kMaxDim], s[kMaxGroup][kBlock];
  alignas(64) float blk[kBlock][kMaxDim];
  float m[kMaxGroup], l[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < dim; ++i) { qf[h][i] = to_f(q[h * dim + i]) * scale; acc[h][i] = 0.f; }
    m[h] = -INFINITY;
    l[h] = 0.f;
  }
  for (int64_t sp = 0; sp < num_spans; ++sp) {
    const int64_t first = spans[2 * sp], count = spans[2 * sp + 1];
    for (int64_t b = 0; b < count; b += kBlock) {
      const int64_t nb = std::min(kBlock, count - b);
      for (int64_t j = 0; j < nb; ++j) {
        const T* kr = k + (first + b + j) * cell_stride;
        for (int64_t i = 0; i < dim; ++i) blk[j][i] = to_f(kr[i]);
      }
      for (int64_t h = 0; h < group; ++h) {
        for (int64_t j = 0; j < nb; ++j) {
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < dim; ++i) dot += qf[h][i] * blk[j][i];
          s[h][j] = dot;
        }
        float mb = m[h];
        for (int64_t j = 0; j < nb; ++j) mb = std::max(mb, s[h][j]);
        const float corr = std::exp(m[h] - mb);  // 0 on the first block (m = -inf)
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < nb; ++j) { s[h][j] = exp_nonpos(s[h][j] - mb); sum += s[h][j]; }
        l[h] = l[h] * corr + sum;
        for (int64_t i = 0; i < dim; ++i) acc[h][i] *= corr;
        m[h] = mb;
      }
      for (int64_t j = 0; j < nb; ++j) {
        const T* vr = v + (first + b + j) * cell_stride;
        for (int64_t i = 0; i < dim; ++i) blk[j][i] = to_f(vr[i]);
      }
      for (int64_t h = 0; h < group; ++h)
        for (int64_t j = 0; j < nb; ++j) {
          const float p = s[h][j];
#pragma omp simd
          for (int64_t i = 0; i < dim; ++i) acc[h][i] += p * blk[j][i];
        }
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    for (int64_t i = 0; i < dim; ++i) out[h * dim + i] = static_cast<T>(acc[h][i] * inv);
  }
}

torch::Tensor rope_write(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                         torch::Tensor v_cache, torch::Tensor write_index, int64_t heads, int64_t kv_heads) {
  const int64_t tokens = qkv.size(0), dim = k_cache.size(2), half = dim / 2;
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim && qkv.stride(1) == 1, "rope_write: qkv shape");
  TORCH_CHECK(k_cache.stride(2) == 1 && v_cache.stride(2) == 1, "rope_write: cache layout");
  auto q = torch::empty({tokens, heads, dim}, qkv.options());
  const int64_t* cells = write_index.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, qkv.scalar_type(), "rope_write", [&] {
    const scalar_t* x = qkv.data_ptr<scalar_t>();
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* kc = k_cache.data_ptr<scalar_t>();
    scalar_t* vc = v_cache.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* xt = x + t * qkv.stride(0);
        const scalar_t* ct = c + t * cos.stride(0);
        const scalar_t* st = s + t * sin.stride(0);
        // Rotate-half on every q and k head: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin].
        for (int64_t h = 0; h < heads + kv_heads; ++h) {
          const scalar_t* in = xt + h * dim;
          scalar_t* out = h < heads ? qp + (t * heads + h) * dim
                                    : kc + (h - heads) * k_cache.stride(0) + cells[t] * k_cache.stride(1);
          for (int64_t i = 0; i < half; ++i) {
            const float a = to_f(in[i]), b = to_f(in[i + half]), cc = to_f(ct[i]), ss = to_f(st[i]);
            out[i] = static_cast<scalar_t>(a * cc - b * ss);
            out[i + half] = static_cast<scalar_t>(b * cc + a * ss);
          }
        }
        const scalar_t* vt = xt + (heads + kv_heads) * dim;
        for (int64_t h = 0; h < kv_heads; ++h)
          std::memcpy(vc + h * v_cache.stride(0) + cells[t] * v_cache.stride(1), vt + h * dim, dim * sizeof(scalar_t));
      }
    });
  });
  return q;
}

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor spans,
                               torch::Tensor row_spans, double scale) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k.size(0), group = heads / kv_heads;
  TORCH_CHECK(group <= 16 && dim <= 256, "decode_attention: at most 16 query heads per K/V head, dim 256");
  TORCH_CHECK(k.stride(1) == v.stride(1) && k.stride(0) == v.stride(0), "decode_attention: k and v strides differ");
  auto out = torch::empty({rows, heads, dim}, q.options());
  const int64_t q_row = q.stride(0);
  const int64_t* sp = spans.data_ptr<int64_t>();
  const int64_t* rs = row_spans.data_ptr<int64_t>();
  const int64_t head_stride = k.stride(0), cell_stride = k.stride(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "decode_attention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t r = item / kv_heads, h = item % kv_heads;
        const int64_t offset = (r * heads + h * group) * dim;  // out is contiguous; q's heads are
        attend_one(qp + r * q_row + h * group * dim, group, dim, kp + h * head_stride, vp + h * head_stride,
                   cell_stride, sp + 2 * rs[r], rs[r + 1] - rs[r], static_cast<float>(scale), op + offset);
      }
    });
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm);
  m.def("add_rms_norm", &add_rms_norm);
  m.def("decode_attention", &decode_attention);
  m.def("rope_write", &rope_write);
}
