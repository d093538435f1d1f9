#include "tools/compare_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "tools/layout_svg.h"
#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

const char* kSeriesColors[] = {"#d95f02", "#1b9e77", "#e7298a", "#66a61e"};

constexpr std::size_t kMaxPoints = 2000;

// At most kMaxPoints samples, each the maximum of the run of samples it stands for.
std::vector<TimelineSample> decimate(const std::vector<TimelineSample>& samples) {
  if (samples.size() <= kMaxPoints) return samples;
  std::vector<TimelineSample> out(kMaxPoints);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    TimelineSample& o = out[i * kMaxPoints / samples.size()];
    o.allocated_bytes = std::max(o.allocated_bytes, samples[i].allocated_bytes);
    o.reserved_bytes = std::max(o.reserved_bytes, samples[i].reserved_bytes);
  }
  return out;
}

}  // namespace

TimelineSeries timeline_series(const std::string& name, const runtime::ReplayResult& result) {
  TimelineSeries s;
  s.name = name;
  for (const auto& p : result.timeline) s.samples.push_back({p.allocated_bytes, p.reserved_bytes});
  return s;
}

std::string render_timeline_svg(const std::vector<TimelineSeries>& full_series, Bytes planned_arena_bytes) {
  constexpr double kW = 900, kH = 300, kL = 80, kT = 20, kB = 56;
  std::vector<TimelineSeries> series = full_series;
  for (auto& s : series) s.samples = decimate(s.samples);
  std::size_t points = 1;
  Bytes y_max = planned_arena_bytes;
  for (const auto& s : series) {
    points = std::max(points, s.samples.size());
    for (const auto& p : s.samples) y_max = std::max(y_max, p.reserved_bytes);
  }
  y_max = std::max<Bytes>(1, y_max);
  auto x_of = [&](std::size_t i) { return kL + double(i) / double(std::max<std::size_t>(1, points - 1)) * kW; };
  auto y_of = [&](Bytes b) { return kT + kH - double(b) / double(y_max) * kH; };
  std::ostringstream svg;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" style=\"max-width:100%%;height:auto\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n",
                kL + kW + 20, kT + kH + kB, kL + kW + 20, kT + kH + kB);
  svg << buf;
  std::snprintf(buf, sizeof(buf), "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#444\"/>\n",
                kL, kT, kW, kH);
  svg << buf;
  for (int k = 0; k <= 4; ++k) {
    const Bytes b = y_max * k / 4;
    std::snprintf(buf, sizeof(buf), "<text x=\"4\" y=\"%.1f\">%s</text>\n", y_of(b) + 4, format_bytes(b).c_str());
    svg << buf;
  }
  std::snprintf(buf, sizeof(buf),
                "<line class=\"planned\" x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#7570b3\" stroke-width=\"2\"/>\n",
                kL, kL + kW, y_of(planned_arena_bytes), y_of(planned_arena_bytes));
  svg << buf;
  for (std::size_t s = 0; s < series.size(); ++s) {
    const auto& tl = series[s].samples;
    for (int which = 0; which < 2; ++which) {
      svg << "<polyline fill=\"none\" stroke=\"" << kSeriesColors[s % 4] << "\" stroke-width=\"1.5\""
          << (which == 1 ? " stroke-dasharray=\"5 3\"" : "") << " points=\"";
      for (std::size_t i = 0; i < tl.size(); ++i) {
        std::snprintf(buf, sizeof(buf), "%.1f,%.1f ", x_of(i), y_of(which == 0 ? tl[i].allocated_bytes : tl[i].reserved_bytes));
        svg << buf;
      }
      svg << "\"/>\n";
    }
  }
  double lx = kL;
  for (std::size_t s = 0; s < series.size(); ++s) {
    std::snprintf(buf, sizeof(buf), "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s: allocated (solid), reserved (dashed)</text>\n",
                  lx, kT + kH + 30 + 16 * double(s / 2), kSeriesColors[s % 4], xml_escape(series[s].name).c_str());
    svg << buf;
    lx = s % 2 == 0 ? kL + 450 : kL;
  }
  std::snprintf(buf, sizeof(buf), "<text x=\"%.0f\" y=\"%.0f\" fill=\"#7570b3\">planned arena</text>\n", kL + kW - 90,
                y_of(planned_arena_bytes) - 4);
  svg << buf << "</svg>\n";
  return svg.str();
}

