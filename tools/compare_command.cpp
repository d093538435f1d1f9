// memplan compare: the static plan against a PyTorch-style caching allocator (with and without
// expandable segments) on the same step, same schedule and same tensor lifetimes, over a
// simulated device: reserved peak, fragmentation, device allocations per step, out-of-memory
// at a capacity, and a picture of both layouts.
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "memplan/common/atomic_file.h"
#include "memplan/common/byte_size.h"
#include "memplan/kernels/kernel.h"
#include "memplan/planner/device_profile.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/plan_step.h"
#include "memplan/runtime/allocation_trace.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/dynamic_replay.h"
#include "memplan/runtime/simulated_device.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/compare_report.h"
#include "tools/layout_svg.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

bool write_output(const std::string& path, std::string_view bytes) { return write_report_file("compare", path, bytes); }

struct CompareFlags {
  ModelFlags model;
  kernels::DeviceKind device = kernels::DeviceKind::cpu;
  std::optional<planner::ScheduleKind> schedule;  // --schedule; empty: auto
  int steps = 3;
  std::string device_memory;  // empty: no limit (a simulated device of 1 PiB)
  std::string alloc_conf;
  bool json = false;
  std::string svg;
  std::string html;
  std::string snapshot;
  std::string trace_json;
};

struct Variant {
  std::string name;
  runtime::ReplayResult result;
  runtime::AllocationTrace trace;
};

// The dynamic layout of the last replayed step: segments stacked in address order, each block
// drawn over its tensor's lifetime; cached but unused segment space shown grey.
LayoutPanel dynamic_panel(const std::string& title, const planner::MemoryPlan& plan, const runtime::ReplayResult& r) {
  LayoutPanel panel;
  panel.title = title;
  panel.t_max = double(plan.schedule.size());
  std::map<runtime::DeviceAddress, std::pair<Bytes, Bytes>> segments;  // address -> (stacked base, size)
  Bytes stacked = 0;
  std::vector<runtime::SegmentSnapshot> sorted = r.snapshot_at_end.segments;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  for (const auto& s : sorted) {
    segments[s.address] = {stacked, s.total_size};
    panel.rects.push_back({0, panel.t_max, stacked, stacked + s.total_size,
                           "segment " + format_bytes(s.total_size) + (s.large_pool ? " (large pool)" : " (small pool)"), 4});
    stacked += s.total_size;
  }
  auto locate = [&](runtime::DeviceAddress a) -> Bytes {
    auto it = segments.upper_bound(a);
    if (it == segments.begin()) return -1;
    --it;
    if (a >= it->first + static_cast<runtime::DeviceAddress>(it->second.second)) return -1;
    return it->second.first + static_cast<Bytes>(a - it->first);
  };
  for (const runtime::ReplayPlacement& p : r.last_step) {
    const planner::PlannedBuffer& b = plan.buffers[static_cast<std::size_t>(p.buffer)];
    const Bytes y = locate(p.address);
    if (y < 0) continue;
    const double t0 = b.persistent ? 0 : b.first_op, t1 = b.persistent ? panel.t_max : b.last_op + 1;
    panel.rects.push_back({t0, t1, y, y + b.size_bytes, b.name + " (" + format_bytes(b.size_bytes) + ")", layout_color(b.role)});
  }
  panel.lines.push_back({r.peak_reserved_bytes, "reserved peak " + format_bytes(r.peak_reserved_bytes)});
  return panel;
}

// The planned step and the two caching allocators replayed on it.
struct Comparison {
  planner::PlannedStep planned;
  std::int64_t batch = 0;
  Bytes capacity = 0;
  bool plan_fits = true;
  std::vector<Variant> variants;
  // Where the plan fused ops (graph/fusions.h): the caching allocator on the step as PyTorch
  // eager runs it (logits and SiLU outputs stored).
  std::optional<runtime::ReplayResult> unfused;
};

std::string op_name(const Comparison& c, OpIndex pos) {
  if (pos < 0) return "(step start: inputs)";
  const planner::MemoryPlan& plan = c.planned.plan;
  return c.planned.graph.ops()[static_cast<std::size_t>(plan.schedule[static_cast<std::size_t>(pos)])].name;
}

