// Shape and layout: views (reshape), copies (permute, concat, slice), gathers, and the same ops
// folded on constants (shape arithmetic at the requested batch).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "memplan/import/onnx_handlers.h"
#include "memplan/import/onnx_importer.h"

namespace memplan::import {

using graph::DType;
using graph::Shape;

namespace {

void h_flatten(Importer& im, const onnx::NodeProto&) {
  const TensorId x = im.tensor(0);
  const Shape xs = im.shape_of(x);
  const std::int64_t axis = im.axis_of(im.attr_int("axis", 1), xs.rank());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < xs.rank(); ++d) (d < axis ? outer : inner) = graph::checked_mul(d < axis ? outer : inner, xs[d]);
  im.set_tensor(0, im.reshape_to(x, Shape{outer, inner}, im.out_name()));
}

void h_reshape(Importer& im, const onnx::NodeProto&) {
  std::vector<std::int64_t> target = im.ints_of(1);
  if (im.attr_int("allowzero", 0) != 0) im.fail("allowzero 1 is not supported");
  const bool on_constant = im.is_constant(0);
  const Shape xs = on_constant ? Shape(im.constant(0).dims) : im.shape_of(im.tensor(0));
  // A static export bakes its batch into reshape targets: the first entry follows --batch.
  if (!on_constant && !target.empty() && im.file_batch() > 0 && target[0] == im.file_batch() && xs.rank() > 0 &&
      xs[0] == im.options().batch) {
    target[0] = im.options().batch;
  }
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0) {
      if (static_cast<int>(i) >= xs.rank()) im.fail("reshape target copies a dimension the input does not have");
      target[i] = xs[static_cast<int>(i)];
    }
    if (target[i] == -1) {
      if (infer >= 0) im.fail("reshape target has two -1 entries");
      infer = static_cast<int>(i);
    } else if (target[i] < 0) {
      im.fail("reshape target has a negative entry " + std::to_string(target[i]));
    } else {
      known = graph::checked_mul(known, target[i]);
    }
  }
  if (infer >= 0) {
    if (known == 0 || xs.numel() % known != 0) im.fail("cannot reshape " + xs.to_string() + " with a -1 entry");
    target[static_cast<std::size_t>(infer)] = xs.numel() / known;
  }
  if (Shape(target).numel() != xs.numel()) im.fail("cannot reshape " + xs.to_string() + " to " + Shape(target).to_string());
  if (on_constant) {
    Constant c = im.constant(0);
    c.dims = target;
    return im.set(0, constant_value(std::move(c)));
  }
  im.set_tensor(0, im.reshape_to(im.tensor(0), Shape(target), im.out_name()));
}

