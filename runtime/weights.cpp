#include "memplan/runtime/weights.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "memplan/common/atomic_file.h"
#include "memplan/common/input_file.h"
#include "memplan/common/sha256.h"
#include "memplan/kernels/half.h"

namespace memplan::runtime {
namespace {

// State an optimizer update reads and writes (momentum, Adam moments), as opposed to the
// model's own buffers: only the former may be absent from a file, or present in a file and
// absent from a graph (an evaluation graph has no optimizer).
bool is_optimizer_state(const graph::Graph& g, TensorId id) {
  if (g.tensor(id).role != graph::Role::optimizer_state) return false;
  for (const graph::Op& op : g.ops()) {
    if (op.phase != graph::Phase::optimizer) continue;
    for (TensorId u : op.updates) {
      if (u == id) return true;
    }
  }
  return false;
}

// Names a file tensor may carry without the graph having it: "<parameter>.<state>".
bool looks_like_optimizer_state(const graph::Graph& g, const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  const TensorId owner = g.find(name.substr(0, dot));
  return owner != kNoTensor && g.tensor(owner).role == graph::Role::parameter;
}

// A floating entry's values as f32 (16-bit ones widened exactly).
std::vector<float> entry_values(const SafetensorsEntry& e) {
  const std::size_t n = e.data.size() / static_cast<std::size_t>(graph::dtype_size(e.dtype));
  std::vector<float> values(n);
  kernels::widen_to_f32(e.dtype, e.data.data(), values.data(), static_cast<std::int64_t>(n));
  return values;
}

// Where a tensor saved at another precision comes from, exactly: an f32 parameter from the f32
// master copy a 16-bit run saved beside its working copy (else the working copy, widened); a
// 16-bit parameter from the f32 one (rounded, as its working copy always is); a master copy the
// file lacks from the f32 parameter it copies. nullptr where the file has no such source.
const SafetensorsEntry* conversion_source(const graph::Graph& g, const graph::TensorDesc& t, const SafetensorsView& file) {
  if (!graph::is_floating(t.dtype)) return nullptr;
  if (t.master_of != kNoTensor) {
    const SafetensorsEntry* param = file.find(g.tensor(t.master_of).name);
    const bool whole = t.master_offset == 0 && t.shape.numel() == g.tensor(t.master_of).shape.numel();
    return param != nullptr && param->dtype == graph::DType::f32 && whole ? param : nullptr;
  }
  const SafetensorsEntry* same_name = file.find(t.name);
  if (same_name == nullptr || !graph::is_floating(same_name->dtype) || same_name->shape != t.shape.dims) return nullptr;
  const SafetensorsEntry* master = file.find(t.name + ".master");
  if (master != nullptr && master->dtype == graph::DType::f32 && master->shape == t.shape.dims) return master;
  return same_name;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The persistent tensors a weights file holds: not a KV cache (the caller's), not one this
// process does not hold (another rank's shard).
bool saved_tensor(const Executor& executor, TensorId id) {
  const graph::TensorDesc& t = executor.graph().tensor(id);
  return graph::is_persistent(t.role) && !t.external && executor.storage(id) != nullptr;
}

}  // namespace

Status save_weights(const Executor& executor, const std::string& path, std::map<std::string, std::string> metadata) {
  return write_weights(snapshot_weights(executor, std::move(metadata)), path);
}

Status write_weights(const WeightsSnapshot& snapshot, const std::string& path) {
  auto header = weights_file_header(snapshot, path);
  if (!header) return header.error();
  const std::string_view pieces[] = {header.value(), snapshot.data};
  return write_file_atomically(path, pieces);
}

WeightsSnapshot snapshot_weights(const Executor& executor, std::map<std::string, std::string> metadata) {
  WeightsSnapshot out;
  snapshot_weights(executor, std::move(metadata), out);
  return out;
}

void snapshot_weights(const Executor& executor, std::map<std::string, std::string> metadata, WeightsSnapshot& out,
                      bool frozen) {
  const graph::Graph& g = executor.graph();
  out.tensors.clear();
  std::size_t total = 0;
  std::vector<TensorId> ids;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    if (!saved_tensor(executor, id)) continue;
    if (!frozen && g.tensor(id).frozen) continue;
    ids.push_back(id);
    const graph::TensorDesc& t = g.tensor(id);
    const auto bytes = static_cast<std::size_t>(t.size_bytes());
    out.tensors.push_back({t.name, t.dtype, t.shape.dims, total, bytes});
    total += bytes;
  }
  out.data.resize(total);
  for (std::size_t i = 0; i < ids.size(); ++i) executor.read_tensor(ids[i], out.data.data() + out.tensors[i].offset);
  metadata[kStepKey] = std::to_string(executor.steps_completed());
  if (executor.scales_loss()) {
    // The loss scaler's state, so a resumed fp16 run scales and counts as the uninterrupted one.
    char scale[32];
    std::snprintf(scale, sizeof scale, "%.17g", executor.loss_scale());
    metadata[kLossScaleKey] = scale;
    metadata[kGrowthTrackerKey] = std::to_string(executor.loss_scale_growth_tracker());
    metadata[kSkippedStepsKey] = std::to_string(executor.skipped_steps());
  }
  out.metadata = std::move(metadata);
}

Result<std::string> weights_file_header(const WeightsSnapshot& snapshot, const std::string& source,
                                        std::string* data_sha256) {
  std::vector<SafetensorsEntry> entries;
  for (const WeightsSnapshot::Tensor& t : snapshot.tensors) {
    entries.push_back({t.name, t.dtype, t.shape, std::string_view(snapshot.data).substr(t.offset, t.bytes)});
  }
  Sha256 sha;
  sha.update(snapshot.data.data(), snapshot.data.size());  // the tensors' bytes one after another, as a reader hashes them
  std::map<std::string, std::string> metadata = snapshot.metadata;
  metadata[kChecksumKey] = sha.finish_hex();
  if (data_sha256 != nullptr) *data_sha256 = metadata[kChecksumKey];
  auto header = encode_safetensors_header(entries, metadata);
  if (!header) return Error{source + ": " + header.error().message};
  return header;
}

namespace {

// Opens a weights file and reads its header (into `bytes`), checking the header length and the
// data it announces against the file's size: nothing else of the file is read.
Result<InputFile> open_weights(const std::string& path, std::string& bytes) {
  Result<InputFile> opened = InputFile::open(path, kMaxWeightsFileBytes, "weights file");
  if (!opened) return opened.error();
  InputFile& in = opened.value();
  if (in.size() < 8) {
    if (Status s = in.read_exact(static_cast<std::size_t>(in.size()), bytes); !s) return s.error();
    auto parsed = parse_safetensors(bytes, path);  // names the defect
    return parsed.error();
  }
  if (Status s = in.read_exact(8, bytes); !s) return s.error();
  std::uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= std::uint64_t(static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])) << (8 * i);
  const auto rest = static_cast<std::uint64_t>(in.size() - 8);
  if (header_len > kMaxSafetensorsHeaderBytes || header_len > rest) {
    return Error{path + ": not a valid safetensors file: header length " + std::to_string(header_len) + " is more than " +
                 (header_len > kMaxSafetensorsHeaderBytes ? "the format's limit of " + std::to_string(kMaxSafetensorsHeaderBytes) + " bytes"
                                                          : "the " + std::to_string(rest) + " bytes after it (truncated?)")};
  }
  if (Status s = in.read_exact(static_cast<std::size_t>(header_len), bytes); !s) return s.error();
  auto announced = safetensors_announced_data_bytes(std::string_view(bytes).substr(8), path);
  if (!announced) return announced.error();
  const std::uint64_t data_bytes = rest - header_len;
  if (announced.value() != data_bytes) {
    return Error{path + ": not a valid safetensors file: its header announces " + std::to_string(announced.value()) +
                 " data bytes, the file holds " + std::to_string(data_bytes) +
                 (announced.value() > data_bytes ? " (truncated?)" : " (bytes after the last tensor)")};
  }
  return opened;
}

}  // namespace

