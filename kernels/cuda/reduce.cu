// CUDA reductions: whole-tensor sums, column sums, per-row ops (softmax, cross-entropy, layer
// norm) and per-channel ops (batch norm statistics). One block owns each output and combines
// its threads' partial sums in a fixed tree (common.cuh): no atomics, the same bits every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/attention_mask.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

// --- whole-tensor sums (one block; these run once per step on small tensors) -----------------

__global__ void sum_kernel(const float* x, std::int64_t n, double scale, float* out) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s * scale);
}

void k_sum(const KernelCall& c) {
  sum_kernel<<<1, kReduceThreads, 0, stream()>>>(c.inputs[0].f32(), c.inputs[0].numel(), 1.0, c.outputs[0].f32());
  check_launch("sum");
}

void k_mean(const KernelCall& c) {
  const std::int64_t n = c.inputs[0].numel();
  sum_kernel<<<1, kReduceThreads, 0, stream()>>>(c.inputs[0].f32(), n, 1.0 / double(n), c.outputs[0].f32());
  check_launch("mean");
}

// --- column sums: y[j] = sum_r f(r, j), a tile of 32 columns per block ------------------------
// threadIdx.x picks the column, threadIdx.y strides the rows; the 32 row-lanes are then summed
// in lane order.

constexpr int kColTile = 32, kRowLanes = 32;

template <typename F>
__global__ void column_sum_kernel(std::int64_t rows, std::int64_t cols, Out y, bool accumulate, F term) {
  __shared__ float partial[kRowLanes][kColTile + 1];
  const std::int64_t j = blockIdx.x * std::int64_t(kColTile) + threadIdx.x;
  float s = 0.0f;
  if (j < cols) {
    for (std::int64_t r = threadIdx.y; r < rows; r += kRowLanes) s += term(r, j);
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
    y.set(j, accumulate ? In{y.p, y.t}[j] + total : total);
  }
}

template <typename F>
void column_sum(std::int64_t rows, std::int64_t cols, Out y, const char* op, F term, bool accumulate = false) {
  const unsigned grid = static_cast<unsigned>((cols + kColTile - 1) / kColTile);
  column_sum_kernel<<<grid, dim3(kColTile, kRowLanes), 0, stream()>>>(rows, cols, y, accumulate, term);
  check_launch(op);
}

void k_reduce_rows(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  const std::int64_t cols = c.inputs[0].shape->cols();
  column_sum(c.inputs[0].shape->rows(), cols, out(c.outputs[0]), "reduce_rows",
             [=] __device__(std::int64_t r, std::int64_t j) { return x[r * cols + j]; }, c.accumulate);
}

void k_layer_norm_dgamma(const KernelCall& c) {
  const In dy = in(c.inputs[0]);
  const In x = in(c.inputs[1]);
  const float* stats = c.inputs[2].f32();
  const std::int64_t cols = c.inputs[1].shape->cols();
  column_sum(c.inputs[1].shape->rows(), cols, out(c.outputs[0]), "layer_norm_dgamma",
             [=] __device__(std::int64_t r, std::int64_t j) {
               return dy[r * cols + j] * ((x[r * cols + j] - stats[2 * r]) * stats[2 * r + 1]);
             });
}

// --- per-row ops: one block per row ------------------------------------------------------------

// Per row of logits: loss_i = log(sum exp(x - max)) + max - x[label] (in double, as the CPU).
// 16-bit logits are widened as they are read (no f32 copy of a vocabulary-wide row block).

template <typename T>
__global__ void cross_entropy_rows_kernel(const T* logits, const std::int32_t* labels, std::int64_t classes,
                                          double* row_loss) {
  const T* row = logits + blockIdx.x * classes;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) m = fmaxf(m, to_f32(row[j]));
  m = block_max(m);
  double z = 0.0;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) z += exp(double(to_f32(row[j]) - m));
  z = block_sum(z);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = log(z) + double(m) - double(to_f32(row[labels[blockIdx.x]]));
}

__global__ void mean_of_doubles_kernel(const double* v, std::int64_t n, float* out) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s / double(n));
}

