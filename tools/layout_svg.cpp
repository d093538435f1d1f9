#include "tools/layout_svg.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "tools/memory_report.h"

namespace memplan::tools {
namespace {

const char* kColors[] = {"#8da0cb", "#fc8d62", "#66c2a5", "#e78ac3", "#dddddd"};

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_layout_svg(const std::string& title, const std::vector<LayoutPanel>& panels) {
  constexpr double kPanelW = 520, kPanelH = 560, kMarginL = 70, kMarginT = 60, kGap = 40, kMarginB = 50;
  Bytes y_max = 1;
  for (const LayoutPanel& p : panels) {
    for (const LayoutRect& r : p.rects) y_max = std::max(y_max, r.hi);
    for (const LayoutLine& l : p.lines) y_max = std::max(y_max, l.at);
  }
  const double width = kMarginL + double(panels.size()) * (kPanelW + kGap);
  const double height = kMarginT + kPanelH + kMarginB;
  std::ostringstream svg;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height);
  svg << buf;
  svg << "<text x=\"" << kMarginL << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" << xml_escape(title) << "</text>\n";
  auto y_of = [&](Bytes b) { return kMarginT + kPanelH - double(b) / double(y_max) * kPanelH; };
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const LayoutPanel& p = panels[i];
    const double x0 = kMarginL + double(i) * (kPanelW + kGap);
    auto x_of = [&](double t) { return x0 + t / std::max(1.0, p.t_max) * kPanelW; };
    svg << "<text x=\"" << x0 << "\" y=\"" << kMarginT - 10 << "\" font-weight=\"bold\">" << xml_escape(p.title) << "</text>\n";
    std::snprintf(buf, sizeof(buf), "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n",
                  x0, kMarginT, kPanelW, kPanelH);
    svg << buf;
    for (const LayoutRect& r : p.rects) {
      const double y_top = y_of(r.hi), y_bottom = y_of(r.lo);
      std::snprintf(buf, sizeof(buf),
                    "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"#333\" "
                    "stroke-width=\"0.2\"><title>",
                    x_of(r.t0), y_top, std::max(0.5, x_of(r.t1) - x_of(r.t0)), std::max(0.5, y_bottom - y_top),
                    kColors[std::clamp(r.color, 0, 4)]);
      svg << buf << xml_escape(r.label) << "</title></rect>\n";
    }
    for (const LayoutLine& l : p.lines) {
      std::snprintf(buf, sizeof(buf),
                    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" stroke-dasharray=\"4 3\"/>\n"
                    "<text x=\"%.1f\" y=\"%.1f\" fill=\"#c00\">",
                    x0, x0 + kPanelW, y_of(l.at), y_of(l.at), x0 + 4,
                    y_of(l.at) - 4 < kMarginT + 14 ? y_of(l.at) + 14 : y_of(l.at) - 4);  // stay inside the panel
      svg << buf << xml_escape(l.label) << "</text>\n";
    }
    std::snprintf(buf, sizeof(buf), "<text x=\"%.1f\" y=\"%.1f\">time (ops) →</text>\n", x0 + kPanelW / 2 - 40,
                  kMarginT + kPanelH + 20);
    svg << buf;
  }
  // Byte axis, shared.
  for (int k = 0; k <= 4; ++k) {
    const Bytes b = y_max * k / 4;
    std::snprintf(buf, sizeof(buf), "<text x=\"4\" y=\"%.1f\">%s</text>\n", y_of(b) + 4, xml_escape(format_bytes(b)).c_str());
    svg << buf;
  }
  // Legend.
  const char* names[] = {"parameters / optimizer state", "activations / inputs", "gradients", "other", "cached, unused"};
  double lx = kMarginL;
  for (int c = 0; c < 5; ++c) {
    std::snprintf(buf, sizeof(buf),
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                  lx, height - 22, kColors[c], lx + 16, height - 12, names[c]);
    svg << buf;
    lx += 200;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace memplan::tools