Status check_weights_file(const std::string& path) {
  std::string header;
  Result<InputFile> opened = open_weights(path, header);
  if (!opened) return opened.error();
  return Status::success();
}

Result<WeightsFile> read_weights_file(const std::string& path) {
  std::string bytes;
  Result<InputFile> opened = open_weights(path, bytes);
  if (!opened) return opened.error();
  InputFile& in = opened.value();
  const auto data_bytes = static_cast<std::size_t>(in.size()) - bytes.size();
  if (Status s = in.read_exact(data_bytes, bytes); !s) return s.error();
  char extra = 0;
  Result<std::size_t> more = in.read(&extra, 1);
  if (!more) return more.error();
  if (more.value() != 0) return Error{path + ": has grown while being read; save it again and retry"};
  return parse_weights_file(std::move(bytes), path);
}

Result<WeightsFile> parse_weights_file(std::string bytes, const std::string& path) {
  WeightsFile file;
  file.bytes = std::make_unique<std::string>(std::move(bytes));
  auto view = parse_safetensors(*file.bytes, path);
  if (!view) return view.error();
  file.view = std::move(view).value();
  if (auto it = file.view.metadata.find(kChecksumKey); it != file.view.metadata.end()) {
    Sha256 sha;
    for (const SafetensorsEntry& t : file.view.tensors) sha.update(t.data.data(), t.data.size());
    if (sha.finish_hex() != it->second) {
      return Error{path + ": checksum mismatch: the tensor data is not what was saved (corrupted file); "
                          "load an earlier checkpoint"};
    }
  }
  return file;
}

