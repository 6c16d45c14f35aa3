// The torch-facing quantized ops (strata/models/quant.py calls them):
//   QuantLinear(weights, types): the parts of one projection, each uint8 [out_i, row_bytes]
//       (GGML blocks of types[i], see quant.h), side by side along the output.
//     (x, int8) -> y: x [rows, k] float32 or bfloat16, contiguous; y [rows, sum out_i] in x's
//       dtype. int8: activations quantized to 8 bits per block and integer dot products;
//       else float32 activations and dequantised weights. Threads split the output rows
//       (at::parallel_for on torch's threads); each weight row is read once for all rows.
//   quant_matmul(x, weights, types, int8): the same through a temporary QuantLinear
//   Quant4x8Linear(packed, out, in, act_bits, weight_bits): 4-bit weights in the x8 layout
//       (quant_x8.inc, packed by strata/models/q4x8.py), uint8 [ceil(out / 8), in / 32 * 160],
//       Q5_0's 5-bit values in the q5x8 layout (weight_bits 5), [ceil(out / 8), in / 32 * 176], or
//       Q8_0's 8-bit values in the q8x8 layout (weight_bits 8), [ceil(out / 8), in / 32 * 272].
//     (x) -> y: x [rows, in] float32 or bfloat16, y [rows, out] in x's dtype; activations
//       act_bits (8 or 15) per value, one scale per 32-value block. Threads split the groups
//       of 8 columns.
//   quant_dequant_rows(w, type, ids, dtype) -> [n, k]: rows ids of w dequantised (embedding lookups)
//   quant_isa() / quant_isas() / set_quant_isa(name): the instruction set the kernels run
//       ("avx2", "avx_vnni", "avx512_vnni"), the ones this CPU has, and a choice among them ("auto":
//       the best).

#include "quant_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <immintrin.h>

#include "quant.h"

namespace strata {
namespace {

bool cpu_has_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

bool cpu_has_avx_vnni() { return __builtin_cpu_supports("avxvnni"); }

// AVX-512 VNNI, else AVX-VNNI, else AVX2 (the same outputs: only the speed differs).
const quant::Kernels* best_kernels() {
  return cpu_has_vnni() ? &quant::vnni_kernels() : cpu_has_avx_vnni() ? &quant::avxvnni_kernels() : &quant::avx2_kernels();
}

std::atomic<const quant::Kernels*>& chosen() {
  static std::atomic<const quant::Kernels*> kernels{best_kernels()};
  return kernels;
}

int64_t checked_k(const torch::Tensor& w, int64_t type, int64_t k, const char* what) {
  const int bv = quant::block_values(static_cast<int>(type)), bb = quant::block_bytes(static_cast<int>(type));
  TORCH_CHECK(bv > 0, what, ": GGML type ", type, " is not read in place");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(), what,
              ": uint8 [out, bytes] contiguous on the CPU");
  if (k < 0) k = w.size(1) / bb * bv;
  TORCH_CHECK(k % bv == 0 && w.size(1) == k / bv * bb, what, ": ", k, " values need rows of ", k / bv * bb,
              " bytes of type ", type, ", got ", w.size(1));
  return k;
}

template <typename T>
void store_column(const float* v, int64_t rows, T* y, int64_t n, int64_t col) {
  for (int64_t j = 0; j < rows; ++j) y[j * n + col] = static_cast<T>(v[j]);
}

// The calling thread's memory for one call's activations (grown, never freed: no allocation per call).
unsigned char* scratch(size_t bytes) {
  thread_local std::vector<unsigned char> buf;
  if (buf.size() < bytes) buf.resize(bytes + (bytes >> 1));
  return buf.data();
}

// The rows stream from memory (a step reads every layer's weights once): a column's row is
// fetched this many bytes ahead of its dot products, so the fetch is in flight while the rows
// between are worked on (the hardware prefetcher alone leaves the dot products waiting).
constexpr int64_t kRowPrefetchBytes = 4096;

inline void prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

inline size_t round64(size_t n) { return (n + 63) & ~size_t{63}; }

// x [rows, k] (float32 or bfloat16, contiguous) quantized to 8 bits in the calling thread's
// scratch memory (valid until its next call): for the 32-value types and/or the K-quants.
quant::Act quantize_rows(const torch::Tensor& x, const quant::Kernels& kern, bool need32, bool need256) {
  const int64_t rows = x.size(0), k = x.size(1);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  quant::Act act;
  act.k = k;
  act.pitch = (rows + 7) / 8 * 8;
  const size_t nb = need32 ? k / 32 : 0, nsb = need256 ? k / 256 : 0, nq = need32 + need256;
  const size_t qbytes = round64(rows * k), scales = round64(sizeof(float) * act.pitch * (3 * nb + nsb));
  unsigned char* buf = scratch(nq * qbytes + scales + round64(sizeof(int16_t) * rows * (k / 16)));
  float* f = reinterpret_cast<float*>(buf + nq * qbytes);
  std::memset(f, 0, scales);  // the padding rows' scales are 0
  if (need32) {
    act.q = reinterpret_cast<int8_t*>(buf), act.d32 = f, act.s32 = f + act.pitch * nb;
    act.i32 = reinterpret_cast<int32_t*>(f + 2 * act.pitch * nb);
  }
  if (need256) {
    act.q256 = reinterpret_cast<int8_t*>(buf + need32 * qbytes), act.d256 = f + 3 * act.pitch * nb;
    act.bsums = reinterpret_cast<int16_t*>(buf + nq * qbytes + scales);
  }
  const void* xp = x.data_ptr();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    quant::Act mine = act;  // each thread writes only its own rows
    for (int64_t j = begin; j < end; ++j) kern.quantize(xp, bf16, j, mine, need32, need256);
  });
  return act;
}

