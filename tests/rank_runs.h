// What the tests of runs split over ranks (tensor, expert or data parallel, under mpirun) share:
// their text, a run's JSON answer, and two weights files (runtime/safetensors.h) compared tensor by
// tensor, the split run's against one process's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/runtime/safetensors.h"
#include "tests/cli_util.h"

namespace memplan::testing {

// 40 lines of the 95 printable bytes in shuffled orders, each ended by a tab and a newline: a
// text of 97 distinct bytes (a vocabulary that 2 tensor-parallel ranks split with a padding row).
inline void write_97_byte_text(const std::string& path) {
  std::ofstream text(path, std::ios::binary);
  for (int line = 0; line < 40; ++line) {
    for (int c = 32; c < 127; ++c) text.put(static_cast<char>(32 + (c * (line + 3)) % 95));
    text << "\t\n";
  }
}

// `command` run under `launcher` (mpirun's line, or "" for one process): exit 0 and one JSON
// object on stdout, else a test failure and an empty object.
inline nlohmann::json json_run(const std::string& launcher, const std::string& command) {
  const auto r = run_cli_with_env(launcher, command, false);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  try {
    return nlohmann::json::parse(r.output);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not one JSON object: " << e.what() << "\n" << r.output;
    return nlohmann::json::object();
  }
}

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every f32 parameter of the two files within `tolerance` of the first's norm, tensor by tensor
// (the attention keys' bias aside, whose exact gradient is zero: rounding noise in both), and
// some bits apart (the reductions' order differs between the runs). At least `min_compared`
// tensors compared.
inline void expect_parameters_close(const std::string& one, const std::string& split, double tolerance, int min_compared = 8) {
  const std::string a_bytes = file_bytes(one), b_bytes = file_bytes(split);
  auto a = runtime::parse_safetensors(a_bytes, one);
  auto b = runtime::parse_safetensors(b_bytes, split);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a.value().tensors.size(), b.value().tensors.size());
  int compared = 0;
  double total_diff = 0.0;
  for (const runtime::SafetensorsEntry& ta : a.value().tensors) {
    const runtime::SafetensorsEntry* tb = b.value().find(ta.name);
    ASSERT_NE(tb, nullptr) << ta.name;
    ASSERT_EQ(ta.shape, tb->shape) << ta.name << ": the saved tensor is not the whole one";
    ASSERT_EQ(ta.data.size(), tb->data.size()) << ta.name;
    const auto n = ta.data.size() / sizeof(float);
    std::vector<float> x(n), y(n);
    std::memcpy(x.data(), ta.data.data(), ta.data.size());
    std::memcpy(y.data(), tb->data.data(), tb->data.size());
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      norm += double(x[i]) * x[i];
    }
    total_diff += diff;
    if (ta.name.find("k.bias") != std::string::npos || ta.name.find("k_proj.bias") != std::string::npos) continue;
    EXPECT_LE(std::sqrt(diff), tolerance * std::sqrt(norm)) << ta.name;
    ++compared;
  }
  EXPECT_GE(compared, min_compared);
  EXPECT_GT(total_diff, 0.0) << "no bit differs: did the second run split anything?";
}

}  // namespace memplan::testing
