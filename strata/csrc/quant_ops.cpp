// The torch-facing quantized ops (strata/models/quant.py calls them):
//   quant_matmul(x, weights, types, int8) -> y
//       x [rows, k] float32 or bfloat16 (k contiguous); weights: the parts of one projection,
//       each uint8 [out_i, row_bytes] (GGML blocks of types[i], see quant.h), side by side
//       along the output: y [rows, sum out_i] in x's dtype. int8: activations quantized to
//       8 bits per block and integer dot products; else float32 activations and dequantised
//       weights. Threads split the output rows (at::parallel_for on torch's threads); each
//       weight row is read once for all activation rows.
//   quant_dequant_rows(w, type, ids, dtype) -> [n, k]: rows ids of w dequantised (embedding lookups)
//   quant_isa() / quant_isas() / set_quant_isa(name): the instruction set the kernels run
//       ("avx2", "avx512_vnni"), the ones this CPU has, and a choice among them ("auto": the best).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "quant.h"

namespace strata {
namespace {

bool cpu_has_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

const quant::Kernels* best_kernels() { return cpu_has_vnni() ? &quant::vnni_kernels() : &quant::avx2_kernels(); }

std::atomic<const quant::Kernels*>& chosen() {
  static std::atomic<const quant::Kernels*> kernels{best_kernels()};
  return kernels;
}

int64_t checked_k(const torch::Tensor& w, int64_t type, int64_t k, const char* what) {
  const int bv = quant::block_values(static_cast<int>(type)), bb = quant::block_bytes(static_cast<int>(type));
  TORCH_CHECK(bv > 0, what, ": GGML type ", type, " is not read in place");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous(), what, ": uint8 [out, bytes] contiguous");
  if (k < 0) k = w.size(1) / bb * bv;
  TORCH_CHECK(k % bv == 0 && w.size(1) == k / bv * bb, what, ": ", k, " values need rows of ", k / bv * bb,
              " bytes of type ", type, ", got ", w.size(1));
  return k;
}

template <typename T>
void store_column(const float* v, int64_t rows, T* y, int64_t n, int64_t col) {
  for (int64_t j = 0; j < rows; ++j) y[j * n + col] = static_cast<T>(v[j]);
}

}  // namespace

torch::Tensor quant_matmul(torch::Tensor x, std::vector<torch::Tensor> weights, std::vector<int64_t> types, bool int8) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "quant_matmul: x [rows, k] with k contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "quant_matmul: float32 or bfloat16 x");
  TORCH_CHECK(!weights.empty() && weights.size() == types.size(), "quant_matmul: one type per weight");
  const int64_t rows = x.size(0), k = x.size(1);
  std::vector<int64_t> first{0};  // output column where each part starts
  bool need32 = false, need256 = false;
  for (size_t p = 0; p < weights.size(); ++p) {
    checked_k(weights[p], types[p], k, "quant_matmul");
    (quant::block_values(static_cast<int>(types[p])) == 32 ? need32 : need256) = true;
    first.push_back(first.back() + weights[p].size(0));
  }
  const int64_t n = first.back();
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return y;
  const torch::Tensor xf = x.to(at::kFloat).contiguous();
  const float* xp = xf.data_ptr<float>();
  const quant::Kernels& kern = *chosen().load();

  quant::Act act;
  act.k = k;
  torch::Tensor q32, d32, s32, q256, d256, bsums;  // the quantized rows (kept alive for the call)
  if (int8) {
    const auto i8 = x.options().dtype(at::kChar), f32 = x.options().dtype(at::kFloat);
    if (need32) {
      q32 = torch::empty({rows, k}, i8), d32 = torch::empty({rows, k / 32}, f32), s32 = torch::empty({rows, k / 32}, f32);
      act.q = q32.data_ptr<int8_t>(), act.d32 = d32.data_ptr<float>(), act.s32 = s32.data_ptr<float>();
    }
    if (need256) {
      q256 = torch::empty({rows, k}, i8), d256 = torch::empty({rows, k / 256}, f32);
      bsums = torch::empty({rows, k / 16}, x.options().dtype(at::kShort));
      act.q256 = q256.data_ptr<int8_t>(), act.d256 = d256.data_ptr<float>(), act.bsums = bsums.data_ptr<int16_t>();
    }
    at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        if (need32)
          kern.quantize32(xp + j * k, k, q32.data_ptr<int8_t>() + j * k, d32.data_ptr<float>() + j * (k / 32),
                          s32.data_ptr<float>() + j * (k / 32));
        if (need256)
          kern.quantize256(xp + j * k, k, q256.data_ptr<int8_t>() + j * k, d256.data_ptr<float>() + j * (k / 256),
                           bsums.data_ptr<int16_t>() + j * (k / 16));
      }
    });
  }

  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> column(rows), scratch(256);
    for (size_t p = 0; p < weights.size(); ++p) {
      const int64_t lo = std::max(begin, first[p]), hi = std::min(end, first[p + 1]);
      const int type = static_cast<int>(types[p]);
      const uint8_t* w = weights[p].data_ptr<uint8_t>();
      const int64_t row_bytes = weights[p].size(1);
      for (int64_t c = lo; c < hi; ++c) {
        const uint8_t* wr = w + (c - first[p]) * row_bytes;
        if (int8) kern.int8_dot(type, wr, act, rows, column.data());
        else kern.float_dot(type, wr, k, xp, rows, column.data(), scratch.data());
        if (y.scalar_type() == at::kFloat) store_column(column.data(), rows, y.data_ptr<float>(), n, c);
        else store_column(column.data(), rows, y.data_ptr<c10::BFloat16>(), n, c);
      }
    }
  });
  return y;
}

torch::Tensor quant_dequant_rows(torch::Tensor w, int64_t type, torch::Tensor ids, at::ScalarType dtype) {
  const int64_t k = checked_k(w, type, -1, "quant_dequant_rows");
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1, "quant_dequant_rows: ids [n] int64");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "quant_dequant_rows: float32 or bfloat16 out");
  const torch::Tensor idc = ids.contiguous();
  const int64_t count = idc.size(0), out_rows = w.size(0), row_bytes = w.size(1);
  const int64_t* id = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < out_rows, "quant_dequant_rows: row ", id[i], " outside [0, ", out_rows, ")");
  auto out = torch::empty({count, k}, w.options().dtype(at::kFloat));
  const quant::Kernels& kern = *chosen().load();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) kern.dequant_row(static_cast<int>(type), wp + id[i] * row_bytes, k, op + i * k);
  });
  return dtype == at::kFloat ? out : out.to(dtype);
}

std::string quant_isa() { return chosen().load()->name; }

std::vector<std::string> quant_isas() {
  std::vector<std::string> names{quant::avx2_kernels().name};
  if (cpu_has_vnni()) names.push_back(quant::vnni_kernels().name);
  return names;
}

void set_quant_isa(const std::string& name) {
  if (name == "auto") return chosen().store(best_kernels());
  if (name == quant::avx2_kernels().name) return chosen().store(&quant::avx2_kernels());
  if (name == quant::vnni_kernels().name) {
    TORCH_CHECK(cpu_has_vnni(), "set_quant_isa: this CPU has no AVX-512 VNNI");
    return chosen().store(&quant::vnni_kernels());
  }
  TORCH_CHECK(false, "set_quant_isa: unknown instruction set '", name, "' (auto, avx2, avx512_vnni)");
}

}  // namespace strata