void h_transpose(Importer& im, const onnx::NodeProto&) {
  const Value& v = im.in(0);
  if (v.kind == Value::Kind::initializer && v.constant.is_float && v.constant.dims.size() == 2) {
    const auto perm = im.attr_ints("perm");
    if (perm.empty() || perm == std::vector<std::int64_t>{1, 0}) {
      // W^T of a weight: the matmul reading it transposes instead (no copy).
      return im.set(0, pending(Value::Kind::transposed, im.tensor(0)));
    }
  }
  const bool on_constant = im.is_constant(0);
  const std::vector<std::int64_t> dims = on_constant ? im.constant(0).dims : im.shape_of(im.tensor(0)).dims;
  const int rank = static_cast<int>(dims.size());
  std::vector<std::int64_t> perm = im.attr_ints("perm");
  if (perm.empty()) {
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  std::vector<std::int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool permutation = static_cast<int>(sorted.size()) == rank;
  for (int i = 0; permutation && i < rank; ++i) permutation = sorted[static_cast<std::size_t>(i)] == i;
  if (!permutation) im.fail("perm is not a permutation of the input's " + std::to_string(rank) + " axes");
  if (on_constant) {
    // A constant's axes permuted on the host (the exporter's reordering of F.pad's pad list).
    const Constant& c = im.constant(0);
    Constant r;
    r.is_float = c.is_float;
    for (std::int64_t p : perm) r.dims.push_back(dims[static_cast<std::size_t>(p)]);
    std::vector<std::int64_t> in_stride(dims.size(), 1);
    for (int k = rank - 2; k >= 0; --k) in_stride[static_cast<std::size_t>(k)] = in_stride[static_cast<std::size_t>(k) + 1] * dims[static_cast<std::size_t>(k) + 1];
    for (std::int64_t idx = 0; idx < r.numel(); ++idx) {
      std::int64_t rem = idx, src = 0;
      for (int k = rank - 1; k >= 0; --k) {
        const auto ku = static_cast<std::size_t>(k);
        src += (rem % r.dims[ku]) * in_stride[static_cast<std::size_t>(perm[ku])];
        rem /= r.dims[ku];
      }
      r.append(c, src);
    }
    return im.set(0, constant_value(std::move(r)));
  }
  const TensorId x = im.tensor(0);
  bool identity = true;
  for (int i = 0; i < rank; ++i) identity = identity && perm[static_cast<std::size_t>(i)] == i;
  im.set_tensor(0, identity ? x : im.builder().permute(x, perm, im.out_name()));
}

void h_concat(Importer& im, const onnx::NodeProto& n) {
  bool all_constant = true;
  for (int i = 0; i < n.input_size(); ++i) all_constant = all_constant && im.is_constant(i);
  if (all_constant) {
    // Along any axis (Swin's index tuples [rows, cols, 2]): for each index before the axis, each
    // operand's block after it in turn. Integers stay integers unless an operand is float.
    const Constant& first = im.constant(0);
    const int rank = static_cast<int>(first.dims.size());
    if (rank == 0) im.fail("scalars cannot be concatenated");
    const auto axis = static_cast<std::size_t>(im.axis_of(im.attr_int("axis", 0), rank));
    Constant c;
    c.dims = first.dims;
    c.dims[axis] = 0;
    for (int i = 0; i < n.input_size(); ++i) {
      const Constant& p = im.constant(i);
      c.is_float = c.is_float || p.is_float;
      bool same = p.dims.size() == first.dims.size();
      for (std::size_t d = 0; same && d < p.dims.size(); ++d) same = d == axis || p.dims[d] == first.dims[d];
      if (!same) im.fail("constants of shapes " + Shape(first.dims).to_string() + " and " + Shape(p.dims).to_string() + " do not concatenate along axis " + std::to_string(axis));
      c.dims[axis] += p.dims[axis];
    }
    im.check_fold_size(c.numel());
    std::int64_t outer = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= first.dims[d];
    for (std::int64_t o = 0; o < outer; ++o) {
      for (int i = 0; i < n.input_size(); ++i) {
        const Constant& p = im.constant(i);
        const std::int64_t block = outer == 0 ? 0 : p.numel() / outer;
        for (std::int64_t e = 0; e < block; ++e) c.append(p, o * block + e);  // integers exact (INT64_MAX ends)
      }
    }
    return im.set(0, constant_value(c));
  }
  TensorId y = im.tensor(0);
  const std::int64_t axis = im.axis_of(im.attr_int("axis", 0), im.shape_of(y).rank());
  for (int i = 1; i < n.input_size(); ++i) {
    y = im.builder().concat(y, im.tensor(i), axis, i + 1 == n.input_size() ? im.out_name() : im.out_name() + ".part" + std::to_string(i));
  }
  im.set_tensor(0, y);
}

void h_split(Importer& im, const onnx::NodeProto& n) {
  const TensorId x = im.tensor(0);
  const Shape xs = im.shape_of(x);
  const std::int64_t axis = im.axis_of(im.attr_int("axis", 0), xs.rank());
  std::vector<std::int64_t> sizes = im.has_in(1) ? im.ints_of(1) : im.attr_ints("split");
  if (sizes.empty()) {
    if (xs[static_cast<int>(axis)] % n.output_size() != 0) im.fail("the axis does not split evenly");
    sizes.assign(static_cast<std::size_t>(n.output_size()), xs[static_cast<int>(axis)] / n.output_size());
  }
  if (static_cast<int>(sizes.size()) != n.output_size()) im.fail("split sizes and outputs differ in number");
  std::int64_t start = 0;
  for (int i = 0; i < n.output_size(); ++i) {
    const std::int64_t len = sizes[static_cast<std::size_t>(i)];
    if (len < 0 || start + len > xs[static_cast<int>(axis)]) im.fail("split sizes exceed the axis");
    im.set_tensor(i, im.builder().slice(x, axis, start, len, n.output(i)));
    start += len;
  }
  if (start != xs[static_cast<int>(axis)]) im.fail("split sizes do not add up to the axis");
}

// Elements lo, lo + k, ... (count of them) of axis a of y, k dividing the axis: the axis viewed as
// [d / k, k], its rows sliced, then the one offset lo % k.
TensorId strided_slice(Importer& im, TensorId y, int a, std::int64_t lo, std::int64_t k, std::int64_t count, const std::string& name) {
  const Shape before = im.shape_of(y);
  Shape split, merged;
  for (int j = 0; j < before.rank(); ++j) {
    split.dims.push_back(j == a ? before[j] / k : before[j]);
    if (j == a) split.dims.push_back(k);
    merged.dims.push_back(j == a ? count : before[j]);
  }
  y = im.reshape_to(y, split, name + ".split");
  if (lo / k != 0 || count != before[a] / k) y = im.builder().slice(y, a, lo / k, count, name + ".rows");
  y = im.builder().slice(y, a + 1, lo % k, 1, name + ".offset");
  return im.reshape_to(y, merged, name);
}

// Slice with ONNX's semantics for starts, ends and steps (negative indices from the end, clamped).
// On constants any step (the exporter reverses F.pad's pad list with step -1); on tensors step 1
// is a slice, and a step k > 1 along an axis k divides (Swin's patch merging, x[..., 0::2, 1::2, :])
// is a slice of the axis viewed as [d / k, k]: rows first, then the one offset; a negative step
// (a reversed tensor) is refused.
void h_slice(Importer& im, const onnx::NodeProto&) {
  const std::vector<std::int64_t> starts = im.ints_of(1), ends = im.ints_of(2);
  if (starts.size() != ends.size()) im.fail("starts and ends differ in length");
  std::vector<std::int64_t> axes = im.has_in(3) ? im.ints_of(3) : std::vector<std::int64_t>{};
  if (axes.empty()) {
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
  }
  const std::vector<std::int64_t> steps = im.has_in(4) ? im.ints_of(4) : std::vector<std::int64_t>(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) im.fail("starts, ends, axes and steps differ in length");
  const bool on_constant = im.in(0).kind == Value::Kind::constant || im.in(0).kind == Value::Kind::initializer;
  std::vector<std::int64_t> dims = on_constant ? im.in(0).constant.dims : im.shape_of(im.tensor(0)).dims;
  const int rank = static_cast<int>(dims.size());
  // Per axis: the first index taken, the step, and how many.
  struct AxisSlice {
    std::int64_t lo = 0, step = 1, len = 0;
  };
  std::vector<AxisSlice> ax(dims.size());
  for (std::size_t j = 0; j < dims.size(); ++j) ax[j].len = dims[j];
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (steps[i] == 0 || steps[i] == std::numeric_limits<std::int64_t>::min()) im.fail("a slice step of " + std::to_string(steps[i]));
    const auto a = static_cast<std::size_t>(im.axis_of(axes[i], rank));
    const std::int64_t d = dims[a];
    std::int64_t s = starts[i] < 0 ? starts[i] + d : starts[i];
    std::int64_t e = ends[i] < 0 ? ends[i] + d : ends[i];
    std::int64_t count = 0;
    if (steps[i] > 0) {
      s = std::clamp<std::int64_t>(s, 0, d);
      e = std::clamp<std::int64_t>(e, 0, d);
      count = e > s ? 1 + (e - s - 1) / steps[i] : 0;
    } else {
      s = std::clamp<std::int64_t>(s, 0, d - 1);
      e = std::clamp<std::int64_t>(e, -1, d - 1);
      count = s > e ? 1 + (s - e - 1) / -steps[i] : 0;
    }
    ax[a] = {s, steps[i], count};
  }
  if (on_constant) {
    const Constant& c = im.loaded(0).constant;
    Constant r;
    for (const AxisSlice& x : ax) r.dims.push_back(x.len);
    r.is_float = c.is_float;
    const std::int64_t total = r.numel();
    for (std::int64_t idx = 0; idx < total; ++idx) {
      std::int64_t rem = idx, src = 0, stride = 1;
      for (int k = rank - 1; k >= 0; --k) {
        const auto ku = static_cast<std::size_t>(k);
        const std::int64_t coord = ax[ku].lo + (rem % ax[ku].len) * ax[ku].step;
        rem /= ax[ku].len;
        src += coord * stride;
        stride *= dims[ku];
      }
      r.append(c, src);
    }
    Value v;
    v.kind = Value::Kind::constant;
    v.constant = std::move(r);
    return im.set(0, v);
  }
  TensorId y = im.tensor(0);
  for (int a = 0; a < rank; ++a) {
    const auto au = static_cast<std::size_t>(a);
    const std::int64_t d = dims[au];
    if (ax[au].lo == 0 && ax[au].len == d && ax[au].step == 1) continue;
    if (ax[au].len == 0) im.fail("an empty slice");
    const std::string name = im.out_name() + ".axis" + std::to_string(a);
    if (ax[au].step == 1 || ax[au].len == 1) {
      y = im.builder().slice(y, a, ax[au].lo, ax[au].len, name);
      continue;
    }
    const std::int64_t k = ax[au].step;
    if (k < 0) im.fail("a slice with a negative step (a reversed tensor) is not supported");
    if (d % k != 0) im.fail("a slice with step " + std::to_string(k) + " along an axis of " + std::to_string(d) + " (memplan takes steps that divide the axis)");
    y = strided_slice(im, y, a, ax[au].lo, k, ax[au].len, name);
  }
  im.set_tensor(0, y);
}