template <typename T>
void k_softmax_cross_entropy(const KernelCall& c) {
  const std::int64_t batch = (*c.inputs[0].shape)[0], classes = (*c.inputs[0].shape)[1];
  auto* row_loss = static_cast<double*>(scratch(static_cast<std::size_t>(batch) * sizeof(double), "softmax_cross_entropy"));
  cross_entropy_rows_kernel<T><<<static_cast<unsigned>(batch), kReduceThreads, 0, stream()>>>(
      static_cast<const T*>(c.inputs[0].data), c.inputs[1].i32(), classes, row_loss);
  check_launch("softmax_cross_entropy");
  mean_of_doubles_kernel<<<1, kReduceThreads, 0, stream()>>>(row_loss, batch, c.outputs[0].f32());
  check_launch("softmax_cross_entropy");
}

__global__ void cross_entropy_backward_kernel(In dloss, In logits, const std::int32_t* labels,
                                              std::int64_t batch, std::int64_t classes, Out dlogits) {
  const std::int64_t base = blockIdx.x * classes;
  const auto row = [&](std::int64_t j) { return logits[base + j]; };
  const float scale = dloss[0] / static_cast<float>(batch);
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) m = fmaxf(m, row(j));
  m = block_max(m);
  float z = 0.0f;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) z += expf(row(j) - m);
  z = block_sum(z);
  const float inv = 1.0f / z;
  const std::int32_t label = labels[blockIdx.x];
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    const float p = expf(row(j) - m) * inv * scale;
    dlogits.set(base + j, j == label ? p - scale : p);
  }
}

void k_softmax_cross_entropy_backward(const KernelCall& c) {
  const std::int64_t batch = (*c.inputs[1].shape)[0], classes = (*c.inputs[1].shape)[1];
  cross_entropy_backward_kernel<<<static_cast<unsigned>(batch), kReduceThreads, 0, stream()>>>(
      in(c.inputs[0]), in(c.inputs[1]), c.inputs[2].i32(), batch, classes, out(c.outputs[0]));
  check_launch("softmax_cross_entropy_backward");
}

// Rows of `cols`; causal: row r of each [T, T] block sees columns j <= r % T (and, with a window,
// j > r % T - window), the rest are 0.
__global__ void softmax_kernel(In x, std::int64_t cols, std::int64_t t, bool causal, std::int64_t window, Out y) {
  const std::int64_t r = blockIdx.x, base = r * cols;
  const auto xr = [&](std::int64_t j) { return x[base + j]; };
  const KeyRange keys = causal ? visible_keys(r % t, t, true, window) : KeyRange{0, cols};
  float m = -INFINITY;
  for (std::int64_t j = keys.first + threadIdx.x; j < keys.end; j += blockDim.x) m = fmaxf(m, xr(j));
  m = block_max(m);
  float z = 0.0f;
  for (std::int64_t j = keys.first + threadIdx.x; j < keys.end; j += blockDim.x) z += expf(xr(j) - m);
  z = block_sum(z);
  const float inv = 1.0f / z;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    y.set(base + j, j >= keys.first && j < keys.end ? expf(xr(j) - m) * inv : 0.0f);
  }
}

void k_softmax(const KernelCall& c) {
  const graph::Shape& s = *c.inputs[0].shape;
  const bool causal = c.attrs->causal;
  const std::int64_t t = causal ? s[s.rank() - 2] : 1;
  softmax_kernel<<<static_cast<unsigned>(s.rows()), kThreads, 0, stream()>>>(in(c.inputs[0]), s.cols(), t, causal,
                                                                              c.attrs->window, out(c.outputs[0]));
  check_launch("softmax");
}

__global__ void softmax_backward_kernel(In dy, In y, std::int64_t cols, Out dx) {
  const std::int64_t base = blockIdx.x * cols;
  float dot = 0.0f;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += dy[base + j] * y[base + j];
  dot = block_sum(dot);
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) dx.set(base + j, y[base + j] * (dy[base + j] - dot));
}

void k_softmax_backward(const KernelCall& c) {
  const graph::Shape& s = *c.inputs[1].shape;
  softmax_backward_kernel<<<static_cast<unsigned>(s.rows()), kThreads, 0, stream()>>>(
      in(c.inputs[0]), in(c.inputs[1]), s.cols(), out(c.outputs[0]));
  check_launch("softmax_backward");
}