Result<Comparison> compare(const CompareFlags& flags) {
  Comparison c;
  Result<Bytes> capacity = Bytes{1} << 50;
  if (!flags.device_memory.empty()) capacity = parse_byte_size(flags.device_memory);
  if (!capacity) return Error{"--device-memory: " + capacity.error().message};
  c.capacity = capacity.value();
  auto base_options = runtime::CachingAllocatorOptions::parse(flags.alloc_conf);
  if (!base_options) return Error{"--alloc-conf: " + base_options.error().message};
  const runtime::CachingAllocatorOptions allocator = base_options.value();
  auto description = step_description(flags.model);
  if (!description) return description.error();
  c.batch = description.value().batch;
  planner::PlanRequest request;
  request.device = planner::documented_device_profile(kernels::device_kind_name(flags.device)).value();
  apply_schedule_flag(flags.schedule, request);
  auto planned = planner::plan_step(description.value(), request);
  if (!planned) return planned.error();
  c.planned = std::move(planned).value();
  const planner::MemoryPlan& plan = c.planned.plan;
  // The caching allocator over flags.steps steps of `replayed` on a fresh simulated device.
  auto replay = [&](const planner::MemoryPlan& replayed, bool expandable, runtime::AllocationTrace* trace) {
    runtime::SimulatedDevice device(c.capacity);
    runtime::ReplayOptions options;
    options.steps = flags.steps;
    options.allocator = allocator;
    options.allocator.expandable_segments = expandable;
    options.trace = trace;
    options.record_timeline = trace != nullptr && !flags.html.empty();
    return runtime::replay_dynamic(replayed, device, options);
  };
  c.variants.resize(2);
  c.variants[0].name = "caching allocator";
  c.variants[1].name = "caching allocator, expandable segments";
  for (std::size_t v = 0; v < c.variants.size(); ++v) c.variants[v].result = replay(plan, v == 1, &c.variants[v].trace);

  const planner::StepRewrites& rewrites = c.planned.rewrites;
  if (rewrites.loss_fusion.used || rewrites.swiglu.pairs > 0 || rewrites.copies.copies > 0) {
    planner::StepDescription unfused = description.value();
    unfused.fused_loss = graph::FusedLoss::off;
    unfused.rewrite_step = false;
    // No order search either: the step's own order with each update as soon as its gradient is final.
    planner::PlanRequest as_written = request;
    as_written.choose_best_schedule = false;
    as_written.schedule = planner::ScheduleKind::memory_aware;
    auto stored = planner::plan_step(unfused, as_written);
    if (!stored) return stored.error();
    c.unfused = replay(stored.value().plan, false, nullptr);
  }
  c.plan_fits = request.device.fits(plan.arena_bytes, c.capacity);
  return c;
}

nlohmann::json compare_json(const CompareFlags& flags, const Comparison& c) {
  const planner::MemoryPlan& plan = c.planned.plan;
  nlohmann::json j;
  j["model"] = flags.model.label();
  j["batch"] = c.batch;
  j["optimizer"] = graph::optimizer_name(flags.model.optimizer);
  j["dtype"] = graph::dtype_name(flags.model.dtype);
  j["device"] = kernels::device_kind_name(flags.device);
  j["device_memory_bytes"] = flags.device_memory.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.capacity);
  j["budget_bytes"] = j["device_memory_bytes"];  // the name before --device-memory, kept for a release
  j["steps"] = flags.steps;
  j["lower_bound_bytes"] = plan.lower_bound_bytes;
  j["planned_arena_bytes"] = plan.arena_bytes;
  j["planned"] = {{"arena_bytes", plan.arena_bytes}, {"fits", c.plan_fits}, {"device_allocs_setup", 1},
                  {"device_allocs_per_step", 0}};
  for (std::size_t v = 0; v < c.variants.size(); ++v) {
    const auto& r = c.variants[v].result;
    nlohmann::json d{{"reserved_peak_bytes", r.peak_reserved_bytes},
                     {"allocated_peak_bytes", r.peak_allocated_bytes},
                     {"requested_peak_bytes", r.peak_requested_bytes},
                     {"allocated_at_reserved_peak_bytes", r.allocated_at_reserved_peak_bytes},
                     {"fragmentation_bytes", r.peak_reserved_bytes - r.allocated_at_reserved_peak_bytes},
                     {"inactive_split_bytes", r.inactive_split_at_reserved_peak_bytes},
                     {"out_of_memory", r.out_of_memory},
                     {"num_alloc_retries", r.stats.num_alloc_retries},
                     {"num_ooms", r.stats.num_ooms}};
    d["device_allocs_per_step"] = r.steps.empty() ? 0 : r.steps.back().device_allocations;
    if (r.peak_reserved_bytes > 0) d["reserved_over_planned"] = double(r.peak_reserved_bytes) / double(plan.arena_bytes);
    if (v == 1) d["maps"] = r.stats.num_device_alloc;
    nlohmann::json per_step = nlohmann::json::array();
    for (const auto& st : r.steps) {
      per_step.push_back({{"step", st.step}, {"reserved_peak_bytes", st.peak_reserved_bytes},
                          {"allocated_peak_bytes", st.peak_allocated_bytes},
                          {"device_allocations", st.device_allocations}, {"device_frees", st.device_frees}});
    }
    d["per_step"] = per_step;
    if (r.out_of_memory) {
      d["oom_message"] = r.oom_message;
      d["oom_step"] = r.oom_step;
      d["oom_op"] = op_name(c, r.oom_op);
      d["oom_tensor"] = r.oom_tensor;
    }
    j[v == 0 ? "caching" : "expandable"] = d;
  }
  add_rewrites_json(j, c.planned.rewrites, &c.planned.plan);
  if (c.unfused) {
    j["caching_pytorch_step"] = {{"reserved_peak_bytes", c.unfused->peak_reserved_bytes},
                                 {"allocated_peak_bytes", c.unfused->peak_allocated_bytes},
                                 {"out_of_memory", c.unfused->out_of_memory}};
    if (c.unfused->peak_reserved_bytes > 0) {
      j["caching_pytorch_step"]["planned_over_reserved"] = double(plan.arena_bytes) / double(c.unfused->peak_reserved_bytes);
    }
  }

  return j;
}