void h_gather(Importer& im, const onnx::NodeProto& n) {
  const std::int64_t axis_attr = im.attr_int("axis", 0);
  if (im.is_constant(0) && im.is_constant(1)) {
    const Constant& data = im.constant(0);
    if (data.dims.size() != 1 || axis_attr != 0) im.fail("constants are gathered from lists only");
    const Constant& idx = im.constant(1);
    Constant r;
    r.dims = idx.dims;
    r.is_float = data.is_float;
    for (std::int64_t k = 0; k < idx.numel(); ++k) {
      std::int64_t i = im.to_int(idx.at(k));
      if (i < 0) i += data.dims[0];
      if (i < 0 || i >= data.dims[0]) im.fail("index " + std::to_string(i) + " out of range");
      r.append(data, i);
    }
    return im.set(0, constant_value(r));
  }
  if (im.is_constant(1) && im.constant(1).numel() == 1) {
    // x[..., i, ...] along one axis by a constant index: a slice (and a reshape without the axis
    // for a scalar index), as a ViT reads its class token.
    const TensorId x = im.tensor(0);
    const Shape xs = im.shape_of(x);
    const std::int64_t axis = im.axis_of(axis_attr, xs.rank());
    std::int64_t i = im.to_int(im.constant(1).at(0));
    if (i < 0) i += xs[static_cast<int>(axis)];
    if (i < 0 || i >= xs[static_cast<int>(axis)]) im.fail("index out of range");
    const bool scalar = im.constant(1).dims.empty();
    const TensorId y = im.builder().slice(x, axis, i, 1, scalar ? im.out_name() + ".slice" : im.out_name());
    if (!scalar) return im.set_tensor(0, y);
    std::vector<std::int64_t> dims = xs.dims;
    dims.erase(dims.begin() + axis);
    return im.set_tensor(0, im.reshape_to(y, Shape(dims), im.out_name()));
  }
  if (im.is_constant(1)) {
    // Rows of a learned table picked by constant indices (Swin's and MaxViT's relative-position
    // bias, table[index]): the indices become an i32 buffer and the lookup an embedding, whose
    // backward sums each row's gradient.
    const TensorId table = im.tensor(0);
    const Shape ts = im.shape_of(table);
    if (axis_attr != 0 || ts.rank() != 2) im.fail("memplan gathers rows of a [V, D] table (axis 0) only");
    if (ts[0] > (std::int64_t{1} << 24)) im.fail("constant indices into a table of more than 2^24 rows are not supported");
    const Constant& idx = im.constant(1);
    std::vector<std::int64_t> rows;
    rows.reserve(static_cast<std::size_t>(idx.numel()));
    for (std::int64_t k = 0; k < idx.numel(); ++k) {
      std::int64_t i = im.to_int(idx.at(k));
      if (i < 0) i += ts[0];
      if (i < 0 || i >= ts[0]) im.fail("index " + std::to_string(im.to_int(idx.at(k))) + " is out of range for the table's " + std::to_string(ts[0]) + " rows");
      rows.push_back(i);
    }
    const TensorId ids = im.index_buffer(n.input(1), Shape(idx.dims), rows);
    return im.set_tensor(0, im.builder().embedding(ids, table, im.out_name()));
  }
  // An embedding lookup: rows of a [V, D] table picked by integer ids.
  const TensorId table = im.tensor(0);
  const TensorId ids = im.tensor(1);
  if (axis_attr != 0 || im.shape_of(table).rank() != 2) im.fail("memplan gathers rows of a [V, D] table (axis 0) only");
  if (im.desc(ids).dtype != DType::i32) im.fail("the indices '" + im.desc(ids).name + "' must be integer token ids");
  im.set_tensor(0, im.builder().embedding(ids, table, im.out_name()));
}

