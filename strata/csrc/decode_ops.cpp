// Fused CPU ops for the decode step (strata/models/fused.py loads them; torch ops otherwise).
//
// A decode step is ~80 small eager ops per layer at one to eight rows: each costs more in
// dispatch and round trips than in work. These do the same arithmetic in one pass each:
//   rms_norm(x, w, eps)                    y = x / sqrt(mean(x^2) + eps) * w, float accumulation
//   add_rms_norm(x, d, w, eps)             x += d (in place), then y = rms_norm(x)
//   rope_write(qkv, cos, sin, k_caches, v_caches, write_indices, heads, kv_heads, k_scales=[], v_scales=[])
//       qkv [tokens, (heads + 2 kv_heads) dim]: rotates q and k (rotate-half, cos/sin
//       [tokens, dim / 2]), writes k and v into cell write_indices[j][t] of every pair of
//       caches k_caches[j], v_caches[j] [kv_heads, cells, dim] (the ring's arena or staging and
//       the pool's copy: one rotation, several stores; a cell of -1: token t is not stored
//       in that copy), returns q [tokens, heads, dim]; with scales, int8 caches and their float16
//       scales [kv_heads, cells] (int8 cells: each row quantised once, kv_int8.h)
//   silu_mul(gate_up)                      gate_up [rows, 2 n] -> silu(gate) * up [rows, n]
//   DecodeLayer: a decoder layer's decode step from these ops in one call (decode_layer.cpp)
//   decode_attention(q, k_cache, v_cache, spans, row_spans, scale, k_more=None, v_more=None, k_scales=[], v_scales=[])
//       (decode_attention.cpp; k_more/v_more: a second storage past the first's cells; the scales: int8 cells')
//   copy_cells(dsts, srcs, runs)          the ring's page copies in one call (copy_cells.cpp)
//   attention_isa, attention_isas, set_attention_isa: its instruction set (AVX-512 or AVX2)
//   QuantLinear, Quant4x8Linear, quant_matmul, quant_dequant_rows, quant_isa, quant_isas, set_quant_isa:
//       quantized GGUF weights read in place (quant_ops.cpp)
// Tensors are bfloat16 or float32 and contiguous in their last dim (checked in Python).
// Built with -fopenmp: at::parallel_for then runs on torch's own OpenMP threads (the
// extension's libgomp.so.1 is the one torch has already loaded).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "activation.h"
#include "decode_ops.h"
#include "kv_int8.h"
#include "quant_ops.h"
#include "vec.h"

namespace {

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }

// 8 lanes a step (vec.h), the rest one at a time; the sum of squares in 8 partial sums.
template <typename T>
void rms_row(const T* x, const T* w, T* y, int64_t n, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = strata::load8(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = strata::hsum8(acc);
  for (; i < n; ++i) { float v = to_f(x[i]); ss += v * v; }
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  // As torch's rms_norm: normalise in float32, round to T, then multiply by the weight.
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    strata::store8(y + i, _mm256_mul_ps(strata::round_to(_mm256_mul_ps(strata::load8(x + i), iv), x), strata::load8(w + i)));
  for (; i < n; ++i) y[i] = static_cast<T>(static_cast<float>(static_cast<T>(to_f(x[i]) * inv)) * to_f(w[i]));
}

// x[i] = x[i] + d[i], rounded to T once.
template <typename T>
void add_row(T* x, const T* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) strata::store8(x + i, _mm256_add_ps(strata::load8(x + i), strata::load8(d + i)));
  for (; i < n; ++i) x[i] = static_cast<T>(to_f(x[i]) + to_f(d[i]));
}

// Rotate-half: [a, b] -> [a cos - b sin, b cos + a sin], each rounded to T (half values each).
template <typename T>
void rotate_half(const T* in, const T* c, const T* s, T* out, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = strata::load8(in + i), b = strata::load8(in + half + i);
    const __m256 cc = strata::load8(c + i), ss = strata::load8(s + i);
    strata::store8(out + i, _mm256_fmsub_ps(a, cc, _mm256_mul_ps(b, ss)));
    strata::store8(out + half + i, _mm256_fmadd_ps(b, cc, _mm256_mul_ps(a, ss)));
  }
  for (; i < half; ++i) {
    const float a = to_f(in[i]), b = to_f(in[i + half]), cc = to_f(c[i]), ss = to_f(s[i]);
    out[i] = static_cast<T>(a * cc - b * ss);
    out[i + half] = static_cast<T>(b * cc + a * ss);
  }
}

}  // namespace

// float32 and bfloat16: the types the vectorised rows (vec.h) load and store.
#define STRATA_DISPATCH_F32_BF16(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

