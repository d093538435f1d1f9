// Helpers shared by the golden tests, which compare memplan against values PyTorch produced
// offline (tests/golden/*.py wrote tests/data/*_golden.json).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memplan::testing {

// tests/data/NAME, parsed (a failed expectation names the file when it is missing).
inline nlohmann::json load_golden(const std::string& name) {
  std::ifstream in(std::string(MEMPLAN_TEST_DATA_DIR) + "/" + name);
  EXPECT_TRUE(in.good()) << "missing tests/data/" << name;
  return nlohmann::json::parse(in);
}

// |a - b| <= atol + rtol * |b|, elementwise, reporting the first mismatch by name and index.
inline void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                         const std::string& what, float atol, float rtol) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    ASSERT_LE(std::abs(actual[i] - expected[i]), atol + rtol * std::abs(expected[i]))
        << what << "[" << i << "]: memplan " << actual[i] << " vs PyTorch " << expected[i];
  }
}

}  // namespace memplan::testing