void h_unsqueeze(Importer& im, const onnx::NodeProto&) {
  const std::vector<std::int64_t> axes = im.has_in(1) ? im.ints_of(1) : im.attr_ints("axes");
  const bool on_constant = im.is_constant(0);
  std::vector<std::int64_t> dims = on_constant ? im.constant(0).dims : im.shape_of(im.tensor(0)).dims;
  const int rank = static_cast<int>(dims.size() + axes.size());
  std::vector<std::int64_t> sorted;
  for (std::int64_t a : axes) sorted.push_back(im.axis_of(a, rank));
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t a : sorted) dims.insert(dims.begin() + a, 1);
  if (on_constant) {
    Constant c = im.constant(0);
    c.dims = dims;
    return im.set(0, constant_value(c));
  }
  im.set_tensor(0, im.reshape_to(im.tensor(0), Shape(dims), im.out_name()));
}

void h_squeeze(Importer& im, const onnx::NodeProto&) {
  std::vector<std::int64_t> axes = im.has_in(1) ? im.ints_of(1) : im.attr_ints("axes");
  const bool on_constant = im.is_constant(0);
  const std::vector<std::int64_t> dims = on_constant ? im.constant(0).dims : im.shape_of(im.tensor(0)).dims;
  const int rank = static_cast<int>(dims.size());
  std::set<std::int64_t> drop;
  for (std::int64_t a : axes) drop.insert(im.axis_of(a, rank));
  std::vector<std::int64_t> out;
  for (int i = 0; i < rank; ++i) {
    const bool squeeze = axes.empty() ? dims[static_cast<std::size_t>(i)] == 1 : drop.count(i) > 0;
    if (squeeze && dims[static_cast<std::size_t>(i)] != 1) im.fail("axis " + std::to_string(i) + " has size " + std::to_string(dims[static_cast<std::size_t>(i)]) + ", not 1");
    if (!squeeze) out.push_back(dims[static_cast<std::size_t>(i)]);
  }
  if (on_constant) {
    Constant c = im.constant(0);
    c.dims = out;
    return im.set(0, constant_value(c));
  }
  im.set_tensor(0, im.reshape_to(im.tensor(0), Shape(out), im.out_name()));
}

