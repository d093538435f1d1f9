// Tensor descriptors: what a tensor is (shape, dtype, role, aliasing), never where it lives.
// Devices, pointers and offsets belong to runtime/ and planner/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan::graph {

// The ranks a collective runs over (graph/tensor_parallel.h, graph/expert_parallel.h): `data`,
// the ranks that hold the same slice of the model (every rank without tensor parallelism);
// `tensor`, the ranks that split each layer between them; `expert`, the data ranks that split the
// experts between them and exchange tokens; `expert_data`, the data ranks that hold the same
// experts (their gradients are summed over these).
enum class RankGroup : std::uint8_t { data, tensor, expert, expert_data };

// f32 executes; the 16-bit and integer types exist for sizes and planning (i32 also for labels
// and token ids).
enum class DType : std::uint8_t { f32, f16, bf16, i32, u8, i64 };  // i64 last: kernels/kernel.h sizes its table by it

// Every dtype's name (the first row of a value) and the aliases the CLI also takes (--dtype f32).
inline constexpr EnumName<DType> kDTypeNames[] = {
    {"fp32", DType::f32}, {"f32", DType::f32}, {"bf16", DType::bf16}, {"fp16", DType::f16},
    {"f16", DType::f16},  {"i32", DType::i32}, {"u8", DType::u8}, {"i64", DType::i64}};

Bytes dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
inline bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }
// bf16 or f16: a mixed-precision step's working dtype (graph/mixed_precision.h).
inline bool is_16bit_float(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }
// The rows of kDTypeNames for floating dtypes: what --dtype takes.
std::span<const EnumName<DType>> float_dtype_names();
// A floating dtype by any of its names ("fp32", "f32", "bf16", "fp16", "f16"); the error lists them.
Result<DType> parse_float_dtype(std::string_view name);

// A model or graph the user described is inconsistent (shape mismatch, bad config).
struct GraphError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// Sizes that multiply past what a tensor may hold: the model cannot be represented at these
// sizes (a batch, sequence or width too large), as opposed to being inconsistent.
struct SizeError : GraphError {
  using GraphError::GraphError;
};

// The most bytes one tensor may hold: the planner's limit on one buffer (planner/allocation_problem.h).
inline constexpr Bytes kMaxTensorBytes = Bytes{1} << 60;

[[noreturn]] void throw_size_overflow(std::int64_t a, std::int64_t b);
// a * b for sizes (both >= 0); throws SizeError when the product does not fit in 64 bits.
// Inline: tensor sizes are computed for every operand wherever a step is planned.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) [[unlikely]] throw_size_overflow(a, b);
  return product;
}

struct Shape {
  std::vector<std::int64_t> dims;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d) : dims(d) {}
  explicit Shape(std::vector<std::int64_t> d) : dims(std::move(d)) {}

  int rank() const { return static_cast<int>(dims.size()); }
  std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  // 1 for a scalar (rank 0). Throws SizeError when the product does not fit in 64 bits (never for
  // a tensor of a graph: Graph::add_tensor refuses those).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : dims) n = checked_mul(n, d);
    return n;
  }
  // Product of all dims but the last (the "rows" of a row-major matrix view).
  std::int64_t rows() const;
  std::int64_t cols() const { return dims.empty() ? 1 : dims.back(); }
  std::string to_string() const;  // e.g. "[128, 784]"
  bool operator==(const Shape&) const = default;
};

// Why a tensor exists decides how long it lives: parameters and optimizer state persist across
// steps; everything else is transient within one step.
// communication: buffers collectives fill or read (gradient buckets, reduce-scatter results,
// parameters gathered under ZeRO-3; graph/data_parallel.h).
enum class Role : std::uint8_t { parameter, optimizer_state, input, activation, gradient, temporary, communication };

std::string_view role_name(Role role);
inline bool is_persistent(Role role) { return role == Role::parameter || role == Role::optimizer_state; }

// How a persistent tensor is initialised before the first step (from the run's seed).
struct InitSpec {
  enum class Kind : std::uint8_t { zeros, ones, uniform, normal } kind = Kind::zeros;
  float scale = 0.0f;  // uniform: U(-scale, scale); normal: N(0, scale^2)
};

struct TensorDesc {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Role role = Role::activation;
  // A view shares its base's storage (no copy); the planner gives the base one buffer whose
  // lifetime covers every view of it.
  TensorId view_of = kNoTensor;
  InitSpec init;             // parameters and optimizer state only
  TensorId grad = kNoTensor; // parameters: their gradient, once autograd has run
  // A parameter that does not train (fine-tuning: a frozen base under LoRA adapters, --freeze):
  // autograd gives it no gradient, so it has no optimizer state or master copy, and the backward
  // pass keeps nothing only its gradient would read.
  bool frozen = false;
  // Persistent storage outside the arena that the caller binds (Executor::bind_external): a KV
  // cache pool, whose size changes with serving load, not with the step. The planner gives it no
  // buffer.
  bool external = false;
  // Lives in host memory, not the device's (optimizer offload: state, master copies and the
  // gradients copied out for the CPU's update): planned in the plan's host region, outside the
  // arena (MemoryPlan::host_buffers), for the whole step.
  bool host = false;
  // Data parallel (graph/data_parallel.h): this persistent tensor is one rank's shard of the
  // flattened tensor `shard_of`, holding its elements [shard_offset, shard_offset + shard_count)
  // (the rest is padding, zero), and is initialised as that range of `shard_of` would be.
  TensorId shard_of = kNoTensor;
  std::int64_t shard_offset = 0;
  std::int64_t shard_count = 0;
  // Mixed precision (graph/optimizer.h): this f32 optimizer state is the master copy of the 16-bit
  // parameter `master_of`, initialised with that parameter's values before rounding, over its
  // elements [master_offset, master_offset + size) (ZeRO-1/2 give each rank a range; padding 0).
  TensorId master_of = kNoTensor;
  std::int64_t master_offset = 0;

  // Tensor parallel (graph/tensor_parallel.h): this parameter (or its optimizer state) is slice
  // `tp_index` of `tp_parts` equal slices along dimension `tp_axis` of the whole tensor, whose
  // shape is this one's with that dimension `tp_parts` times longer (padded at its end where the
  // model's size does not divide: a vocabulary), and is initialised as that slice of the whole
  // tensor would be; `tp_whole` is that dimension's length before padding. tp_axis < 0: the
  // tensor is whole on every rank.
  int tp_axis = -1;
  int tp_parts = 1;
  int tp_index = 0;
  std::int64_t tp_whole = 0;
  // Expert parallel (graph/expert_parallel.h): the stacked weights of a mixture layer's experts (or
  // their optimizer state) holding share `ep_index` of `ep_parts` equal shares of the experts,
  // dimension 0, of a whole tensor whose dimension 0 is ep_parts times longer; with a
  // tensor-parallel slice too, along another dimension. ep_parts 1: every expert.
  int ep_parts = 1;
  int ep_index = 0;

  Bytes size_bytes() const { return shape.numel() * dtype_size(dtype); }
  bool is_view() const { return view_of != kNoTensor; }
};

}  // namespace memplan::graph