namespace strata {

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  auto y = torch::empty_like(x);
  const int64_t rows = x.size(0), n = x.size(1);
  STRATA_DISPATCH_F32_BF16(x.scalar_type(), "rms_norm", [&] {
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
  STRATA_DISPATCH_F32_BF16(x.scalar_type(), "add_rms_norm", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* dp = d.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* xr = xp + r * n;
        add_row(xr, dp + r * n, n);
        rms_row(xr, wp, yp + r * n, n, static_cast<float>(eps));
      }
    });
  });
  return y;
}

torch::Tensor rope_write(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_caches,
                         std::vector<torch::Tensor> v_caches, std::vector<torch::Tensor> write_indices, int64_t heads,
                         int64_t kv_heads, std::vector<torch::Tensor> k_scales, std::vector<torch::Tensor> v_scales) {
  const size_t copies = k_caches.size();
  TORCH_CHECK(copies > 0 && v_caches.size() == copies && write_indices.size() == copies, "rope_write: destinations");
  const bool int8 = !k_scales.empty();  // int8 cells: every destination int8, with its float16 scales
  TORCH_CHECK(!int8 || (k_scales.size() == copies && v_scales.size() == copies), "rope_write: one scale per destination");
  TORCH_CHECK(int8 || v_scales.empty(), "rope_write: scales for K and V, or none");
  const int64_t tokens = qkv.size(0), dim = k_caches[0].size(2), half = dim / 2;
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim && qkv.stride(1) == 1, "rope_write: qkv shape");
  std::vector<const int64_t*> cells(copies);
  for (size_t j = 0; j < copies; ++j) {
    TORCH_CHECK(k_caches[j].stride(2) == 1 && v_caches[j].stride(2) == 1 && k_caches[j].size(2) == dim &&
                    v_caches[j].size(2) == dim, "rope_write: cache layout");
    const at::ScalarType stored = int8 ? at::kChar : qkv.scalar_type();
    TORCH_CHECK(k_caches[j].scalar_type() == stored && v_caches[j].scalar_type() == stored, "rope_write: cache dtype");
    TORCH_CHECK(write_indices[j].scalar_type() == at::kLong && write_indices[j].is_contiguous() &&
                    write_indices[j].numel() == tokens, "rope_write: write index");
    cells[j] = write_indices[j].data_ptr<int64_t>();
    const int64_t size = k_caches[j].size(1);
    for (int64_t t = 0; t < tokens; ++t)
      TORCH_CHECK(cells[j][t] >= -1 && cells[j][t] < size, "rope_write: cell ", cells[j][t], " outside [0, ", size, ")");
    if (int8)
      for (const torch::Tensor* sc : {&k_scales[j], &v_scales[j]})
        TORCH_CHECK(sc->scalar_type() == at::kHalf && sc->dim() == 2 && sc->size(0) == k_caches[j].size(0) &&
                        sc->size(1) == size, "rope_write: float16 scales [kv_heads, cells] beside each int8 cache");
  }
  auto q = torch::empty({tokens, heads, dim}, qkv.options());
  STRATA_DISPATCH_F32_BF16(qkv.scalar_type(), "rope_write", [&] {
    const scalar_t* x = qkv.data_ptr<scalar_t>();
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    scalar_t* qp = q.data_ptr<scalar_t>();
    // Stores head h's row of token t (k: rotated; v: as projected) into every destination.
    auto store = [&](std::vector<torch::Tensor>& caches, std::vector<torch::Tensor>& scales, int64_t t, int64_t h,
                     const scalar_t* row, int8_t* codes) {
      c10::Half scale;
      if (int8) scale = quantise_kv_row(row, dim, codes);
      for (size_t j = 0; j < copies; ++j) {
        if (cells[j][t] < 0) continue;
        const int64_t at = h * caches[j].stride(0) + cells[j][t] * caches[j].stride(1);
        if (int8) {
          std::memcpy(static_cast<int8_t*>(caches[j].data_ptr()) + at, codes, dim);
          static_cast<c10::Half*>(scales[j].data_ptr())[h * scales[j].stride(0) + cells[j][t] * scales[j].stride(1)] =
              scale;
        } else {
          std::memcpy(static_cast<scalar_t*>(caches[j].data_ptr()) + at, row, dim * sizeof(scalar_t));
        }
      }
    };
    at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> rotated(dim);
      std::vector<int8_t> codes(dim);
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* xt = x + t * qkv.stride(0);
        const scalar_t* ct = c + t * cos.stride(0);
        const scalar_t* st = s + t * sin.stride(0);
        // Rotate-half on every q and k head: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin].
        for (int64_t h = 0; h < heads + kv_heads; ++h) {
          scalar_t* out = h < heads ? qp + (t * heads + h) * dim : rotated.data();
          rotate_half(xt + h * dim, ct, st, out, half);
          if (h >= heads) store(k_caches, k_scales, t, h - heads, out, codes.data());
        }
        const scalar_t* vt = xt + (heads + kv_heads) * dim;
        for (int64_t h = 0; h < kv_heads; ++h) store(v_caches, v_scales, t, h, vt + h * dim, codes.data());
      }
    });
  });
  return q;
}