Result<LoadReport> load_weights(Executor& executor, const WeightsFile& file, const std::string& source,
                                bool frozen_from_seed) {
  const graph::Graph& g = executor.graph();
  std::vector<std::string> problems;
  LoadReport report;
  std::vector<std::pair<TensorId, const SafetensorsEntry*>> writes, conversions;
  for (TensorId id = 0; id < g.num_tensors(); ++id) {
    const graph::TensorDesc& t = g.tensor(id);
    if (!saved_tensor(executor, id)) continue;
    const SafetensorsEntry* entry = file.view.find(t.name);
    if (entry == nullptr || entry->dtype != t.dtype) {
      // Saved at another precision (mixed precision against fp32): converted without loss.
      if (const SafetensorsEntry* from = conversion_source(g, t, file.view); from != nullptr) {
        conversions.emplace_back(id, from);
        report.converted.push_back(t.name + " (" + std::string(safetensors_dtype_name(from->dtype)) + " '" + from->name +
                                   "' -> " + std::string(safetensors_dtype_name(t.dtype)) + ")");
        continue;
      }
    }
    if (entry == nullptr) {
      if (frozen_from_seed && t.frozen) continue;  // the base as this run made it
      if (is_optimizer_state(g, id)) {
        report.fresh_state.push_back(t.name);
      } else {
        problems.push_back(t.name + ": missing from the file (the model has shape " + shape_text(t.shape.dims) + ")");
      }
      continue;
    }
    if (entry->dtype != t.dtype) {
      problems.push_back(t.name + ": dtype " + std::string(safetensors_dtype_name(entry->dtype)) + " in the file, " +
                         std::string(safetensors_dtype_name(t.dtype)) + " in the model");
    } else if (entry->shape != t.shape.dims) {
      problems.push_back(t.name + ": shape " + shape_text(entry->shape) + " in the file, " + shape_text(t.shape.dims) +
                         " in the model");
    } else {
      writes.emplace_back(id, entry);
    }
  }
  for (const SafetensorsEntry& entry : file.view.tensors) {
    const TensorId id = g.find(entry.name);
    const bool known = id != kNoTensor && saved_tensor(executor, id);
    if (!known && !looks_like_optimizer_state(g, entry.name)) {
      problems.push_back(entry.name + ": in the file but not in this model");
    }
  }
  if (!problems.empty()) {
    std::ostringstream msg;
    msg << source << " does not match the model (" << problems.size() << " problem" << (problems.size() == 1 ? "" : "s")
        << "; were the model flags the same as when it was saved?):";
    for (const std::string& p : problems) msg << "\n  " << p;
    return Error{msg.str()};
  }
  std::int64_t step = 0;
  if (auto it = file.view.metadata.find(kStepKey); it != file.view.metadata.end()) {
    char* end = nullptr;
    step = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || step < 0) {
      return Error{source + ": metadata " + kStepKey + " is not a step count: '" + it->second + "'"};
    }
  }
  // fp16 loss scaling: the scaler's state, where the file has it (its absence starts it afresh).
  double loss_scale = 0.0;
  std::int64_t growth_tracker = 0, skipped = 0;
  const bool has_scaler = executor.scales_loss() && file.view.metadata.count(kLossScaleKey) > 0;
  if (has_scaler) {
    auto number = [&](const char* key) { return std::strtod(file.view.metadata.at(key).c_str(), nullptr); };
    loss_scale = number(kLossScaleKey);
    if (file.view.metadata.count(kGrowthTrackerKey) > 0) growth_tracker = static_cast<std::int64_t>(number(kGrowthTrackerKey));
    if (file.view.metadata.count(kSkippedStepsKey) > 0) skipped = static_cast<std::int64_t>(number(kSkippedStepsKey));
    if (!(loss_scale > 0.0) || !std::isfinite(loss_scale) || growth_tracker < 0 || skipped < 0 || skipped > step) {
      return Error{source + ": the loss scaler's state in the metadata is not valid (" + kLossScaleKey + " '" +
                   file.view.metadata.at(kLossScaleKey) + "')"};
    }
  }
  for (const auto& [id, entry] : writes) executor.write_tensor(id, entry->data.data());
  for (const auto& [id, entry] : conversions) executor.write_values(id, entry_values(*entry).data());
  report.loaded = static_cast<int>(writes.size() + conversions.size());
  if (report.fresh_state.empty()) {
    report.step = step;
    executor.set_steps_completed(step);
    if (has_scaler) {
      executor.set_loss_scale(loss_scale);
      executor.set_loss_scale_growth_tracker(growth_tracker);
      executor.set_skipped_steps(skipped);
    }
  }
  return report;
}

}  // namespace memplan::runtime