// --svg, --html, --trace-json and --snapshot; false when one could not be written (said on stderr).
bool write_compare_files(const CompareFlags& flags, const Comparison& c, const nlohmann::json& j) {
  const planner::MemoryPlan& plan = c.planned.plan;
  if (!flags.svg.empty()) {
    std::vector<LayoutPanel> panels = {planned_layout_panel(plan)};
    for (const Variant& v : c.variants) {
      if (!v.result.out_of_memory) panels.push_back(dynamic_panel(v.name, plan, v.result));
    }
    if (!write_output(flags.svg, render_layout_svg(flags.model.label() + ", batch " + std::to_string(c.batch) +
                                                        ": the same step, three allocators (last step shown)",
                                                    panels))) {
      return false;
    }
  }
  if (!flags.html.empty()) {
    std::vector<LayoutPanel> panels = {planned_layout_panel(plan)};
    for (const Variant& v : c.variants) {
      if (!v.result.out_of_memory) panels.push_back(dynamic_panel(v.name, plan, v.result));
    }
    std::vector<TimelineSeries> series;
    for (const Variant& v : c.variants) series.push_back(timeline_series(v.name, v.result));
    if (!write_output(flags.html, render_compare_html(j, render_layout_svg("layouts of the last replayed step", panels),
                                                      render_timeline_svg(series, plan.arena_bytes)))) {
      return false;
    }
  }
  if (!flags.trace_json.empty()) {
    if (!write_output(flags.trace_json, runtime::trace_to_json(c.variants[0].trace, 1) + "\n")) return false;
  }
  if (!flags.snapshot.empty()) {
    // PyTorch's viewer (pytorch.org/memory_viz) reads pickled snapshots.
    const std::string bytes = runtime::memory_snapshot_pickle(c.variants[0].result.snapshot_at_end, &c.variants[0].trace);
    if (!write_output(flags.snapshot, bytes)) return false;
  }

  return true;
}

// One allocator's row of the table: reserved peak, allocated there, fragmentation, inactive
// split, device allocations in the last step.
void print_replay_row(const std::string& name, const runtime::ReplayResult& r) {
  print_out("%-40s %14s %14s %14s %14s %10lld\n", name.c_str(), format_bytes(r.peak_reserved_bytes).c_str(),
            format_bytes(r.allocated_at_reserved_peak_bytes).c_str(),
            format_bytes(r.peak_reserved_bytes - r.allocated_at_reserved_peak_bytes).c_str(),
            format_bytes(r.inactive_split_at_reserved_peak_bytes).c_str(),
            static_cast<long long>(r.steps.empty() ? 0 : r.steps.back().device_allocations));
}

