// CUDA kernels for convolutional nets and transformers: im2col/col2im, pooling (forward through
// cuDNN), batch and layer normalisation, embedding, permute. Scatter-style backward ops are
// written as gathers (each output element sums its contributions in the CPU's order), so they
// need no atomics and are deterministic.
#include "memplan/kernels/cuda/common.cuh"
#include "memplan/kernels/cuda/cuda_kernels.h"
#include "memplan/kernels/shared/grouped_conv.h"
#include "memplan/kernels/shared/pooling.h"

namespace memplan::kernels::cuda {
namespace {

using graph::OpKind;

// --- convolution -------------------------------------------------------------------------------

// Grouped convolution and its gradients: one thread per output element, the CPU's loops
// (kernels/shared/grouped_conv.h).
void k_grouped_conv2d(const KernelCall& c) {
  const GroupedConv g = grouped_conv_of(*c.inputs[0].shape, *c.inputs[1].shape, *c.attrs);
  const float* x = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "grouped_conv2d", [=] __device__(std::int64_t i) { y[i] = grouped_conv_output(x, w, g, i); });
}

void k_grouped_conv2d_backward_input(const KernelCall& c) {
  const GroupedConv g = grouped_conv_of(*c.outputs[0].shape, *c.inputs[1].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  const float* w = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "grouped_conv2d_backward_input",
                 [=] __device__(std::int64_t i) { dx[i] = grouped_conv_input_grad(dy, w, g, i); });
}

void k_grouped_conv2d_backward_weight(const KernelCall& c) {
  const GroupedConv g = grouped_conv_of(*c.inputs[1].shape, *c.outputs[0].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dw = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "grouped_conv2d_backward_weight",
                 [=] __device__(std::int64_t i) { dw[i] = grouped_conv_weight_grad(dy, x, g, i); });
}

// Squeeze-and-excitation: plane (n, c) of x times g[n, c]; one thread per element.
void k_channel_scale(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* x = c.inputs[0].f32();
  const float* g = c.inputs[1].f32();
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "channel_scale", [=] __device__(std::int64_t i) { y[i] = x[i] * g[i / d.s]; });
}

// dg[plane] = sum of dy * x over the plane, in double: one block per (sample, channel).
__global__ void channel_scale_backward_kernel(const float* dy, const float* x, std::int64_t s, float* dg) {
  const std::int64_t plane = blockIdx.x;
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < s; i += blockDim.x) acc += double(dy[plane * s + i]) * double(x[plane * s + i]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) dg[plane] = static_cast<float>(acc);
}

void k_channel_scale_backward(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[1].shape);
  channel_scale_backward_kernel<<<static_cast<unsigned>(d.n * d.c), kReduceThreads, 0, stream()>>>(
      c.inputs[0].f32(), c.inputs[1].f32(), d.s, c.outputs[0].f32());
  check_launch("channel_scale_backward");
}

// cols[n][(c*K + kh)*K_W + kw][oh*OW + ow] = x[n][c][oh*S + kh*D - P][ow*S + kw*D - P_W], 0 outside.
void k_im2col(const KernelCall& c) {
  const Window g = window_of(*c.inputs[0].shape, *c.attrs);
  const float* x = c.inputs[0].f32();
  float* cols = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "im2col", [=] __device__(std::int64_t i) {
    const std::int64_t ow = i % g.ow, oh = (i / g.ow) % g.oh;
    const std::int64_t row = i / (g.ow * g.oh);  // (n*C + c)*K*K_W + kh*K_W + kw
    const std::int64_t kw = row % g.k_w, kh = (row / g.k_w) % g.k, plane = row / (g.k * g.k_w);
    const std::int64_t ih = oh * g.stride + kh * g.dil - g.pad, iw = ow * g.stride + kw * g.dil - g.pad_w;
    cols[i] = (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ? x[(plane * g.h + ih) * g.w + iw] : 0.0f;
  });
}