std::string report_page_head(const std::string& title, const std::string& extra_css) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>" + xml_escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:16px}h1,h2,p{overflow-wrap:anywhere}table{border-collapse:collapse}"
         "td,th{border:1px solid #bbb;padding:4px 10px;text-align:right}th:first-child,td:first-child{text-align:left}"
         ".wide{overflow-x:auto;max-width:100%}svg{display:block;max-width:100%;height:auto}"
         "pre{white-space:pre-wrap;overflow-wrap:anywhere}" + extra_css + "</style></head><body>\n";
}

std::string render_compare_html(const nlohmann::json& c, const std::string& layout_svg, const std::string& timeline_svg) {
  std::ostringstream html;
  const std::string title = "memplan compare: " + c["model"].get<std::string>() + ", batch " +
                            std::to_string(c["batch"].get<std::int64_t>());
  html << report_page_head(title, ".oom{color:#c00;font-weight:bold}");
  html << "<h1>" << xml_escape(title) << "</h1>\n";
  html << "<p>The same training step (same op order, same tensor lifetimes) under three memory managers, replayed for "
       << c["steps"].get<int>() << " steps on a simulated device"
       << (c["budget_bytes"].is_null() ? std::string(" with no budget")
                                       : " of " + format_bytes(c["budget_bytes"].get<Bytes>()))
       << ".</p>\n";
  html << "<div class=\"wide\"><table id=\"summary\"><tr><th></th><th>reserved peak</th><th>allocated at that moment</th>"
          "<th>fragmentation</th><th>inactive split</th><th>device allocations per step</th></tr>\n";
  html << "<tr><td>lower bound</td><td>" << format_bytes(c["lower_bound_bytes"].get<Bytes>())
       << "</td><td></td><td></td><td></td><td></td></tr>\n";
  html << "<tr><td>memplan planned arena</td><td>" << format_bytes(c["planned_arena_bytes"].get<Bytes>())
       << "</td><td>-</td><td>0 B</td><td>0 B</td><td>0 (1 at setup)</td></tr>\n";
  for (const char* key : {"caching", "expandable"}) {
    const auto& d = c[key];
    const std::string name = std::string(key) == "caching" ? "caching allocator" : "caching allocator, expandable segments";
    if (d["out_of_memory"].get<bool>()) {
      html << "<tr><td>" << name << "</td><td colspan=\"5\" class=\"oom\">out of memory in step "
           << d["oom_step"].get<std::int64_t>() << " at op " << xml_escape(d["oom_op"].get<std::string>()) << ": "
           << xml_escape(d["oom_message"].get<std::string>()) << "</td></tr>\n";
      continue;
    }
    html << "<tr><td>" << name << "</td><td>" << format_bytes(d["reserved_peak_bytes"].get<Bytes>()) << "</td><td>"
         << format_bytes(d["allocated_at_reserved_peak_bytes"].get<Bytes>()) << "</td><td>"
         << format_bytes(d["fragmentation_bytes"].get<Bytes>()) << "</td><td>"
         << format_bytes(d["inactive_split_bytes"].get<Bytes>()) << "</td><td>"
         << d["device_allocs_per_step"].get<std::int64_t>() << "</td></tr>\n";
  }
  html << "</table></div>\n<h2>Layouts</h2>\n<p>Address (up) against op index (right) in the last replayed step; every "
          "tensor is a rectangle coloured by role. Grey is memory the caching allocator holds but no live tensor "
          "uses.</p>\n"
       << layout_svg << "<h2>Allocated vs reserved over time</h2>\n<p>After every allocation and free, all steps.</p>\n"
       << timeline_svg << "</body></html>\n";
  return html.str();
}

}  // namespace memplan::tools
