// The fused decode ops (decode_ops.cpp, decode_attention.cpp) as C++ functions, for the module's
// bindings and for DecodeLayer (decode_layer.cpp), which chains them.
#pragma once

#include <torch/extension.h>

#include <string>
#include <vector>

namespace strata {

// A binding's guard: the kernel runs without the GIL (arguments are converted before it, the
// result after), so other Python threads (the server's asyncio loop) run while a step computes.
using NoGil = pybind11::call_guard<pybind11::gil_scoped_release>;

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor add_rms_norm(torch::Tensor x, torch::Tensor d, torch::Tensor w, double eps);
torch::Tensor rope_write(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_caches,
                         std::vector<torch::Tensor> v_caches, std::vector<torch::Tensor> write_indices, int64_t heads,
                         int64_t kv_heads, std::vector<torch::Tensor> k_scales = {},
                         std::vector<torch::Tensor> v_scales = {});
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor spans,
                               torch::Tensor row_spans, double scale, c10::optional<torch::Tensor> k_more,
                               c10::optional<torch::Tensor> v_more, std::vector<torch::Tensor> k_scales = {},
                               std::vector<torch::Tensor> v_scales = {});
std::string attention_isa();
std::vector<std::string> attention_isas();
void set_attention_isa(const std::string& name);
void bind_decode_layer(pybind11::module_& m);
void bind_amx(pybind11::module_& m);  // amx_gemm.cpp
void bind_amx_attention(pybind11::module_& m);  // amx_attention.cpp
void bind_copy_cells(pybind11::module_& m);  // copy_cells.cpp

}  // namespace strata