// The adjoint of im2col as a gather: pixel (ih, iw) of a plane sums the columns that read it,
// in (kh, kw) order as the CPU does.
void k_col2im(const KernelCall& c) {
  const Window g = window_of(*c.outputs[0].shape, *c.attrs);
  const float* cols = c.inputs[0].f32();
  float* x = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "col2im", [=] __device__(std::int64_t i) {
    const std::int64_t iw = i % g.w, ih = (i / g.w) % g.h, plane = i / (g.w * g.h);
    const float* src = cols + plane * g.k * g.k_w * g.oh * g.ow;
    float s = 0.0f;
    for (std::int64_t kh = 0; kh < g.k; ++kh) {
      const std::int64_t th = ih + g.pad - kh * g.dil;  // = oh * S
      if (th < 0 || th % g.stride != 0 || th / g.stride >= g.oh) continue;
      for (std::int64_t kw = 0; kw < g.k_w; ++kw) {
        const std::int64_t tw = iw + g.pad_w - kw * g.dil;
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.ow) continue;
        s += src[((kh * g.k_w + kw) * g.oh + th / g.stride) * g.ow + tw / g.stride];
      }
    }
    x[i] = s;
  });
}

// --- pooling -----------------------------------------------------------------------------------

// cuDNN descriptors for one pooling call (host objects only; no device memory).
struct PoolingDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;
  PoolingDescriptors(const Window& g, cudnnPoolingMode_t mode) {
    MEMPLAN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    MEMPLAN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    MEMPLAN_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pool));
    MEMPLAN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(g.n), int(g.c),
                                                   int(g.h), int(g.w)));
    MEMPLAN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(g.n), int(g.c),
                                                   int(g.oh), int(g.ow)));
    MEMPLAN_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool, mode, CUDNN_NOT_PROPAGATE_NAN, int(g.k), int(g.k),
                                                    int(g.pad), int(g.pad), int(g.stride), int(g.stride)));
  }
  ~PoolingDescriptors() {
    cudnnDestroyPoolingDescriptor(pool);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(x);
  }
  PoolingDescriptors(const PoolingDescriptors&) = delete;
  PoolingDescriptors& operator=(const PoolingDescriptors&) = delete;
};

void pool_forward(const KernelCall& c, cudnnPoolingMode_t mode) {
  const Window g = window_of(*c.inputs[0].shape, *c.attrs);
  PoolingDescriptors d(g, mode);
  const float one = 1.0f, zero = 0.0f;
  MEMPLAN_CUDNN_CHECK(cudnnPoolingForward(context().cudnn, d.pool, &one, d.x, c.inputs[0].f32(), &zero, d.y,
                                          c.outputs[0].f32()));
}

// Max pooling: padding counts as -inf. Average pooling has no padding (the op's definition).
void k_max_pool2d(const KernelCall& c) { pool_forward(c, CUDNN_POOLING_MAX_DETERMINISTIC); }
void k_avg_pool2d(const KernelCall& c) { pool_forward(c, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING); }

// Output windows [lo, hi) along one axis that contain input coordinate `in`.
__device__ void windows_containing(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad,
                                   std::int64_t out, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t t = in + pad;  // window o covers [o*S, o*S + K) in padded coordinates
  lo = t < k ? 0 : (t - k) / stride + 1;
  hi = t / stride + 1;
  if (hi > out) hi = out;
}

// dx gathers dy from every window whose element by window_argmax (kernels/shared/pooling.h, the
// CPU's tie-break) is this pixel, in (oh, ow) order.
void k_max_pool2d_backward(const KernelCall& c) {
  const Window g = window_of(*c.inputs[1].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  float* dx = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "max_pool2d_backward", [=] __device__(std::int64_t i) {
    const std::int64_t iw = i % g.w, ih = (i / g.w) % g.h, plane = i / (g.w * g.h);
    const float* src = x + plane * g.h * g.w;
    std::int64_t oh0, oh1, ow0, ow1;
    windows_containing(ih, g.k, g.stride, g.pad, g.oh, oh0, oh1);
    windows_containing(iw, g.k, g.stride, g.pad, g.ow, ow0, ow1);
    const std::int64_t self = ih * g.w + iw;
    float s = 0.0f;
    for (std::int64_t oh = oh0; oh < oh1; ++oh) {
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        if (window_argmax(src, g, oh, ow) == self) s += dy[(plane * g.oh + oh) * g.ow + ow];
      }
    }
    dx[i] = s;
  });
}