// x [rows, k] at 15 bits per value for the x8 kernel (quant_x8.inc's quantize15), in the
// calling thread's scratch memory (valid until its next call).
quant::Act quantize15_rows(const torch::Tensor& x, const quant::Kernels& kern) {
  const int64_t rows = x.size(0), k = x.size(1);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  quant::Act act;
  act.k = k;
  act.pitch = (rows + 7) / 8 * 8;
  const size_t qbytes = round64(rows * k), scales = round64(sizeof(float) * act.pitch * 3 * (k / 32));
  unsigned char* buf = scratch(2 * qbytes + scales);
  float* f = reinterpret_cast<float*>(buf + 2 * qbytes);
  std::memset(f, 0, scales);  // the padding rows' scales are 0
  act.q = reinterpret_cast<int8_t*>(buf), act.ql = reinterpret_cast<int8_t*>(buf + qbytes);
  act.d32 = f, act.s32 = f + act.pitch * (k / 32);
  act.i32 = reinterpret_cast<int32_t*>(f + 2 * act.pitch * (k / 32));
  const void* xp = x.data_ptr();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    quant::Act mine = act;  // each thread writes only its own rows
    for (int64_t j = begin; j < end; ++j) kern.quantize15(xp, bf16, j, mine);
  });
  return act;
}

}  // namespace

QuantLinear::QuantLinear(std::vector<torch::Tensor> weights, std::vector<int64_t> types) : weights_(std::move(weights)) {
  TORCH_CHECK(!weights_.empty() && weights_.size() == types.size(), "QuantLinear: one type per weight");
  first_.push_back(0);
  for (size_t p = 0; p < weights_.size(); ++p) {
    k_ = checked_k(weights_[p], types[p], p == 0 ? -1 : k_, "QuantLinear");
    types_.push_back(static_cast<int>(types[p]));
    (quant::block_values(types_.back()) == 32 ? need32_ : need256_) = true;
    first_.push_back(first_.back() + weights_[p].size(0));
  }
}

torch::Tensor QuantLinear::forward(const torch::Tensor& x, bool int8) const {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k_ && x.is_contiguous() && x.device().is_cpu(),
              "QuantLinear: x [rows, ", k_, "] contiguous on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "QuantLinear: float32 or bfloat16 x");
  const int64_t rows = x.size(0), k = k_, n = first_.back();
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0) return y;
  const quant::Kernels& kern = *chosen().load();

  quant::Act act;
  const float* xf = nullptr;  // float32 activations (the float path)
  if (int8) {
    act = quantize_rows(x, kern, need32_, need256_);
  } else if (bf16) {
    float* f = reinterpret_cast<float*>(scratch(sizeof(float) * rows * k));
    const c10::BFloat16* xb = x.data_ptr<c10::BFloat16>();
    for (int64_t i = 0; i < rows * k; ++i) f[i] = static_cast<float>(xb[i]);
    xf = f;
  } else {
    xf = x.data_ptr<float>();
  }

  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> column(rows), buf(256);
    for (size_t p = 0; p < weights_.size(); ++p) {
      const int64_t lo = std::max(begin, first_[p]), hi = std::min(end, first_[p + 1]);
      const int type = types_[p];
      const uint8_t* w = weights_[p].data_ptr<uint8_t>();
      const int64_t row_bytes = weights_[p].size(1);
      const int64_t ahead = (kRowPrefetchBytes + row_bytes - 1) / row_bytes;  // rows
      for (int64_t c = lo; c < hi; ++c) {
        const uint8_t* wr = w + (c - first_[p]) * row_bytes;
        if (c + ahead < hi) prefetch(wr + ahead * row_bytes, row_bytes);
        if (int8) kern.int8_dot(type, wr, act, rows, column.data());
        else kern.float_dot(type, wr, k, xf, rows, column.data(), buf.data());
        if (bf16) store_column(column.data(), rows, y.data_ptr<c10::BFloat16>(), n, c);
        else store_column(column.data(), rows, y.data_ptr<float>(), n, c);
      }
    }
  });
  return y;
}