void print_compare(const CompareFlags& flags, const Comparison& c) {
  const planner::MemoryPlan& plan = c.planned.plan;
  print_out("%s, batch %lld, %s, %s: the same %zu-op step and tensor lifetimes, %d steps, %s\n\n",
              flags.model.label().c_str(), static_cast<long long>(c.batch),
              std::string(graph::dtype_name(flags.model.dtype)).c_str(), std::string(graph::optimizer_name(flags.model.optimizer)).c_str(),
              plan.schedule.size(), flags.steps,
              flags.device_memory.empty() ? "no device memory limit" : ("device memory " + format_bytes(c.capacity)).c_str());
  print_out("%-40s %14s %14s %14s %14s %10s\n", "", "reserved peak", "allocated*", "fragmentation", "inactive split",
              "allocs/step");
  print_out("%-40s %14s\n", "lower bound (peak of live bytes)", format_bytes(plan.lower_bound_bytes).c_str());
  print_out("%-40s %14s %14s %14s %14s %10s\n", "memplan planned arena", format_bytes(plan.arena_bytes).c_str(),
              "-", "0 B", "0 B", "0");
  for (const Variant& v : c.variants) {
    const auto& r = v.result;
    if (r.out_of_memory) {
      print_out("%-40s OUT OF MEMORY in step %lld at op %s, allocating '%s'\n", v.name.c_str(),
                  static_cast<long long>(r.oom_step), op_name(c, r.oom_op).c_str(), r.oom_tensor.c_str());
      print_out("    %s\n", r.oom_message.c_str());
      continue;
    }
    print_replay_row(v.name, r);
  }
  if (c.unfused) {
    if (c.unfused->out_of_memory) {
      print_out("%-40s OUT OF MEMORY\n", "caching allocator, PyTorch's step");
    } else {
      print_replay_row("caching allocator, PyTorch's step", *c.unfused);
    }
  }
  const std::string lines = rewrite_lines(c.planned.rewrites, &c.planned.plan);
  if (!lines.empty()) print_out("\n%s", lines.c_str());
  if (c.unfused) {
    print_out("PyTorch's step: the caching allocator on the step as PyTorch eager runs it, before these rewrites (what they "
              "leave out stored)\n");
  }
  print_out("\n* allocated at the moment reserved memory peaked; fragmentation = reserved - allocated there;\n"
              "  inactive split = free blocks inside split segments then; allocs/step = device allocations in the\n"
              "  last (steady-state) step. planned: one allocation at setup, none per step.\n");
  if (!c.plan_fits) {
    print_out("\nplanned arena: OUT OF MEMORY at setup: it needs %s, the budget is %s\n",
                format_bytes(plan.arena_bytes).c_str(), format_bytes(c.capacity).c_str());
  }
  if (!flags.svg.empty()) print_out("\nwrote %s\n", flags.svg.c_str());
  if (!flags.html.empty()) print_out("wrote %s\n", flags.html.c_str());
  if (!flags.trace_json.empty()) print_out("wrote %s\n", flags.trace_json.c_str());
  if (!flags.snapshot.empty()) print_out("wrote %s (open it at pytorch.org/memory_viz)\n", flags.snapshot.c_str());
}

int run_compare(const CompareFlags& flags) {
  auto compared = compare(flags);
  if (!compared) {
    std::cerr << "memplan compare: " << compared.error().message << "\n";
    return kExitUsage;
  }
  const Comparison& c = compared.value();
  const nlohmann::json j = compare_json(flags, c);
  if (!write_compare_files(flags, c, j)) return kExitFailure;
  if (flags.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    print_compare(flags, c);
  }
  return kExitOk;
}

}  // namespace

Command add_compare_command(CLI::App& root) {
  auto flags = std::make_shared<CompareFlags>();
  CLI::App* app = root.add_subcommand(
      "compare",
      "Compare the static plan with a PyTorch-style caching allocator (and expandable segments) on the same step.");
  add_model_options(*app, flags->model, /*trainable_only=*/false, /*shapes=*/true);
  add_enum_option(*app, "--device", flags->device, kernels::kDeviceKindNames,
                  "Plan for this device kind's documented profile: cpu, or cuda (the cuBLAS workspace inside the arena; "
                  "16-bit GEMMs, embedding and loss native, other 16-bit ops in fp32 copies in the workspace). The "
                  "caching allocators replay the step's tensors alone, as PyTorch allocates them");
  add_schedule_option(*app, flags->schedule);
  app->add_option("--steps", flags->steps, "Training steps to replay")->check(CLI::Range(1, 1000))->capture_default_str();
  app->add_option("--device-memory,--budget", flags->device_memory,
                  "Device memory, e.g. 80GiB, 24GB, 16000MiB: shows which allocator runs out of memory, and where "
                  "(--budget: the older name, kept for a release)")
      ->check(byte_size());
  app->add_option("--alloc-conf", flags->alloc_conf,
                  "Caching allocator options in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. max_split_size_mb:128")
      ->check(alloc_conf());
  app->add_flag("--json", flags->json, "Print the comparison as JSON");
  app->add_option("--svg", flags->svg, "Write a picture of the three layouts (SVG)");
  app->add_option("--html", flags->html,
                  "Write a self-contained HTML report: the table, the layouts and allocated vs reserved over time");
  app->add_option("--trace-json", flags->trace_json, "Write the caching allocator's events as plain JSON");
  app->add_option("--snapshot", flags->snapshot,
                  "Write the caching allocator's run as a PyTorch memory snapshot (pickle) for pytorch.org/memory_viz");
  return Command{app, [flags] { return run_compare(*flags); }};
}

}  // namespace memplan::tools