void h_expand(Importer& im, const onnx::NodeProto&) {
  const std::vector<std::int64_t> target = im.ints_of(1);
  if (im.is_constant(0)) {
    // Broadcast on the host: each value of x against a zero of the target's shape.
    const Constant& c = im.constant(0);
    Constant zeros;
    zeros.dims = target;
    for (std::int64_t d : target) {
      if (d < 0) im.fail("a negative dimension in the target shape");
    }
    im.check_fold_size(zeros.numel());
    zeros.ints.assign(static_cast<std::size_t>(zeros.numel()), 0);
    return im.set(0, constant_value(im.fold_binary(c, zeros, [](double a, double) { return a; })));
  }
  const TensorId x = im.tensor(0);
  const Shape xs = im.shape_of(x);
  // numpy broadcasting of x against the target shape
  const std::size_t rank = std::max<std::size_t>(target.size(), xs.dims.size());
  std::vector<std::int64_t> dx(rank, 1), out(rank, 1);
  std::copy(xs.dims.begin(), xs.dims.end(), dx.begin() + static_cast<std::ptrdiff_t>(rank - xs.dims.size()));
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t t = k + target.size() >= rank ? target[k + target.size() - rank] : 1;
    if (dx[k] != t && dx[k] != 1 && t != 1) im.fail("cannot expand " + xs.to_string() + " to " + Shape(target).to_string());
    out[k] = std::max(dx[k], t);
  }
  if (Shape(out) == xs) return im.set_tensor(0, x);
  // Only leading dims may grow (a class token expanded over the batch): zeros plus x as a bias.
  std::size_t first_kept = 0;
  while (first_kept < rank && dx[first_kept] == 1 && out[first_kept] != 1) ++first_kept;
  for (std::size_t k = first_kept; k < rank; ++k) {
    if (dx[k] != out[k]) im.fail("memplan expands leading dimensions only; cannot expand " + xs.to_string() + " to " + Shape(out).to_string());
  }
  const TensorId y = im.repeat_as_rows(x, Shape(out).numel() / xs.numel(), im.out_name());
  im.set_tensor(0, im.reshape_to(y, Shape(out), im.out_name()));
}

