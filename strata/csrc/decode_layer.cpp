// DecodeLayer: one decoder layer of the Llama family at decode rows, in one call.
//
// The same ops in the same order as the layer's Python path with the fused ops
// (strata/models/llama.py DecoderLayer.__call__, every projection through its quantized form:
// the x8 pack or the file's blocks), so its output is bit-identical to that path's; what goes
// is the Python and the dispatch between them:
//   h = rms_norm(x); qkv = h W_qkv^T (+ b); q = rope_write(qkv -> every K/V destination, int8
//   cells quantised there);
//   a = decode_attention(q over the K/V reads); x += a W_o^T (+ b); h = rms_norm(x);
//   returns x + silu_mul(h W_gate_up^T) W_down^T.
// x [rows, hidden] is updated in place (the residual after attention), as add_rms_norm does.

#include <torch/extension.h>

#include <vector>

#include "decode_ops.h"
#include "quant_ops.h"

namespace strata {

namespace {

// One projection's quantized form as Python's Linear reads it at decode rows: the x8 pack
// (Quant4x8Linear), or the file's blocks (QuantLinear: 8-bit activations for bfloat16 x,
// exact float32 otherwise), plus its bias.
class Projection {
 public:
  Projection(const pybind11::object& form, c10::optional<torch::Tensor> bias) : bias_(std::move(bias)) {
    if (pybind11::isinstance<Quant4x8Linear>(form)) x8_ = form.cast<Quant4x8Linear>();
    else blocks_ = form.cast<QuantLinear>();
  }
  int64_t in_features() const { return x8_ ? x8_->in_features() : blocks_->in_features(); }
  int64_t out_features() const { return x8_ ? x8_->out_features() : blocks_->out_features(); }
  torch::Tensor operator()(const torch::Tensor& x) const {
    torch::Tensor y = x8_ ? x8_->forward(x) : blocks_->forward(x, x.scalar_type() != at::kFloat);
    return bias_.has_value() ? y + *bias_ : y;
  }

 private:
  c10::optional<Quant4x8Linear> x8_;
  c10::optional<QuantLinear> blocks_;
  c10::optional<torch::Tensor> bias_;
};

}  // namespace

class DecodeLayer {
 public:
  DecodeLayer(torch::Tensor input_norm, torch::Tensor post_norm, double eps, const pybind11::object& qkv,
              c10::optional<torch::Tensor> qkv_bias, const pybind11::object& o, c10::optional<torch::Tensor> o_bias,
              const pybind11::object& gate_up, const pybind11::object& down, int64_t heads, int64_t kv_heads,
              int64_t head_dim)
      : input_norm_(std::move(input_norm)), post_norm_(std::move(post_norm)), eps_(eps), qkv_(qkv, std::move(qkv_bias)),
        o_(o, std::move(o_bias)), gate_up_(gate_up, c10::nullopt), down_(down, c10::nullopt), heads_(heads),
        kv_heads_(kv_heads), head_dim_(head_dim) {
    const int64_t hidden = input_norm_.size(0);
    TORCH_CHECK(qkv_.in_features() == hidden && qkv_.out_features() == (heads + 2 * kv_heads) * head_dim,
                "DecodeLayer: qkv is [", (heads + 2 * kv_heads) * head_dim, ", ", hidden, "]");
    TORCH_CHECK(o_.in_features() == heads * head_dim && o_.out_features() == hidden, "DecodeLayer: o shape");
    TORCH_CHECK(gate_up_.in_features() == hidden && gate_up_.out_features() == 2 * down_.in_features() &&
                    down_.out_features() == hidden, "DecodeLayer: MLP shapes");
  }

  // x [rows, hidden]; cos, sin [rows, head_dim / 2] (or the rotary tables' [rows, 1, head_dim / 2]);
  // k_dests[j], v_dests[j] written at indices[j]
  // (int8 cells: with their scales k_dest_scales[j], v_dest_scales[j]; else none); k_reads,
  // v_reads: one storage, or two whose cells continue each other (decode_attention), with
  // their scales where int8.
  torch::Tensor forward(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_dests,
                        std::vector<torch::Tensor> v_dests, std::vector<torch::Tensor> indices,
                        std::vector<torch::Tensor> k_dest_scales, std::vector<torch::Tensor> v_dest_scales,
                        std::vector<torch::Tensor> k_reads, std::vector<torch::Tensor> v_reads,
                        std::vector<torch::Tensor> k_read_scales, std::vector<torch::Tensor> v_read_scales,
                        torch::Tensor spans, torch::Tensor row_spans, double scale) const {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) == input_norm_.size(0), "DecodeLayer: x [rows, hidden]");
    TORCH_CHECK((k_reads.size() == 1 || k_reads.size() == 2) && v_reads.size() == k_reads.size(),
                "DecodeLayer: one or two K/V storages to read");
    const int64_t rows = x.size(0);
    if (cos.dim() == 3) cos = cos.squeeze(1), sin = sin.squeeze(1);
    torch::Tensor qkv = qkv_(rms_norm(x, input_norm_, eps_));
    torch::Tensor q = rope_write(qkv, cos, sin, std::move(k_dests), std::move(v_dests), std::move(indices), heads_,
                                 kv_heads_, std::move(k_dest_scales), std::move(v_dest_scales));
    c10::optional<torch::Tensor> k_more, v_more;
    if (k_reads.size() == 2) k_more = k_reads[1], v_more = v_reads[1];
    torch::Tensor a = decode_attention(q, k_reads[0], v_reads[0], spans, row_spans, scale, k_more, v_more,
                                       std::move(k_read_scales), std::move(v_read_scales));
    torch::Tensor h = add_rms_norm(x, o_(a.view({rows, heads_ * head_dim_})), post_norm_, eps_);
    return x + down_(silu_mul(gate_up_(h)));
  }

 private:
  torch::Tensor input_norm_, post_norm_;  // [hidden]
  double eps_;
  Projection qkv_, o_, gate_up_, down_;
  int64_t heads_, kv_heads_, head_dim_;
};

void bind_decode_layer(pybind11::module_& m) {
  pybind11::class_<DecodeLayer>(m, "DecodeLayer")
      .def(pybind11::init<torch::Tensor, torch::Tensor, double, const pybind11::object&, c10::optional<torch::Tensor>,
                          const pybind11::object&, c10::optional<torch::Tensor>, const pybind11::object&,
                          const pybind11::object&, int64_t, int64_t, int64_t>())
      .def("__call__", &DecodeLayer::forward, NoGil());
}

}  // namespace strata
