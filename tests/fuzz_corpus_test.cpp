// Replays every committed fuzz corpus file (fuzz/corpus/<target>/) through the fuzz entry points,
// so inputs that once broke memplan (regress-*) stay fixed in every build, libFuzzer or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "memplan/common/check.h"
#include "fuzz/targets.h"

namespace memplan::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> corpus_files(std::string_view target) {
  std::vector<fs::path> files;
  const fs::path dir = fs::path(MEMPLAN_FUZZ_CORPUS_DIR) / std::string(target);
  if (!fs::is_directory(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

// Test names and ctest listings show the target's name, not its bytes.
void PrintTo(const Target& target, std::ostream* os) { *os << target.name; }

namespace {

class FuzzCorpus : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzCorpus, EveryCommittedInputIsHandled) {
  const std::vector<fs::path> files = corpus_files(GetParam().name);
  ASSERT_GE(files.size(), 2u) << "no seed corpus for fuzz target " << GetParam().name;
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      GetParam().entry(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const InternalError& e) {
      ADD_FAILURE() << path << ": " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpus, ::testing::ValuesIn(targets()),
                         [](const ::testing::TestParamInfo<Target>& param) { return std::string(param.param.name); });

}  // namespace
}  // namespace memplan::fuzz
