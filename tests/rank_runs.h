// Two weights files (runtime/safetensors.h) compared tensor by tensor: what a run split over ranks
// (tensor, expert or data parallel) is checked against one process with.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "memplan/runtime/safetensors.h"

namespace memplan::testing {

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
