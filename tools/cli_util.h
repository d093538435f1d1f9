// Shared CLI pieces: validators that turn bad flag values into usage errors (exit 2), and the
// progress line long-running commands print to stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/graph/graph.h"
#include "memplan/graph/optimizer.h"
#include "memplan/models/attention.h"
#include "memplan/models/registry.h"
#include "memplan/import/onnx_import.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/plan_step.h"
#include "memplan/planner/step_size.h"

namespace memplan::tools {

// Accepts a finite number > 0 (rejects 0, negatives, NaN, inf and non-numbers).
CLI::Validator positive_finite();
// Accepts a finite number in [lo, hi] (rejects NaN, which CLI::Range lets through).
CLI::Validator finite_in_range(double lo, double hi);
// Accepts an integer >= 1.
CLI::Validator positive_integer();
// Accepts a whole number in [0, max] written in decimal digits only (no sign, no exponent): a
// seed or a byte count. CLI11's own conversion lets "-1" wrap around and clamps overflow.
CLI::Validator whole_number(std::uint64_t max = UINT64_MAX);
// Accepts a byte size as parse_byte_size() reads it ("24GiB", "80GB", "4096"); "0" too when
// `allow_zero`.
CLI::Validator byte_size(bool allow_zero = false);
// Caching-allocator options in PYTORCH_CUDA_ALLOC_CONF syntax (compare, replay).
CLI::Validator alloc_conf();

// Turns a name from an enum's table (common/enum_names.h) into the text CLI11 converts to the
// enum (its underlying integer), and `unset_name` (when given) into the empty text that leaves a
// std::optional empty. Anything else fails with "NAME not in {a,b,c}", the names in table order
// (CLI::IsMember's wording); --help shows the same set.
template <class Table>
CLI::Validator enum_names_transform(const Table& table, std::string_view unset_name = {}) {
  using E = enum_of_table<Table>;
  std::vector<EnumName<E>> rows(std::begin(table), std::end(table));
  std::string set = "{";
  for (const EnumName<E>& row : rows) set += std::string(row.name) + ",";
  if (!unset_name.empty()) set += std::string(unset_name) + ",";
  set.back() = '}';
  return CLI::Validator(
      [rows, set, unset = std::string(unset_name)](std::string& value) -> std::string {
        if (!unset.empty() && value == unset) {
          value.clear();
          return {};
        }
        for (const EnumName<E>& row : rows) {
          if (row.name == value) {
            value = std::to_string(static_cast<long long>(row.value));
            return {};
          }
        }
        return value + " not in " + set;
      },
      set);
}

// An option bound to an enum through its name table: the names it takes, its --help and its
// errors all come from the table; the default shown is the value's name.
template <class Table>
CLI::Option* add_enum_option(CLI::App& app, const std::string& flags, enum_of_table<Table>& value, const Table& table,
                             const std::string& help) {
  return app.add_option(flags, value, help)->transform(enum_names_transform(table))->default_str(std::string(enum_name(table, value)));
}
// The same for an optional value: `unset_name` ("auto") leaves it empty (the command chooses).
template <class Table>
CLI::Option* add_enum_option(CLI::App& app, const std::string& flags, std::optional<enum_of_table<Table>>& value,
                             const Table& table, const std::string& help, std::string_view unset_name) {
  return app.add_option(flags, value, help)
      ->transform(enum_names_transform(table, unset_name))
      ->default_str(value ? std::string(enum_name(table, *value)) : std::string(unset_name));
}

// --checkpoint and --budget, shared by train, plan and fit.
struct CheckpointFlags {
  planner::CheckpointStrategy strategy = planner::CheckpointStrategy::kNone;
  std::string budget;  // empty: no arena budget
};
// Registers --checkpoint, and --budget unless the command has its own meaning for it.
void add_checkpoint_options(CLI::App& app, CheckpointFlags& flags, bool with_budget = true);
// Sets the request's checkpoint strategy and arena budget from the flags (an Error names the flag).
Status apply_checkpoint_flags(const CheckpointFlags& flags, planner::PlanRequest& request);

// The model flags plan, fit and compare share, as a step description for plan_step.
struct ModelFlags {
  std::string model = "mlp";
  std::int64_t batch = 0;  // 0: the model's default
  graph::OptimizerKind optimizer = graph::OptimizerKind::adamw;
  std::vector<std::int64_t> hidden = {256, 256};
  std::int64_t seq = 0;         // 0: the model's default
  std::int64_t target_seq = 0;  // --target-seq: an encoder-decoder config's decoder length; 0: --seq
  std::int64_t image_size = 0;  // 0: the model's default
  graph::DType dtype = graph::DType::f32;
  std::optional<models::AttentionKind> attention;  // unset (auto): fused; given: transformers only
  // --onnx FILE: the forward graph comes from an ONNX model instead of --model, trained with
  // --loss on the graph output --output (default: the first).
  std::string onnx;
  import::LossKind loss = import::LossKind::cross_entropy;
  std::string output;
  std::string config;  // --config: a Hugging Face config.json (then `model` is its path, as a label)
  std::int64_t vocab = 0;  // --vocab; 0: the model's (the GPT's: its default text's, as train builds it)
  bool verbose = false;    // --verbose: with --config, list the keys memplan does not read
  std::optional<double> moe_capacity_factor;  // --moe-capacity-factor: with a mixture-of-experts --config
  bool offload_optimizer = false;  // --offload-optimizer (graph::offload_optimizer)
  int tensor_parallel = 1;  // --tensor-parallel: ranks each decoder layer is split over (graph/tensor_parallel.h)
  bool sequence_parallel = false;  // --sequence-parallel: the layers' norms and dropouts split by rows too
  graph::FusedLoss fused_loss = graph::FusedLoss::auto_;  // --fused-loss (graph/fusions.h)
  std::string display_name() const { return onnx.empty() ? model : onnx; }
};
// Registers --model (every model in the registry, or the trainable ones), --batch, --optimizer,
// --hidden, --onnx, --loss, --output, and with `shapes` --seq, --target-seq, --image-size, --dtype and --config
// (which excludes --model).
void add_model_options(CLI::App& app, ModelFlags& flags, bool trainable_only, bool shapes);
// --schedule program|memory_aware|searched|auto, shared by plan, fit, compare and train; unset is
// auto (every order planned, the lowest arena kept).
void add_schedule_option(CLI::App& app, std::optional<planner::ScheduleKind>& schedule);
void apply_schedule_flag(std::optional<planner::ScheduleKind> schedule, planner::PlanRequest& request);
// --fused-loss auto|on|off, shared by plan, fit, compare and train.
void add_fused_loss_option(CLI::App& app, graph::FusedLoss& mode);
// The registry model --model and its flags describe (not --onnx or --config), with the sizes
// train takes from the data (models::set_data_sizes); an Error names the flag that cannot work.
Result<models::ModelOptions> model_options(const ModelFlags& flags);
// The step the flags describe; an Error names the flag that cannot work with the model, or that
// is too large for the step to be represented (planner/step_size.h) and the largest that works.
Result<planner::StepDescription> step_description(const ModelFlags& flags);
// planner::check_step_size with the sizes named as the flags that set them (--batch, --seq, ...).
Status check_step_size_flags(const planner::StepDescription& step);
// How sizes are named to a CLI user: as the flags that set them.
planner::SizeNaming flag_naming();

// "budget 1.00 MiB is below what checkpoint none can reach; the minimum feasible arena is ..."
std::string unmet_budget_message(const planner::PlannedStep& step, planner::CheckpointStrategy asked);
// "checkpoint optimal: arena 120.9 MiB -> 47.0 MiB, recompute +0.5% FLOPs"
std::string checkpoint_line(const planner::CheckpointOutcome& outcome);

// Writes a report file whole or not at all (a failed run never leaves half a report behind);
// on failure prints "memplan COMMAND: cannot write ..." and returns false.
bool write_report_file(std::string_view command, const std::string& path, std::string_view bytes);
nlohmann::json checkpoint_json(const planner::CheckpointOutcome& outcome);
// "fused loss: used (--fused-loss auto): the logits 'logits' [8192, 50257] are never stored, ..."; empty
// where the step has no cross-entropy to fuse (and nothing was asked of it).
std::string loss_fusion_line(const planner::LossFusionReport& report);
nlohmann::json loss_fusion_json(const planner::LossFusionReport& report);
// "swiglu: 16 silu-then-product pairs run as one op each: ..."; empty where none was fused.
std::string swiglu_line(const graph::SwigluFusion& swiglu);
nlohmann::json swiglu_json(const graph::SwigluFusion& swiglu);
std::string copies_line(const graph::CopyRecompute& copies);
nlohmann::json copies_json(const graph::CopyRecompute& copies);
// The op order a plan used and, where every order was planned (--schedule auto), each order's
// arena: "" where the plan has no arenas to compare (an order named by --schedule).
std::string order_line(const planner::MemoryPlan& plan);
nlohmann::json order_json(const planner::MemoryPlan& plan);
// Every rewrite line of a planned step (fused loss, swiglu, layout copies) and, given its plan, its
// op order, each ending in a newline.
std::string rewrite_lines(const planner::StepRewrites& step, const planner::MemoryPlan* plan = nullptr);
// "fused_loss", "swiglu", "copies_recomputed" and, given the plan, "op_order" into a command's JSON.
void add_rewrites_json(nlohmann::json& j, const planner::StepRewrites& step, const planner::MemoryPlan* plan = nullptr);

// printf to the command's standard output. Commands write through std::cout only (this included),
// so a caller running a command in-process (run_cli_captured, the Python package) keeps all of it.
void print_out(const char* format, ...) __attribute__((format(printf, 1, 2)));
// --verbose with --config: the config's keys memplan does not read (models::HfConfig::unread_keys),
// on stderr so that --json output stays one JSON document.
void note_unread_config_keys(const std::string& path, const models::HfConfig& config);
// --moe-capacity-factor F: the slots per expert a mixture-of-experts config plans (F times the
// balanced share; 0: every token, nothing dropped). An Error when the config has no experts.
void add_moe_capacity_option(CLI::App& app, std::optional<double>& factor);
Status apply_moe_capacity(models::HfConfig& config, const std::string& path, std::optional<double> factor);
// An encoder-decoder (T5) adds its relative position bias onto the attention scores, so its
// attention is materialized: --attention fused asked of `model` is an Error, anything else passes.
Status check_encoder_decoder_attention(bool encoder_decoder, std::optional<models::AttentionKind> asked,
                                       const std::string& model);

// A progress line on stderr: redrawn in place on a terminal, a line per 10% otherwise.
class Progress {
 public:
  Progress(std::string label, std::int64_t total, bool enabled);
  void update(std::int64_t done, const std::string& detail);
  void finish(const std::string& detail);

 private:
  std::string label_;
  std::int64_t total_;
  bool enabled_;
  bool tty_;
  std::int64_t last_decile_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace memplan::tools