void k_avg_pool2d_backward(const KernelCall& c) {
  const Window g = window_of(*c.outputs[0].shape, *c.attrs);
  const float* dy = c.inputs[0].f32();
  float* dx = c.outputs[0].f32();
  const float inv = 1.0f / static_cast<float>(g.k * g.k);
  for_each_index(c.outputs[0].numel(), "avg_pool2d_backward", [=] __device__(std::int64_t i) {
    const std::int64_t iw = i % g.w, ih = (i / g.w) % g.h, plane = i / (g.w * g.h);
    std::int64_t oh0, oh1, ow0, ow1;
    windows_containing(ih, g.k, g.stride, 0, g.oh, oh0, oh1);
    windows_containing(iw, g.k, g.stride, 0, g.ow, ow0, ow1);
    float s = 0.0f;
    for (std::int64_t oh = oh0; oh < oh1; ++oh) {
      for (std::int64_t ow = ow0; ow < ow1; ++ow) s += dy[(plane * g.oh + oh) * g.ow + ow] * inv;
    }
    dx[i] = s;
  });
}

void k_global_avg_pool_backward(const KernelCall& c) {
  const Nc d = nc_of(*c.outputs[0].shape);
  const float* dy = c.inputs[0].f32();
  float* dx = c.outputs[0].f32();
  const float inv = 1.0f / static_cast<float>(d.s);
  for_each_index(c.outputs[0].numel(), "global_avg_pool_backward",
                 [=] __device__(std::int64_t i) { dx[i] = dy[i / d.s] * inv; });
}

// --- batch norm ----------------------------------------------------------------------------------

// y = x * scale[c] + shift[c], scale = gamma * rstd, shift = beta - mean * scale.
void normalize_channels(const Nc& d, const float* x, const float* mean, const float* var, const float* gamma,
                        const float* beta, float eps, float* y, const char* op) {
  for_each_index(d.n * d.c * d.s, op, [=] __device__(std::int64_t i) {
    const std::int64_t ch = (i / d.s) % d.c;
    const float rstd = 1.0f / sqrtf(var[ch] + eps);
    const float scale = gamma[ch] * rstd;
    const float shift = beta[ch] - mean[ch] * scale;
    y[i] = x[i] * scale + shift;
  });
}

void k_batch_norm(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[0].shape);
  const float* stats = c.inputs[1].f32();
  normalize_channels(d, c.inputs[0].f32(), stats, stats + d.c, c.inputs[2].f32(), c.inputs[3].f32(),
                     c.attrs->norm_eps, c.outputs[0].f32(), "batch_norm");
}

void k_batch_norm_inference(const KernelCall& c) {
  normalize_channels(nc_of(*c.inputs[0].shape), c.inputs[0].f32(), c.inputs[1].f32(), c.inputs[2].f32(),
                     c.inputs[3].f32(), c.inputs[4].f32(), c.attrs->norm_eps, c.outputs[0].f32(),
                     "batch_norm_inference");
}