// stats[r] = (mean, 1/sqrt(var + eps)), two passes over the row.
__global__ void layer_norm_stats_kernel(In x, std::int64_t cols, float eps, float* stats) {
  const std::int64_t base = blockIdx.x * cols;
  const auto row = [&](std::int64_t j) { return x[base + j]; };
  float s = 0.0f;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += row(j);
  const float mean = block_sum(s) / static_cast<float>(cols);
  float sq = 0.0f;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) sq += (row(j) - mean) * (row(j) - mean);
  const float var = block_sum(sq) / static_cast<float>(cols);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rsqrtf(var + eps);
  }
}

void k_layer_norm_stats(const KernelCall& c) {
  const graph::Shape& s = *c.inputs[0].shape;
  layer_norm_stats_kernel<<<static_cast<unsigned>(s.rows()), kThreads, 0, stream()>>>(
      in(c.inputs[0]), s.cols(), c.attrs->norm_eps, c.outputs[0].f32());
  check_launch("layer_norm_stats");
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gamma * dy.
__global__ void layer_norm_backward_kernel(In dy, In x, const float* stats, In gamma, std::int64_t cols, Out dx) {
  const std::int64_t base = blockIdx.x * cols;
  const float mean = stats[2 * blockIdx.x], rstd = stats[2 * blockIdx.x + 1];
  float sg = 0.0f, sgx = 0.0f;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = gamma[j] * dy[base + j];
    sg += g;
    sgx += g * ((x[base + j] - mean) * rstd);
  }
  const float mg = block_sum(sg) / static_cast<float>(cols);
  const float mgx = block_sum(sgx) / static_cast<float>(cols);
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (x[base + j] - mean) * rstd;
    dx.set(base + j, rstd * (gamma[j] * dy[base + j] - mg - xhat * mgx));
  }
}

void k_layer_norm_backward(const KernelCall& c) {
  const graph::Shape& s = *c.inputs[1].shape;
  layer_norm_backward_kernel<<<static_cast<unsigned>(s.rows()), kThreads, 0, stream()>>>(
      in(c.inputs[0]), in(c.inputs[1]), c.inputs[2].f32(), in(c.inputs[3]), s.cols(), out(c.outputs[0]));
  check_launch("layer_norm_backward");
}

// --- per-channel ops on x [N, C, S]: one block per channel (or per plane) ---------------------

// out[ch] = sum over (n, s) of term(ch, flat index), in double.
template <typename F>
__global__ void channel_sum_kernel(Nc d, float* out, F term) {
  const std::int64_t ch = blockIdx.x;
  double s = 0.0;
  for (std::int64_t k = threadIdx.x; k < d.n * d.s; k += blockDim.x) {
    const std::int64_t n = k / d.s, i = k % d.s;
    s += term(ch, (n * d.c + ch) * d.s + i);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) out[ch] = static_cast<float>(s);
}

template <typename F>
void channel_sum(const Nc& d, float* out, const char* op, F term) {
  channel_sum_kernel<<<static_cast<unsigned>(d.c), kReduceThreads, 0, stream()>>>(d, out, term);
  check_launch(op);
}

void k_channel_sum(const KernelCall& c) {
  const float* x = c.inputs[0].f32();
  channel_sum(nc_of(*c.inputs[0].shape), c.outputs[0].f32(), "channel_sum",
              [=] __device__(std::int64_t, std::int64_t i) { return double(x[i]); });
}

void k_batch_norm_dgamma(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[1].shape);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* stats = c.inputs[2].f32();
  const float eps = c.attrs->norm_eps;
  channel_sum(d, c.outputs[0].f32(), "batch_norm_dgamma", [=] __device__(std::int64_t ch, std::int64_t i) {
    const float rstd = 1.0f / sqrtf(stats[d.c + ch] + eps);
    return double(dy[i]) * double((x[i] - stats[ch]) * rstd);
  });
}

// stats [2, C] = (mean, biased variance), two passes in double.
__global__ void batch_norm_stats_kernel(const float* x, Nc d, float* stats) {
  const std::int64_t ch = blockIdx.x;
  const std::int64_t count = d.n * d.s;
  double s = 0.0;
  for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) s += x[((k / d.s) * d.c + ch) * d.s + k % d.s];
  const double mean = block_sum(s) / double(count);
  double sq = 0.0;
  for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const double v = x[((k / d.s) * d.c + ch) * d.s + k % d.s] - mean;
    sq += v * v;
  }
  const double var = block_sum(sq) / double(count);
  if (threadIdx.x == 0) {
    stats[ch] = static_cast<float>(mean);
    stats[d.c + ch] = static_cast<float>(var);
  }
}