Quant4x8Linear::Quant4x8Linear(torch::Tensor packed, int64_t out_features, int64_t in_features, int64_t act_bits,
                               int64_t weight_bits)
    : packed_(std::move(packed)), n_(out_features), k_(in_features), act_bits_(act_bits), weight_bits_(weight_bits) {
  TORCH_CHECK(act_bits_ == 8 || act_bits_ == 15, "Quant4x8Linear: act_bits 8 or 15, got ", act_bits_);
  TORCH_CHECK(weight_bits_ == 4 || weight_bits_ == 5 || weight_bits_ == 8, "Quant4x8Linear: weight_bits 4, 5 or 8, got ",
              weight_bits_);
  const int64_t record = weight_bits_ == 8   ? quant::X8Q8_RECORD_BYTES
                         : weight_bits_ == 5 ? quant::X8Q5_RECORD_BYTES
                                             : quant::X8_RECORD_BYTES;
  TORCH_CHECK(packed_.scalar_type() == at::kByte && packed_.dim() == 2 && packed_.is_contiguous() &&
                  packed_.device().is_cpu(), "Quant4x8Linear: uint8 [groups, bytes] contiguous on the CPU");
  TORCH_CHECK(k_ > 0 && k_ % 32 == 0 && packed_.size(1) == k_ / 32 * record, "Quant4x8Linear: ", k_,
              " inputs need groups of ", k_ / 32 * record, " bytes, got ", packed_.size(1));
  TORCH_CHECK(n_ > 0 && packed_.size(0) == (n_ + 7) / 8, "Quant4x8Linear: ", n_, " outputs need ", (n_ + 7) / 8,
              " groups of 8, got ", packed_.size(0));
}

torch::Tensor Quant4x8Linear::forward(const torch::Tensor& x) const {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k_ && x.is_contiguous() && x.device().is_cpu(),
              "Quant4x8Linear: x [rows, ", k_, "] contiguous on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "Quant4x8Linear: float32 or bfloat16 x");
  const int64_t rows = x.size(0), n = n_, groups = packed_.size(0), group_bytes = packed_.size(1);
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0) return y;
  const quant::Kernels& kern = *chosen().load();
  const quant::Act act = act_bits_ == 15 ? quantize15_rows(x, kern) : quantize_rows(x, kern, true, false);
  const bool wide = act_bits_ == 15;
  const quant::Int8X8 dot = weight_bits_ == 8   ? (wide ? kern.int15_q8x8 : kern.int8_q8x8)
                            : weight_bits_ == 5 ? (wide ? kern.int15_q5x8 : kern.int8_q5x8)
                                                : (wide ? kern.int15_x8 : kern.int8_x8);
  const uint8_t* w = packed_.data_ptr<uint8_t>();
  // the output's pointer taken once: data_ptr<T>() checks the dtype on every call
  c10::BFloat16* yb = x.scalar_type() == at::kBFloat16 ? y.data_ptr<c10::BFloat16>() : nullptr;
  float* yf = yb ? nullptr : y.data_ptr<float>();
  at::parallel_for(0, groups, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(8 * rows);  // [rows, 8]: one group's columns
    for (int64_t g = begin; g < end; ++g) {
      dot(w + g * group_bytes, act, rows, tile.data());
      const int64_t c0 = 8 * g, width = std::min<int64_t>(8, n - c0);  // the last group may be padding
      for (int64_t j = 0; j < rows; ++j) {
        const float* t = tile.data() + 8 * j;
        if (yb) for (int64_t c = 0; c < width; ++c) yb[j * n + c0 + c] = static_cast<c10::BFloat16>(t[c]);
        else std::memcpy(yf + j * n + c0, t, sizeof(float) * width);
      }
    }
  });
  return y;
}

torch::Tensor quant_matmul(torch::Tensor x, std::vector<torch::Tensor> weights, std::vector<int64_t> types, bool int8) {
  return QuantLinear(std::move(weights), std::move(types)).forward(x.contiguous(), int8);
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
  auto out = torch::empty({count, k}, w.options().dtype(dtype));
  const quant::Kernels& kern = *chosen().load();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(dtype == at::kFloat ? 0 : k);  // bfloat16 out: each row through float32
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* src = wp + id[i] * row_bytes;
      if (dtype == at::kFloat) {
        kern.dequant_row(static_cast<int>(type), src, k, out.data_ptr<float>() + i * k);
        continue;
      }
      kern.dequant_row(static_cast<int>(type), src, k, row.data());
      c10::BFloat16* dst = out.data_ptr<c10::BFloat16>() + i * k;
      for (int64_t c = 0; c < k; ++c) dst[c] = static_cast<c10::BFloat16>(row[c]);
    }
  });
  return out;
}

std::string quant_isa() { return chosen().load()->name; }

std::vector<std::string> quant_isas() {
  std::vector<std::string> names{quant::avx2_kernels().name};
  if (cpu_has_avx_vnni()) names.push_back(quant::avxvnni_kernels().name);
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
  if (name == quant::avxvnni_kernels().name) {
    TORCH_CHECK(cpu_has_avx_vnni(), "set_quant_isa: this CPU has no AVX-VNNI");
    return chosen().store(&quant::avxvnni_kernels());
  }
  TORCH_CHECK(false, "set_quant_isa: unknown instruction set '", name, "' (auto, avx2, avx_vnni, avx512_vnni)");
}

}  // namespace strata
