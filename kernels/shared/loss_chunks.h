// The sizes the fused projection and cross-entropy kernels (graph/fusions.h) work with, and
// their chunk of logits in the call's workspace: shared by the CPU and CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "memplan/common/check.h"
#include "memplan/kernels/kernel.h"

namespace memplan::kernels {

struct LossChunks {
  std::int64_t rows = 0, width = 0, vocab = 0;
  std::int64_t chunk = 0;  // rows of logits computed at a time
};

// h [N, C] and w [V, C] of a fused-loss op with these attributes.
inline LossChunks loss_chunks(const TensorRef& h, const TensorRef& w, const graph::OpAttrs& attrs) {
  LossChunks s{(*h.shape)[0], (*h.shape)[1], (*w.shape)[0], 0};
  s.chunk = attrs.chunk_rows > 0 ? std::min(attrs.chunk_rows, s.rows) : s.rows;
  return s;
}

// The f32 logits of one chunk, at the start of the call's workspace (the op's scratch, which
// graph::kernel_scratch_bytes planned).
inline float* chunk_logits_scratch(const KernelCall& c, const LossChunks& s) {
  const auto need = static_cast<std::size_t>(s.chunk * s.vocab) * sizeof(float);
  MEMPLAN_CHECK(c.workspace.size() >= need, "op " << graph::op_name(c.kind) << " needs " << need
                                                  << " bytes of scratch for a chunk of logits, the workspace holds "
                                                  << c.workspace.size());
  return reinterpret_cast<float*>(c.workspace.data());
}

}  // namespace memplan::kernels