void k_batch_norm_stats(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  batch_norm_stats_kernel<<<static_cast<unsigned>(d.c), kReduceThreads, 0, stream()>>>(c.inputs[0].f32(), d,
                                                                                       c.outputs[0].f32());
  check_launch("batch_norm_stats");
}

// Synchronised batch norm's second pass: row 1 = mean of (x - m)^2 about the given row 0.
__global__ void batch_norm_centered_stats_kernel(const float* x, const float* centre, Nc d, float* stats) {
  const std::int64_t ch = blockIdx.x;
  const std::int64_t count = d.n * d.s;
  const double mean = centre[ch];
  double sq = 0.0;
  for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const double v = x[((k / d.s) * d.c + ch) * d.s + k % d.s] - mean;
    sq += v * v;
  }
  const double var = block_sum(sq) / double(count);
  if (threadIdx.x == 0) {
    stats[ch] = centre[ch];
    stats[d.c + ch] = static_cast<float>(var);
  }
}

void k_batch_norm_centered_stats(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  batch_norm_centered_stats_kernel<<<static_cast<unsigned>(d.c), kReduceThreads, 0, stream()>>>(
      c.inputs[0].f32(), c.inputs[1].f32(), d, c.outputs[0].f32());
  check_launch("batch_norm_centered_stats");
}

// y[plane] = mean over the plane's S elements.
__global__ void global_avg_pool_kernel(const float* x, std::int64_t s, float* y) {
  const float* p = x + blockIdx.x * s;
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < s; i += blockDim.x) sum += p[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) y[blockIdx.x] = static_cast<float>(sum / double(s));
}

void k_global_avg_pool(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  global_avg_pool_kernel<<<static_cast<unsigned>(d.n * d.c), kThreads, 0, stream()>>>(c.inputs[0].f32(), d.s,
                                                                                       c.outputs[0].f32());
  check_launch("global_avg_pool");
}

}  // namespace

KernelEntries reduction_16bit_kernel_entries() {
  KernelEntries entries = at_16_bits({
      {OpKind::layer_norm_stats, k_layer_norm_stats},
      {OpKind::layer_norm_backward, k_layer_norm_backward},
      {OpKind::layer_norm_dgamma, k_layer_norm_dgamma},
      {OpKind::softmax, k_softmax},
      {OpKind::softmax_backward, k_softmax_backward},
      {OpKind::softmax_cross_entropy_backward, k_softmax_cross_entropy_backward},
  });
  entries.push_back({OpKind::softmax_cross_entropy, k_softmax_cross_entropy<__nv_bfloat16>, graph::DType::bf16});
  entries.push_back({OpKind::softmax_cross_entropy, k_softmax_cross_entropy<__half>, graph::DType::f16});
  return entries;
}

KernelEntries reduction_kernel_entries() {
  return {
      {OpKind::sum, k_sum},
      {OpKind::mean, k_mean},
      {OpKind::reduce_rows, k_reduce_rows},
      {OpKind::layer_norm_dgamma, k_layer_norm_dgamma},
      {OpKind::softmax_cross_entropy, k_softmax_cross_entropy<float>},
      {OpKind::softmax_cross_entropy_backward, k_softmax_cross_entropy_backward},
      {OpKind::softmax, k_softmax},
      {OpKind::softmax_backward, k_softmax_backward},
      {OpKind::layer_norm_stats, k_layer_norm_stats},
      {OpKind::layer_norm_backward, k_layer_norm_backward},
      {OpKind::channel_sum, k_channel_sum},
      {OpKind::batch_norm_dgamma, k_batch_norm_dgamma},
      {OpKind::batch_norm_stats, k_batch_norm_stats},
      {OpKind::batch_norm_centered_stats, k_batch_norm_centered_stats},
      {OpKind::global_avg_pool, k_global_avg_pool},
  };
}

}  // namespace memplan::kernels::cuda
