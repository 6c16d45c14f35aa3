// The torch-facing quantized ops (quant_ops.cpp); decode_ops.cpp binds them into the module.
#pragma once

#include <torch/extension.h>

#include <string>
#include <vector>

namespace strata {

// One projection's quantized parts, side by side along the output (see quant_ops.cpp).
class QuantLinear {
 public:
  QuantLinear(std::vector<torch::Tensor> weights, std::vector<int64_t> types);
  torch::Tensor forward(const torch::Tensor& x, bool int8) const;
  int64_t in_features() const { return k_; }
  int64_t out_features() const { return first_.back(); }

 private:
  std::vector<torch::Tensor> weights_;  // uint8 [out_i, row bytes], kept alive here
  std::vector<int> types_;
  std::vector<int64_t> first_;  // output column where each part starts, then the total
  int64_t k_ = 0;
  bool need32_ = false, need256_ = false;  // which activation quantizations the parts read
};

// 4-bit (or, weight_bits 5 and 8, Q5_0's and Q8_0's) weights with 8 columns interleaved (the x8 layout,
// quant_x8.inc), 8- or 15-bit activations.
class Quant4x8Linear {
 public:
  Quant4x8Linear(torch::Tensor packed, int64_t out_features, int64_t in_features, int64_t act_bits = 8,
                 int64_t weight_bits = 4);
  torch::Tensor forward(const torch::Tensor& x) const;
  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  int64_t act_bits() const { return act_bits_; }
  int64_t weight_bits() const { return weight_bits_; }

 private:
  torch::Tensor packed_;  // uint8 [ceil(out / 8), in / 32 * record bytes], kept alive here
  int64_t n_ = 0, k_ = 0, act_bits_ = 8, weight_bits_ = 4;
};

torch::Tensor quant_matmul(torch::Tensor x, std::vector<torch::Tensor> weights, std::vector<int64_t> types, bool int8);
torch::Tensor quant_dequant_rows(torch::Tensor w, int64_t type, torch::Tensor ids, at::ScalarType dtype);
std::string quant_isa();
std::vector<std::string> quant_isas();
void set_quant_isa(const std::string& name);

}  // namespace strata
