// `memplan replay FILE.pickle`: a real PyTorch memory snapshot replayed through memplan's caching
// allocator (how faithfully, and where it first differs), what expandable segments or other
// options would have reserved, and what a static plan of the same allocations needs. The work
// is trace/'s; this file parses flags and renders the answer.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "memplan/runtime/caching_allocator.h"
#include "memplan/trace/memory_snapshot.h"
#include "memplan/trace/snapshot_replay.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/compare_report.h"
#include "tools/layout_svg.h"
#include "tools/memory_report.h"

namespace memplan::tools {

namespace {

struct ReplayFlags {
  std::string input;
  int device = 0;
  std::string alloc_conf;
  std::int64_t exact_nodes = 20'000;
  int top = 10;
  bool json = false;
  std::string html;
  std::string svg;
};

nlohmann::json run_json(const trace::AllocatorRun& r) {
  nlohmann::json sizes = nlohmann::json::array();
  for (Bytes s : r.segment_sizes) sizes.push_back(s);
  return {{"config", r.config},
          {"segment_allocs", r.segment_sizes.size()},
          {"segment_sizes", sizes},
          {"segment_frees", r.segment_frees},
          {"reserved_peak_bytes", r.reserved_peak_bytes},
          {"reserved_peak_event", r.reserved_peak_event},
          {"allocated_at_reserved_peak_bytes", r.allocated_at_reserved_peak_bytes},
          {"fragmentation_bytes", r.reserved_peak_bytes - r.allocated_at_reserved_peak_bytes},
          {"reserved_at_end_bytes", r.reserved_at_end_bytes}};
}

nlohmann::json replay_json(const std::string& input, const trace::SnapshotReplay& r) {
  nlohmann::json j;
  j["input"] = input;
  j["device"] = r.device;
  j["events"] = r.events;
  j["allocs"] = r.allocs;
  j["frees"] = r.frees;
  j["streams"] = r.streams;
  nlohmann::json unrecovered = nlohmann::json::array();
  for (const auto& u : r.start.unrecovered) unrecovered.push_back(u);
  j["start_state"] = {{"segments", r.start.segments.size()},
                      {"reserved_bytes", r.start.reserved_bytes},
                      {"live_blocks", r.start.live_blocks},
                      {"live_bytes", r.start.live_bytes},
                      {"unrecovered", unrecovered}};
  j["recorded"] = run_json(r.recorded);
  j["simulated"] = run_json(r.simulated);
  j["expandable"] = run_json(r.expandable);
  j["alloc_conf"] = r.alloc_conf ? run_json(*r.alloc_conf) : nlohmann::json(nullptr);
  nlohmann::json divergence = nullptr;
  if (r.fidelity.first_divergence) {
    const auto& d = *r.fidelity.first_divergence;
    divergence = {{"event", d.event}, {"size", d.size}, {"site", d.site}, {"what", d.what}};
  }
  j["fidelity"] = {{"segment_sizes_match", r.fidelity.segment_sizes_match},
                   {"reserved_peak_matches", r.fidelity.reserved_peak_matches},
                   {"placements_compared", r.fidelity.placements_compared},
                   {"placements_matched", r.fidelity.placements_matched},
                   {"placement_match_ratio", r.fidelity.placement_match_ratio},
                   {"first_divergence", divergence}};
  j["live_peak_bytes"] = r.live_peak_bytes;
  j["planned_arena_bytes"] = r.planned_arena_bytes;
  j["plan_status"] = planner::to_string(r.plan_status);
  j["planned_over_live_peak"] = r.live_peak_bytes > 0 ? double(r.planned_arena_bytes) / double(r.live_peak_bytes) : 1.0;
  j["planned_saves_bytes"] = r.recorded.reserved_peak_bytes - r.planned_arena_bytes;
  nlohmann::json sites = nlohmann::json::array();
  for (const auto& s : r.top_sites) {
    sites.push_back({{"site", s.site}, {"live_bytes", s.live_bytes}, {"stranded_bytes", s.stranded_bytes}, {"blocks", s.blocks}});
  }
  j["top_sites"] = sites;
  nlohmann::json ooms = nlohmann::json::array();
  for (const auto& o : r.ooms) {
    ooms.push_back({{"event", o.event},
                    {"requested_bytes", o.requested_bytes},
                    {"device_free_bytes", o.device_free_bytes},
                    {"capacity_bytes", o.capacity_bytes},
                    {"largest_free_block_bytes", o.largest_free_block_bytes},
                    {"fits_cached", o.fits_cached},
                    {"fits_expandable", o.fits_expandable},
                    {"fits_static_plan", o.fits_static_plan}});
  }
  j["ooms"] = ooms;
  nlohmann::json notes = nlohmann::json::array();
  for (const auto& n : r.notes) notes.push_back(n);
  j["notes"] = notes;
  return j;
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * v);
  return buf;
}

void print_table(const std::string& input, const trace::SnapshotReplay& r) {
  print_out("%s: device %d, %lld events (%lld allocations, %lld frees), %lld stream%s\n", input.c_str(), r.device,
              static_cast<long long>(r.events), static_cast<long long>(r.allocs), static_cast<long long>(r.frees),
              static_cast<long long>(r.streams), r.streams == 1 ? "" : "s");
  print_out("start state: %zu segments (%s reserved) and %lld live blocks (%s) existed before the first event\n",
              r.start.segments.size(), format_bytes(r.start.reserved_bytes).c_str(), static_cast<long long>(r.start.live_blocks),
              format_bytes(r.start.live_bytes).c_str());
  for (const auto& u : r.start.unrecovered) print_out("  not in the file: %s\n", u.c_str());
  print_out("\n%-40s %24s %24s %24s %9s\n", "", "reserved peak", "allocated*", "fragmentation*", "segments");
  print_out("%-40s %24s\n", "lower bound (peak of live bytes)", format_bytes(r.live_peak_bytes).c_str());
  print_out("%-40s %24s %24s %24s %9s\n", "memplan static plan (one arena)", format_bytes(r.planned_arena_bytes).c_str(), "-",
              "0 B", "1");
  auto row = [](const std::string& name, const trace::AllocatorRun& run) {
    print_out("%-40s %24s %24s %24s %9zu\n", name.c_str(), format_bytes(run.reserved_peak_bytes).c_str(),
                format_bytes(run.allocated_at_reserved_peak_bytes).c_str(),
                format_bytes(run.reserved_peak_bytes - run.allocated_at_reserved_peak_bytes).c_str(), run.segment_sizes.size());
  };
  row("recorded (PyTorch)", r.recorded);
  row("simulated caching allocator", r.simulated);
  row("simulated, expandable segments", r.expandable);
  if (r.alloc_conf) row("simulated, " + r.alloc_conf->name.substr(2), *r.alloc_conf);
  print_out("\n* at the moment reserved memory peaked (the most allocated while it stood there); recorded:\n"
              "  requested bytes; fragmentation = reserved - allocated. segments: device allocations during the\n"
              "  trace (page maps for expandable segments); the static plan allocates its arena once.\n");

  const auto& f = r.fidelity;
  print_out("\nfidelity: %zu segment allocations recorded, %zu simulated: %s; reserved peak %s\n",
              r.recorded.segment_sizes.size(), r.simulated.segment_sizes.size(),
              f.segment_sizes_match ? "same sizes in the same order" : "they differ",
              f.reserved_peak_matches ? "equal" : "differs");
  print_out("  %lld of %lld allocations at the recorded segment and offset (%s)\n", static_cast<long long>(f.placements_matched),
              static_cast<long long>(f.placements_compared), percent(f.placement_match_ratio).c_str());
  if (f.first_divergence) {
    const auto& d = *f.first_divergence;
    print_out("  first divergence: event %lld, %s%s: %s\n", static_cast<long long>(d.event), format_bytes(d.size).c_str(),
                d.site.empty() ? "" : (" at " + d.site).c_str(), d.what.c_str());
  } else {
    print_out("  no divergence\n");
  }
  const double ratio = r.live_peak_bytes > 0 ? double(r.planned_arena_bytes) / double(r.live_peak_bytes) : 1.0;
  print_out("\nstatic plan: %s, %.4fx the lower bound (%s); %s less than the recorded reserved peak\n",
              format_bytes(r.planned_arena_bytes).c_str(), ratio, std::string(planner::to_string(r.plan_status)).c_str(),
              format_bytes(r.recorded.reserved_peak_bytes - r.planned_arena_bytes).c_str());
  if (!r.top_sites.empty()) {
    print_out("\nwhere the memory went at the simulated reserved peak (event %lld):\n",
                static_cast<long long>(r.simulated.peak_moment_event));
    print_out("  %24s %24s %7s  %s\n", "live", "stranded beside", "blocks", "site (innermost user frame)");
    for (const auto& s : r.top_sites) {
      print_out("  %24s %24s %7lld  %s\n", format_bytes(s.live_bytes).c_str(), format_bytes(s.stranded_bytes).c_str(),
                  static_cast<long long>(s.blocks), s.site.c_str());
    }
  }
  for (const auto& o : r.ooms) {
    print_out("\nout of memory at event %lld: %s requested, %s free on the device (capacity about %s); largest cached "
                "block %s\n  would have fit: cached block %s, expandable segments %s, static plan %s\n",
                static_cast<long long>(o.event), format_bytes(o.requested_bytes).c_str(), format_bytes(o.device_free_bytes).c_str(),
                format_bytes(o.capacity_bytes).c_str(), format_bytes(o.largest_free_block_bytes).c_str(),
                o.fits_cached ? "yes" : "no", o.fits_expandable ? "yes" : "no", o.fits_static_plan ? "yes" : "no");
  }
  for (const auto& n : r.notes) print_out("note: %s\n", n.c_str());
}

// Panels over event time: the static plan's offsets and the recorded addresses (segments stacked
// in address order). Every allocation is drawn: those under a pixel tall are pooled into cells
// (layout_svg.h), as compare's are.
std::vector<LayoutPanel> replay_panels(const trace::SnapshotReplay& r) {
  const double t_max = double(std::max<std::int64_t>(1, r.events));
  Bytes recorded_height = 0;
  std::map<std::uint64_t, Bytes> stacked;
  for (const auto& seg : r.recorded_segments) {
    stacked[seg.address] = recorded_height;
    recorded_height += seg.size;
  }
  LayoutPanel plan, recorded;
  plan.t_max = recorded.t_max = t_max;
  for (const auto& seg : r.recorded_segments) {
    const Bytes y = stacked[seg.address];
    recorded.rects.push_back({0, t_max, y, y + seg.size, "segment " + format_bytes(seg.size), 4});
  }
  for (std::size_t i = 0; i < r.problem.buffers.size(); ++i) {
    const auto& b = r.problem.buffers[i];
    const std::string label = b.id + " (" + format_bytes(b.size_bytes) + ")";
    const int color = b.first_op == 0 ? 0 : 1;
    if (i < r.plan_offsets.size()) {
      plan.rects.push_back({double(b.first_op), double(b.end_op), r.plan_offsets[i], r.plan_offsets[i] + b.size_bytes, label, color});
    }
    const std::uint64_t address = r.recorded_addresses[i];
    auto seg = stacked.upper_bound(address);
    if (seg == stacked.begin()) continue;
    --seg;
    const Bytes y = seg->second + static_cast<Bytes>(address - seg->first);
    recorded.rects.push_back({double(b.first_op), double(b.end_op), y, y + b.size_bytes, label, color});
  }
  plan.title = "memplan static plan of the same allocations";
  recorded.title = "recorded by PyTorch (segments stacked)";
  plan.lines.push_back({r.planned_arena_bytes, "arena " + format_bytes(r.planned_arena_bytes)});
  plan.lines.push_back({r.live_peak_bytes, "lower bound " + format_bytes(r.live_peak_bytes)});
  recorded.lines.push_back({r.recorded.reserved_peak_bytes, "reserved peak " + format_bytes(r.recorded.reserved_peak_bytes)});
  return {plan, recorded};
}

std::string replay_html(const std::string& input, const nlohmann::json& j, const trace::SnapshotReplay& r,
                        const std::string& layout_svg, const std::string& timeline_svg) {
  std::string html = report_page_head("memplan replay: " + input) + "<h1>memplan replay: " + xml_escape(input) + "</h1>\n";
  html += "<p>" + std::to_string(r.events) + " events (" + std::to_string(r.allocs) + " allocations) recorded by PyTorch on device " +
          std::to_string(r.device) + ", replayed through memplan's caching allocator with the recorded settings, with "
          "expandable segments, and planned ahead as one arena.</p>\n";
  html += "<div class=\"wide\"><table id=\"summary\"><tr><th></th><th>reserved peak</th><th>allocated at that moment</th><th>fragmentation</th>"
          "<th>segment allocations</th></tr>\n";
  html += "<tr><td>lower bound (peak of live bytes)</td><td>" + format_bytes(r.live_peak_bytes) + "</td><td></td><td></td><td></td></tr>\n";
  html += "<tr><td>memplan static plan</td><td>" + format_bytes(r.planned_arena_bytes) + "</td><td>-</td><td>0 B</td><td>1</td></tr>\n";
  auto row = [&](const std::string& name, const trace::AllocatorRun& run) {
    html += "<tr><td>" + xml_escape(name) + "</td><td>" + format_bytes(run.reserved_peak_bytes) + "</td><td>" +
            format_bytes(run.allocated_at_reserved_peak_bytes) + "</td><td>" +
            format_bytes(run.reserved_peak_bytes - run.allocated_at_reserved_peak_bytes) + "</td><td>" +
            std::to_string(run.segment_sizes.size()) + "</td></tr>\n";
  };
  row("recorded (PyTorch)", r.recorded);
  row("simulated caching allocator", r.simulated);
  row("simulated, expandable segments", r.expandable);
  if (r.alloc_conf) row("simulated, " + r.alloc_conf->name.substr(2), *r.alloc_conf);
  html += "</table></div>\n<h2>Fidelity</h2>\n<p id=\"fidelity\">Segment allocations: " +
          std::string(r.fidelity.segment_sizes_match ? "the same sizes in the same order" : "they differ") + "; " +
          std::to_string(r.fidelity.placements_matched) + " of " + std::to_string(r.fidelity.placements_compared) +
          " allocations at the recorded segment and offset (" + percent(r.fidelity.placement_match_ratio) + ").";
  if (r.fidelity.first_divergence) {
    const auto& d = *r.fidelity.first_divergence;
    html += " First divergence at event " + std::to_string(d.event) + " (" + format_bytes(d.size) +
            (d.site.empty() ? "" : ", " + xml_escape(d.site)) + "): " + xml_escape(d.what) + ".";
  }
  html += "</p>\n";
  if (!r.top_sites.empty()) {
    html += "<h2>Where the memory went at the simulated reserved peak</h2>\n<div class=\"wide\"><table id=\"sites\"><tr><th>site</th><th>live</th>"
            "<th>stranded beside</th><th>blocks</th></tr>\n";
    for (const auto& s : r.top_sites) {
      html += "<tr><td>" + xml_escape(s.site) + "</td><td>" + format_bytes(s.live_bytes) + "</td><td>" +
              format_bytes(s.stranded_bytes) + "</td><td>" + std::to_string(s.blocks) + "</td></tr>\n";
    }
    html += "</table></div>\n";
  }
  html += "<h2>Layouts</h2>\n<p>Address (up) against event index (right): every allocation is a rectangle over its "
          "lifetime. Left: the static plan; right: where PyTorch put it, segments stacked in address order (grey: "
          "reserved, unused).</p>\n" + layout_svg;
  html += "<h2>Allocated vs reserved over time</h2>\n<p>After every event; recorded allocated bytes are requested "
          "bytes.</p>\n" + timeline_svg;
  html += "<h2>JSON</h2>\n<pre>" + xml_escape(j.dump(1).substr(0, 20000)) + "</pre>\n</body></html>\n";
  return html;
}

TimelineSeries series_of(const std::string& name, const trace::AllocatorRun& run) {
  TimelineSeries s;
  s.name = name;
  for (const auto& p : run.timeline) s.samples.push_back({p.allocated_bytes, p.reserved_bytes});
  return s;
}

int run_replay(const ReplayFlags& flags) {
  trace::SnapshotReplayRequest request;
  request.device = flags.device;
  request.solver_nodes = flags.exact_nodes;
  request.top_sites = flags.top;
  request.record_timeline = !flags.html.empty();
  if (!flags.alloc_conf.empty()) {
    auto conf = runtime::CachingAllocatorOptions::parse(flags.alloc_conf);
    if (!conf) {
      std::cerr << "memplan replay: --alloc-conf: " << conf.error().message << "\n";
      return kExitUsage;
    }
    request.alloc_conf = conf.value();
    request.alloc_conf_text = flags.alloc_conf;
  }
  auto snapshot = trace::read_memory_snapshot(flags.input);
  if (!snapshot) {
    std::cerr << "memplan replay: " << snapshot.error().message << "\n";
    return kExitUsage;
  }
  auto replay = trace::replay_snapshot(snapshot.value(), request);
  if (!replay) {
    std::cerr << "memplan replay: " << flags.input << ": " << replay.error().message << "\n";
    return kExitUsage;
  }
  const trace::SnapshotReplay& r = replay.value();
  const nlohmann::json j = replay_json(flags.input, r);
  if (!flags.svg.empty() || !flags.html.empty()) {
    const std::string layout = render_layout_svg(flags.input + ": static plan and recorded layout", replay_panels(r));
    if (!flags.svg.empty() && !write_report_file("replay", flags.svg, layout)) return kExitFailure;
    if (!flags.html.empty()) {
      std::vector<TimelineSeries> series = {series_of("recorded", r.recorded), series_of("simulated", r.simulated),
                                            series_of("expandable segments", r.expandable)};
      const std::string html = replay_html(flags.input, j, r, layout, render_timeline_svg(series, r.planned_arena_bytes));
      if (!write_report_file("replay", flags.html, html)) return kExitFailure;
    }
  }
  if (flags.json) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  print_table(flags.input, r);
  if (!flags.svg.empty()) print_out("\nwrote %s\n", flags.svg.c_str());
  if (!flags.html.empty()) print_out("wrote %s\n", flags.html.c_str());
  return kExitOk;
}

}  // namespace