template <typename T>
void silu_mul_row(const T* g, const T* u, T* y, int64_t n) {
  // As torch: silu(gate) = gate / (1 + e^-gate) rounds to T, then the product rounds again.
  // The AVX-512 row does the same per lane, 16 lanes at a time (activation_avx512.cpp).
  int64_t i = silu_mul_avx512_ok() ? silu_mul_avx512(g, u, y, n) : 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = strata::load8(g + i);
    const __m256 e = strata::exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));
    const __m256 s = strata::round_to(_mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.f), e)), g);
    strata::store8(y + i, _mm256_mul_ps(s, strata::load8(u + i)));
  }
  for (; i < n; ++i) {
    const float a = to_f(g[i]);
    y[i] = static_cast<T>(to_f(static_cast<T>(a / (1.f + std::exp(-a)))) * to_f(u[i]));
  }
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.stride(1) == 1 && gate_up.size(1) == 2 * n, "silu_mul: gate_up layout");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16, "silu_mul: dtype");
  auto y = torch::empty({rows, n}, gate_up.options());
  AT_DISPATCH_SWITCH(gate_up.scalar_type(), "silu_mul", AT_DISPATCH_CASE(at::kFloat, [&] {
    const scalar_t* gp = gate_up.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) silu_mul_row(gp + r * gate_up.stride(0), gp + r * gate_up.stride(0) + n, yp + r * n, n);
    });
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    const scalar_t* gp = gate_up.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) silu_mul_row(gp + r * gate_up.stride(0), gp + r * gate_up.stride(0) + n, yp + r * n, n);
    });
  }));
  return y;
}

}  // namespace strata

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &strata::rms_norm, strata::NoGil());
  m.def("add_rms_norm", &strata::add_rms_norm, strata::NoGil());
  m.def("rope_write", &strata::rope_write, strata::NoGil(), py::arg("qkv"), py::arg("cos"), py::arg("sin"),
        py::arg("k_caches"), py::arg("v_caches"), py::arg("write_indices"), py::arg("heads"), py::arg("kv_heads"),
        py::arg("k_scales") = std::vector<torch::Tensor>{}, py::arg("v_scales") = std::vector<torch::Tensor>{});
  m.def("silu_mul", &strata::silu_mul, strata::NoGil());
  strata::bind_decode_layer(m);
  strata::bind_amx(m);
  strata::bind_amx_attention(m);
  strata::bind_copy_cells(m);
  m.def("decode_attention", &strata::decode_attention, strata::NoGil(), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("spans"), py::arg("row_spans"), py::arg("scale"), py::arg("k_more") = py::none(),
        py::arg("v_more") = py::none(), py::arg("k_scales") = std::vector<torch::Tensor>{},
        py::arg("v_scales") = std::vector<torch::Tensor>{});
  m.def("attention_isa", &strata::attention_isa);
  m.def("attention_isas", &strata::attention_isas);
  m.def("set_attention_isa", &strata::set_attention_isa);
  pybind11::class_<strata::QuantLinear>(m, "QuantLinear")
      .def(pybind11::init<std::vector<torch::Tensor>, std::vector<int64_t>>())
      .def("__call__", &strata::QuantLinear::forward, strata::NoGil())
      .def_property_readonly("in_features", &strata::QuantLinear::in_features)
      .def_property_readonly("out_features", &strata::QuantLinear::out_features);
  pybind11::class_<strata::Quant4x8Linear>(m, "Quant4x8Linear")
      .def(pybind11::init<torch::Tensor, int64_t, int64_t, int64_t, int64_t>(), pybind11::arg("packed"),
           pybind11::arg("out_features"), pybind11::arg("in_features"), pybind11::arg("act_bits") = 8,
           pybind11::arg("weight_bits") = 4)
      .def("__call__", &strata::Quant4x8Linear::forward, strata::NoGil())
      .def_property_readonly("in_features", &strata::Quant4x8Linear::in_features)
      .def_property_readonly("out_features", &strata::Quant4x8Linear::out_features)
      .def_property_readonly("act_bits", &strata::Quant4x8Linear::act_bits)
      .def_property_readonly("weight_bits", &strata::Quant4x8Linear::weight_bits);
  m.def("quant_matmul", &strata::quant_matmul, strata::NoGil());
  m.def("quant_dequant_rows", &strata::quant_dequant_rows, strata::NoGil());
  m.def("quant_isa", &strata::quant_isa);
  m.def("quant_isas", &strata::quant_isas);
  m.def("set_quant_isa", &strata::set_quant_isa);
}
