// The CLI-flag fuzz target. It parses argv with the memplan CLI itself (tools/cli_app.h), so it
// and the list of every target (which names it) live apart from the other targets, in the one
// fuzz library that links memplan_tools.
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "fuzz/targets.h"
#include "memplan/common/check.h"
#include "tools/cli_app.h"

namespace memplan::fuzz {
namespace {

// Silences std::cout and std::cerr while alive (CLI11 prints help and errors there).
class QuietStreams {
 public:
  QuietStreams() : out_(std::cout.rdbuf(sink_.rdbuf())), err_(std::cerr.rdbuf(sink_.rdbuf())) {}
  ~QuietStreams() {
    std::cout.rdbuf(out_);
    std::cerr.rdbuf(err_);
  }
  QuietStreams(const QuietStreams&) = delete;
  QuietStreams& operator=(const QuietStreams&) = delete;

 private:
  std::ostringstream sink_;
  std::streambuf* out_;
  std::streambuf* err_;
};

}  // namespace

void fuzz_cli(const std::uint8_t* data, std::size_t size) {
  // Arguments are separated by NUL bytes; at most 32 of them.
  std::vector<std::string> args = {"memplan"};
  std::string current;
  for (std::size_t i = 0; i < size && args.size() < 33; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty() && args.size() < 33) args.push_back(current);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  QuietStreams quiet;
  tools::CliApp cli;
  const std::optional<int> code = cli.parse(static_cast<int>(args.size()), argv.data());
  MEMPLAN_CHECK(!code || *code == tools::kExitOk || *code == tools::kExitUsage, "unexpected exit code " << *code);
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"byte_size", fuzz_byte_size}, {"minimalloc_csv", fuzz_minimalloc_csv}, {"idx", fuzz_idx},
      {"safetensors", fuzz_safetensors}, {"cli", fuzz_cli}, {"solver", fuzz_solver},
      {"alloc_conf", fuzz_alloc_conf}, {"text", fuzz_text}, {"snapshot", fuzz_snapshot}, {"onnx", fuzz_onnx},
      {"hf_config", fuzz_hf_config},
  };
  return all;
}

}  // namespace memplan::fuzz