// dx = gamma * rstd * (dy - dbeta / M - xhat * dgamma / M), M = N * S.
void k_batch_norm_backward(const KernelCall& c) {
  const Nc d = nc_of(*c.inputs[1].shape);
  const float* dy = c.inputs[0].f32();
  const float* x = c.inputs[1].f32();
  const float* stats = c.inputs[2].f32();
  const float* gamma = c.inputs[3].f32();
  const float* dgamma = c.inputs[4].f32();
  const float* dbeta = c.inputs[5].f32();
  float* dx = c.outputs[0].f32();
  const float eps = c.attrs->norm_eps;
  const float inv_m = 1.0f / static_cast<float>(d.n * d.s);
  for_each_index(c.outputs[0].numel(), "batch_norm_backward", [=] __device__(std::int64_t i) {
    const std::int64_t ch = (i / d.s) % d.c;
    const float rstd = 1.0f / sqrtf(stats[d.c + ch] + eps);
    const float k = gamma[ch] * rstd;
    const float xhat = (x[i] - stats[ch]) * rstd;
    dx[i] = k * (dy[i] - dbeta[ch] * inv_m - xhat * (dgamma[ch] * inv_m));
  });
}

// --- layer norm, embedding -------------------------------------------------------------------------

void k_layer_norm(const KernelCall& c) {
  const std::int64_t cols = c.inputs[0].shape->cols();
  const In x = in(c.inputs[0]);
  const float* stats = c.inputs[1].f32();
  const In gamma = in(c.inputs[2]);
  const In beta = in(c.inputs[3]);
  const Out y = out(c.outputs[0]);
  for_each_index(c.outputs[0].numel(), "layer_norm", [=] __device__(std::int64_t i) {
    const std::int64_t r = i / cols, j = i % cols;
    y.set(i, (x[i] - stats[2 * r]) * stats[2 * r + 1] * gamma[j] + beta[j]);
  });
}

// Ids outside [0, V) give zero rows here; the CPU kernel stops on them, and the data feeders
// validate ids before a step, so they do not reach a kernel. A vocabulary-parallel slice (world
// > 1) holds ids [start, start + V).
void k_embedding(const KernelCall& c) {
  const std::int32_t* ids = c.inputs[0].i32();
  const float* table = c.inputs[1].f32();
  const std::int64_t vocab = (*c.inputs[1].shape)[0], dim = (*c.inputs[1].shape)[1];
  const std::int64_t start = c.attrs->world > 1 ? c.attrs->start : 0;
  float* y = c.outputs[0].f32();
  for_each_index(c.outputs[0].numel(), "embedding", [=] __device__(std::int64_t i) {
    const std::int64_t id = ids[i / dim] - start;
    y[i] = (id >= 0 && id < vocab) ? table[id * dim + i % dim] : 0.0f;
  });
}

// dtable[v, j] = sum of dy[i, j] over positions i with ids[i] == v, in position order (the
// CPU's order). Thread (j, lane) owns the rows v with v % kIdLanes == lane of column j.
constexpr int kIdLanes = 16, kDimTile = 32;

// A call for a slice of the table's rows (KernelCall::first_row) sums the positions whose id is
// in the slice.
__global__ void embedding_backward_kernel(const float* dy, const std::int32_t* ids, std::int64_t positions,
                                          std::int64_t first_row, std::int64_t vocab, std::int64_t dim, float* dtable) {
  const std::int64_t j = blockIdx.x * std::int64_t(kDimTile) + threadIdx.x;
  const int lane = threadIdx.y;
  if (j >= dim) return;
  for (std::int64_t i = 0; i < positions; ++i) {
    const std::int64_t id = ids[i] - first_row;
    if (id < 0 || id >= vocab || id % kIdLanes != lane) continue;
    dtable[id * dim + j] += dy[i * dim + j];
  }
}

void k_embedding_backward(const KernelCall& c) {
  const std::int64_t vocab = (*c.outputs[0].shape)[0], dim = (*c.outputs[0].shape)[1];
  float* dt = c.outputs[0].f32();
  MEMPLAN_CUDA_CHECK(cudaMemsetAsync(dt, 0, static_cast<std::size_t>(c.outputs[0].numel()) * sizeof(float), stream()));
  const unsigned grid = static_cast<unsigned>((dim + kDimTile - 1) / kDimTile);
  embedding_backward_kernel<<<grid, dim3(kDimTile, kIdLanes), 0, stream()>>>(c.inputs[0].f32(), c.inputs[1].i32(),
                                                                             c.inputs[1].numel(), c.first_row + (c.attrs->world > 1 ? c.attrs->start : 0),
                                                                             vocab, dim, dt);
  check_launch("embedding_backward");
}