Command add_replay_command(CLI::App& root) {
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* app = root.add_subcommand(
      "replay",
      "Replay a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) through memplan's caching\n"
      "allocator: how faithfully it reproduces the recorded segments and placements, where reserved\n"
      "memory went, what expandable segments (or --alloc-conf) would have reserved, and how little a\n"
      "static plan of the same allocations needs. Record one in PyTorch with\n"
      "  torch.cuda.memory._record_memory_history(); ...; torch.cuda.memory._dump_snapshot(\"run.pickle\")");
  app->add_option("file", flags->input, "the snapshot (.pickle); memplan compare --snapshot output works too")->required();
  app->add_option("--device", flags->device, "which device's trace to replay (default 0)")->check(CLI::Range(0, 1023));
  app->add_option("--alloc-conf", flags->alloc_conf,
                  "also replay with these allocator options (PYTORCH_CUDA_ALLOC_CONF syntax), e.g. max_split_size_mb:128")
      ->check(alloc_conf());
  app->add_option("--exact-nodes", flags->exact_nodes,
                  "search nodes the static plan's solver may spend (deterministic; default 20000: every shared snapshot at its lower bound in seconds)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app->add_option("--top", flags->top, "allocation sites to list (default 10)")->check(CLI::Range(0, 1000));
  app->add_flag("--json", flags->json, "print the replay as JSON");
  app->add_option("--html", flags->html, "write a self-contained HTML report (table, layouts, reserved over time)");
  app->add_option("--svg", flags->svg, "write the static plan and recorded layouts (SVG)");
  return Command{app, [flags] { return run_replay(*flags); }};
}

}  // namespace memplan::tools