void h_identity(Importer& im, const onnx::NodeProto&) { im.set(0, im.in(0)); }

void h_cast(Importer& im, const onnx::NodeProto&) {
  const std::int64_t to = im.attr_int("to", 0);
  const bool to_float = to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE || to == onnx::TensorProto::FLOAT16 ||
                        to == onnx::TensorProto::BFLOAT16;
  const bool to_integer = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32 || to == onnx::TensorProto::BOOL;
  if (!to_float && !to_integer) im.fail("Cast to ONNX type " + std::to_string(to) + " is not supported");
  if (im.is_constant(0) || im.in(0).kind == Value::Kind::constant) {
    Constant c = im.constant(0);
    if (to_float && !c.is_float) {
      c.floats.assign(c.ints.begin(), c.ints.end());
      c.ints.clear();
      c.is_float = true;
    } else if (to_integer && c.is_float) {
      for (double f : c.floats) c.ints.push_back(im.to_int(f));
      c.floats.clear();
      c.is_float = false;
    }
    return im.set(0, constant_value(c));
  }
  const TensorId x = im.tensor(0);
  if (graph::is_floating(im.desc(x).dtype) != to_float) im.fail("a Cast between integer and float tensors is not supported");
  im.set_tensor(0, x);
}

}  // namespace

HandlerRows shape_handlers() {
  static constexpr HandlerRow rows[] = {
      {"Flatten", h_flatten},
      {"Reshape", h_reshape},
      {"Transpose", h_transpose},
      {"Concat", h_concat},
      {"Split", h_split},
      {"Slice", h_slice},
      {"Gather", h_gather},
      {"Unsqueeze", h_unsqueeze},
      {"Squeeze", h_squeeze},
      {"Expand", h_expand},
      {"Identity", h_identity},
      {"Cast", h_cast},
  };
  return rows;
}

}  // namespace memplan::import
