// Shared by the benchmarks: median timing, markdown tables, JSON output.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memplan::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Prints a markdown table: a header row and rows of already-formatted cells.
inline void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  auto line = [](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (const std::string& c : cells) s += " " + c + " |";
    std::puts(s.c_str());
  };
  line(header);
  std::vector<std::string> sep(header.size(), "---");
  line(sep);
  for (const auto& r : rows) line(r);
}

inline std::string fmt(double v, int precision = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("\nwrote %s\n", path.c_str());
}

}  // namespace memplan::bench
