// copy_cells(dsts, srcs, runs): the resident ring's page copies (cells/ring_step.py) in one call.
//
//   dsts[j], srcs[j]  [kv_heads, cells, *rest] CPU tensors of one dtype, contiguous from dim 1 on
//                     (a cell is one contiguous row of prod(rest) values; heads may be far apart)
//   runs              [R, 3] int64 on the CPU: (src cell, dst cell, cells) per run
// For every pair j, head h and run (s, d, n): dsts[j][h, d:d+n] = srcs[j][h, s:s+n], a memcpy.
// Every bound is checked before any byte moves. One call replaces a narrow, narrow and copy_
// per part and run; copies of more than kParallelBytes in all are split across torch's threads.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "decode_ops.h"

namespace strata {
namespace {

constexpr int64_t kParallelBytes = int64_t{1} << 20;

struct Piece {
  char* dst;
  const char* src;
  int64_t bytes;
};

int64_t row_bytes(const torch::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "copy_cells: CPU tensors only");
  TORCH_CHECK(t.dim() >= 2, "copy_cells: tensors are [kv_heads, cells, ...]");
  int64_t row = 1;  // values a cell
  for (int64_t d = t.dim() - 1; d >= 2; --d) {
    TORCH_CHECK(t.size(d) == 1 || t.stride(d) == row, "copy_cells: each tensor must be contiguous from dim 1 on");
    row *= t.size(d);
  }
  TORCH_CHECK(t.stride(1) == row || t.size(1) <= 1, "copy_cells: each tensor must be contiguous from dim 1 on");
  return row * t.element_size();
}

}  // namespace

void copy_cells(const std::vector<torch::Tensor>& dsts, const std::vector<torch::Tensor>& srcs,
                const torch::Tensor& runs) {
  TORCH_CHECK(dsts.size() == srcs.size(), "copy_cells: as many destinations as sources");
  TORCH_CHECK(runs.device().is_cpu() && runs.scalar_type() == torch::kLong && runs.dim() == 2 &&
                  runs.size(1) == 3 && runs.is_contiguous(),
              "copy_cells: runs must be a contiguous [R, 3] int64 CPU tensor");
  const int64_t* r = runs.data_ptr<int64_t>();
  const int64_t num_runs = runs.size(0);
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (size_t j = 0; j < dsts.size(); ++j) {
    const torch::Tensor &d = dsts[j], &s = srcs[j];
    TORCH_CHECK(d.scalar_type() == s.scalar_type(), "copy_cells: pair ", j, " differs in dtype");
    TORCH_CHECK(d.size(0) == s.size(0) && d.sizes().slice(2).equals(s.sizes().slice(2)),
                "copy_cells: pair ", j, " differs in shape beyond its cells");
    const int64_t row = row_bytes(d);
    TORCH_CHECK(row == row_bytes(s), "copy_cells: pair ", j, " differs in cell size");
    char* dbase = static_cast<char*>(d.data_ptr());
    const char* sbase = static_cast<const char*>(s.data_ptr());
    const int64_t dhead = d.stride(0) * d.element_size(), shead = s.stride(0) * s.element_size();
    for (int64_t k = 0; k < num_runs; ++k) {
      const int64_t src = r[3 * k], dst = r[3 * k + 1], n = r[3 * k + 2];
      TORCH_CHECK(n >= 0 && src >= 0 && dst >= 0 && src + n <= s.size(1) && dst + n <= d.size(1),
                  "copy_cells: run ", k, " (", src, ", ", dst, ", ", n, ") is outside pair ", j);
      for (int64_t h = 0; h < d.size(0); ++h)
        pieces.push_back({dbase + h * dhead + dst * row, sbase + h * shead + src * row, n * row});
      total += n * row * d.size(0);
    }
  }
  const int64_t count = static_cast<int64_t>(pieces.size());
  const int64_t grain = total > kParallelBytes ? 1 : count + 1;  // small copies: this thread only
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
  });
}

void bind_copy_cells(pybind11::module_& m) {
  m.def("copy_cells", &copy_cells, NoGil(), pybind11::arg("dsts"), pybind11::arg("srcs"), pybind11::arg("runs"));
}

}  // namespace strata
