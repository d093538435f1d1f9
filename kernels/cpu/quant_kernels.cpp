// quant_matmul on the CPU: the weight dequantized 64 rows at a time into the op's scratch (f32),
// each tile multiplied in as soon as it is made: the product never holds more than a tile.
#include <algorithm>
#include <cstring>

#include "memplan/common/check.h"
#include "memplan/kernels/cpu/cpu_kernels.h"
#include "memplan/kernels/cpu/parallel.h"
#include "memplan/kernels/shared/quant.h"

namespace memplan::kernels::cpu {
namespace {

using graph::OpKind;

constexpr std::int64_t kTileRows = 64;  // graph/quantize.cpp plans this many rows of scratch

// trans_b: y[N, out] = x[N, in] W^T; else y[N, in] = x[N, out] W.
void k_quant_matmul(const KernelCall& c) {
  const QuantView q = quant_view(c);
  MEMPLAN_CHECK(kernels_compute(q.format), "no CPU kernel computes " << enum_name(graph::kQuantFormatNames, q.format) << " weights");
  const bool forward = c.attrs->trans_b;
  const float* x = c.inputs[0].f32();
  float* y = c.outputs[0].f32();
  const std::int64_t n = c.inputs[0].shape->dims[0];
  const std::int64_t tile_rows = std::min(kTileRows, q.out);
  MEMPLAN_CHECK(static_cast<std::int64_t>(c.workspace.size()) >= tile_rows * q.in * 4, "quant_matmul: the scratch was not planned");
  float* tile = reinterpret_cast<float*>(c.workspace.data());
  std::memset(y, 0, static_cast<std::size_t>(c.outputs[0].numel()) * sizeof(float));
  for (std::int64_t r0 = 0; r0 < q.out; r0 += tile_rows) {
    const std::int64_t rows = std::min(tile_rows, q.out - r0);
    parallel_each(rows, 1, [&](std::int64_t r) {
      const std::int64_t base = (r0 + r) * q.in;
      for (std::int64_t k = 0; k < q.in; ++k) tile[r * q.in + k] = dequantize_element(q, base + k);
    });
    if (forward) {
      gemm_accumulate_strided(false, true, n, rows, q.in, x, q.in, tile, q.in, y + r0, q.out);
    } else {
      gemm_accumulate_strided(false, false, n, q.in, rows, x + r0, q.out, tile, q.in, y, q.in);
    }
  }
}

}  // namespace

KernelEntries quant_kernel_entries() { return {{OpKind::quant_matmul, k_quant_matmul}}; }

}  // namespace memplan::kernels::cpu
