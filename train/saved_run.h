// --save and --load for a training run: one safetensors file holds every persistent tensor
// (parameters, batch-norm statistics, optimizer state), the completed step count, and metadata
// naming the model and optimizer; a GPT's also carries the configuration and vocabulary that
// GptSampler rebuilds it from. A loaded run continues its data from the saved step.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "memplan/common/result.h"
#include "memplan/models/registry.h"
#include "memplan/models/text_dataset.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"

namespace memplan::train {

// The metadata save_run writes: memplan.model, memplan.optimizer and, for a GPT, gpt_metadata()
// of its configuration and `text`'s vocabulary (`text` is required for a GPT, unused otherwise).
std::map<std::string, std::string> run_metadata(const models::ModelOptions& model, std::string_view optimizer,
                                                const models::TextDataset* text);

// Writes `executor`'s persistent tensors and step count to `path` with run_metadata(). The
// previous file at `path`, if any, stays intact until the new one is complete.
Status save_run(const runtime::Executor& executor, const std::string& path, const models::ModelOptions& model,
                std::string_view optimizer, const models::TextDataset* text);

// Reads `path` (checksum verified) into `executor`, after setup(). The report's step is the step
// to resume from: the saved count when all optimizer state was in the file, else 0 (fresh state
// restarts Adam's bias correction). Errors name `path` and every mismatching tensor.
Result<runtime::LoadReport> load_run(runtime::Executor& executor, const std::string& path);

}  // namespace memplan::train