// --- permute -------------------------------------------------------------------------------------

constexpr int kMaxRank = 8;
struct PermuteGeometry {
  int rank;
  std::int64_t out_dims[kMaxRank];
  std::int64_t in_strides[kMaxRank];  // the input stride of output dim i
};

template <typename T>
void permute_typed(const KernelCall& c, const PermuteGeometry& geo) {
  const T* src = static_cast<const T*>(c.inputs[0].data);
  T* dst = static_cast<T*>(c.outputs[0].data);
  for_each_index(c.outputs[0].numel(), "permute", [=] __device__(std::int64_t i) {
    std::int64_t rem = i, offset = 0;
    for (int d = geo.rank - 1; d >= 0; --d) {
      offset += (rem % geo.out_dims[d]) * geo.in_strides[d];
      rem /= geo.out_dims[d];
    }
    dst[i] = src[offset];
  });
}

void k_permute(const KernelCall& c) {
  const graph::Shape& in = *c.inputs[0].shape;
  const graph::Shape& out = *c.outputs[0].shape;
  const int r = in.rank();
  MEMPLAN_CHECK(r <= kMaxRank, "permute of rank " << r << " (the CUDA kernel takes up to " << kMaxRank << ")");
  PermuteGeometry geo{};
  geo.rank = r;
  for (int i = 0; i < r; ++i) {
    std::int64_t stride = 1;
    const auto dim = static_cast<int>(c.attrs->perm[static_cast<std::size_t>(i)]);
    for (int k = dim + 1; k < r; ++k) stride *= in[k];
    geo.out_dims[i] = out[i];
    geo.in_strides[i] = stride;
  }
  switch (graph::dtype_size(c.inputs[0].dtype)) {
    case 2: permute_typed<std::uint16_t>(c, geo); break;
    case 4: permute_typed<std::uint32_t>(c, geo); break;
    case 8: permute_typed<std::uint64_t>(c, geo); break;
    default: MEMPLAN_CHECK(false, "permute of an unsupported element size");
  }
}

}  // namespace

KernelEntries nn_16bit_kernel_entries() { return at_16_bits({{OpKind::layer_norm, k_layer_norm}}); }

KernelEntries nn_kernel_entries() {
  return {
      {OpKind::im2col, k_im2col},
      {OpKind::col2im, k_col2im},
      {OpKind::grouped_conv2d, k_grouped_conv2d},
      {OpKind::channel_scale, k_channel_scale},
      {OpKind::channel_scale_backward, k_channel_scale_backward},
      {OpKind::grouped_conv2d_backward_input, k_grouped_conv2d_backward_input},
      {OpKind::grouped_conv2d_backward_weight, k_grouped_conv2d_backward_weight},
      {OpKind::max_pool2d, k_max_pool2d},
      {OpKind::avg_pool2d, k_avg_pool2d},
      {OpKind::max_pool2d_backward, k_max_pool2d_backward},
      {OpKind::avg_pool2d_backward, k_avg_pool2d_backward},
      {OpKind::global_avg_pool_backward, k_global_avg_pool_backward},
      {OpKind::batch_norm, k_batch_norm},
      {OpKind::batch_norm_inference, k_batch_norm_inference},
      {OpKind::batch_norm_backward, k_batch_norm_backward},
      {OpKind::layer_norm, k_layer_norm},
      {OpKind::embedding, k_embedding},
      {OpKind::embedding_backward, k_embedding_backward},
      {OpKind::permute, k_permute},
  };
}

}  // namespace memplan::kernels::cuda
