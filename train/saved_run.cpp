#include "memplan/train/saved_run.h"

#include "memplan/common/check.h"
#include "memplan/train/language_model.h"

namespace memplan::train {

std::map<std::string, std::string> run_metadata(const models::ModelOptions& model, std::string_view optimizer,
                                                const models::TextDataset* text) {
  std::map<std::string, std::string> metadata;
  if (model.name == "gpt") {
    MEMPLAN_CHECK(text != nullptr, "a GPT is saved with the vocabulary of its text");
    metadata = gpt_metadata(model.gpt, *text);
  } else if (model.config && text != nullptr) {
    metadata = config_decoder_metadata(model, *text);
  } else {
    metadata = {{"memplan.model", model.name}};
  }
  metadata["memplan.optimizer"] = std::string(optimizer);
  return metadata;
}

Status save_run(const runtime::Executor& executor, const std::string& path, const models::ModelOptions& model,
                std::string_view optimizer, const models::TextDataset* text) {
  return runtime::save_weights(executor, path, run_metadata(model, optimizer, text));
}

Result<runtime::LoadReport> load_run(runtime::Executor& executor, const std::string& path) {
  auto file = runtime::read_weights_file(path);
  if (!file) return file.error();
  return runtime::load_weights(executor, file.value(), path);
}

}  // namespace memplan::train
