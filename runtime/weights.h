// Saving and loading a model's persistent tensors (parameters, batch-norm running statistics,
// optimizer state) as safetensors files. Saves are crash-safe (common/atomic_file.h) and carry a
// SHA-256 of the data in the metadata, so a corrupted file is refused instead of loaded.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/safetensors.h"

namespace memplan::runtime {

// Metadata key holding the hex SHA-256 of the data section.
inline constexpr const char* kChecksumKey = "memplan.data_sha256";
// Metadata key holding the executor's completed step count.
inline constexpr const char* kStepKey = "memplan.step";
// fp16 loss scaling's state (runtime/trainer.h): the scale, clean steps since it last changed,
// and the steps skipped for an overflowed gradient.
inline constexpr const char* kLossScaleKey = "memplan.loss_scale";
inline constexpr const char* kGrowthTrackerKey = "memplan.loss_scale_growth_tracker";
inline constexpr const char* kSkippedStepsKey = "memplan.skipped_steps";

// Writes every persistent tensor of `executor`'s graph (in graph order) with `metadata`, the
// step count and the checksum. The previous file at `path`, if any, stays intact until the new one is complete.
// A tensor this process does not hold (another rank's, under ZeRO) is left out.
Status save_weights(const Executor& executor, const std::string& path, std::map<std::string, std::string> metadata);
// A copy of the state save_weights writes, taken between steps (a copy of the tensors' bytes,
// nothing encoded or hashed yet), so another thread can encode and write it while the next steps
// run. The file is weights_file_header() followed by `data`.
struct WeightsSnapshot {
  struct Tensor {
    std::string name;
    graph::DType dtype = graph::DType::f32;
    std::vector<std::int64_t> shape;
    std::size_t offset = 0, bytes = 0;  // in `data`
  };
  std::vector<Tensor> tensors;
  std::string data;
  std::map<std::string, std::string> metadata;  // the caller's, the step and the loss scaler's state
};
WeightsSnapshot snapshot_weights(const Executor& executor, std::map<std::string, std::string> metadata);
// The same into `into`, reusing its memory (a copy taken every N steps costs no allocation and
// no page faults after the first).
// `frozen` false leaves out the frozen parameters (fine-tuning's base, graph/lora.h): a run's
// checkpoint holds what trains, the base being the seed's (or --load's) again when it resumes.
void snapshot_weights(const Executor& executor, std::map<std::string, std::string> metadata, WeightsSnapshot& into,
                      bool frozen = true);
// Writes `snapshot` to `path` as save_weights does (all or nothing): for a caller that changes the
// snapshot first (a tensor-parallel run writes whole tensors gathered from its slices).
Status write_weights(const WeightsSnapshot& snapshot, const std::string& path);
// The file's length word and JSON header, with the data's SHA-256 in the metadata (kChecksumKey;
// also put in `data_sha256` when given).
Result<std::string> weights_file_header(const WeightsSnapshot& snapshot, const std::string& source,
                                        std::string* data_sha256 = nullptr);

struct WeightsFile {
  std::unique_ptr<std::string> bytes;  // the whole file; `view` points into it
  SafetensorsView view;
};

// Weights files larger than this are refused before reading (the whole file is held in memory).
inline constexpr Bytes kMaxWeightsFileBytes = Bytes{64} << 30;

// Reads and parses `path` (a regular file only; its header is checked against the file's size
// before the data is read), and verifies the checksum when the file has one (files written by
// other tools usually do not, and are accepted).
Result<WeightsFile> read_weights_file(const std::string& path);
// The same for file bytes already in memory; `source` names them in messages.
Result<WeightsFile> parse_weights_file(std::string bytes, const std::string& source);
// The checks read_weights_file makes before reading the data (a regular file, its size, the
// header and the data it announces), reading nothing more: to refuse a file before other work.
Status check_weights_file(const std::string& path);


struct LoadReport {
  int loaded = 0;
  // Optimizer state the file does not have (saved with another optimizer, or weights only):
  // left at its initial values.
  std::vector<std::string> fresh_state;
  // Tensors saved at another precision and converted exactly (a bf16 run's f32 master copy into
  // an fp32 parameter; an fp32 parameter into a 16-bit one and its master copy): "name (from)".
  std::vector<std::string> converted;
  // The saved step count, restored into the executor when all optimizer state was loaded
  // (fresh state restarts at step 0, as Adam's bias correction expects).
  std::int64_t step = 0;
};

// Copies the file's tensors into `executor` (after setup()). Every parameter and buffer of the
// graph must be in the file with the same shape and dtype, and the file may hold nothing the
// graph lacks except optimizer state; otherwise an Error lists every mismatch by tensor name and
// nothing is written.
// `frozen_from_seed`: a frozen parameter missing from the file keeps the value the executor holds
// (a checkpoint written without its base); otherwise a missing parameter is an error.
Result<LoadReport> load_weights(Executor& executor, const WeightsFile& file, const std::string& source,
                                bool frozen_from_seed = false);

}  // namespace memplan::runtime
