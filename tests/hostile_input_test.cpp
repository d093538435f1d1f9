// Hostile input: every flag of every command, and every file reader, gets malformed, empty,
// truncated, huge, negative, NaN, infinite and wrong-type input. Each must end in a message that
// names the input, a non-zero exit code, no crash and no partial output file. Flags are parsed
// in-process (tools/cli_app.h); values checked only when a command runs, and files, go through
// the memplan binary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "tools/cli_app.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

int g_cases = 0;  // hostile inputs tried, printed at the end of each test

struct ParseOutcome {
  bool parsed = false;    // flags accepted: the command would run
  int exit_code = -1;     // when not parsed
  std::string output;     // what was printed (stdout and stderr)
};

ParseOutcome parse_in_process(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"memplan"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  std::ostringstream sink;
  std::streambuf* out = std::cout.rdbuf(sink.rdbuf());
  std::streambuf* err = std::cerr.rdbuf(sink.rdbuf());
  ParseOutcome o;
  try {
    tools::CliApp cli;
    const std::optional<int> code = cli.parse(static_cast<int>(argv.size() - 1), argv.data());
    o.parsed = !code.has_value();
    o.exit_code = code.value_or(-1);
  } catch (const std::exception& e) {
    sink << "EXCEPTION: " << e.what();
    o.exit_code = -2;
  }
  std::cout.rdbuf(out);
  std::cerr.rdbuf(err);
  o.output = sink.str();
  return o;
}

struct ProcessResult {
  bool exited = false;  // false: killed by a signal (a crash)
  int exit_code = -1;
  std::string output;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

ProcessResult run_memplan(const std::vector<std::string>& args) {
  std::string cmd = MEMPLAN_CLI_PATH;
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " 2>&1";
  ProcessResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.exited = WIFEXITED(status);
  r.exit_code = r.exited ? WEXITSTATUS(status) : -1;
  return r;
}

// Values no numeric or enumerated flag may accept.
const std::vector<std::string>& bad_values() {
  static const std::vector<std::string> values = {
      "",     "abc",  "-1",   "nan", "NaN",  "inf", "-inf", "1e999", "99999999999999999999999",
      "1.5x", "0x1g", "--",   "1,,2", " ",   "\x01\xff", std::string(10000, '9'), "-0.5", "[1]"};
  return values;
}

// Flags whose value is free text (paths, a prompt): any value parses; the command checks it
// when it runs, and the file-reader tests below cover those checks.
const std::set<std::string> kFreeText = {
    "train --data", "train --save",   "train --load",      "plan --out",      "compare --svg",
    "compare --html", "compare --trace-json", "compare --snapshot", "solve --input", "solve --output",
    "sample --load", "sample --prompt", "replay --html", "replay --svg", "generate --load", "generate --prompts-file",
    "generate --data", "plan --onnx", "fit --onnx", "compare --onnx", "plan --output", "fit --output", "compare --output",
    "fit --config", "plan --config", "compare --config", "train --output", "train --export-onnx",
    "train --save-dir", "plan --svg", "train --save-adapter",
    // Module names and parameter patterns: any name parses (control characters, spaces and empty
    // names do not); the step refuses one that names no layer or parameter, listing those there are.
    "train --lora-targets", "fit --lora-targets", "plan --lora-targets", "compare --lora-targets",
    "train --freeze", "fit --freeze", "plan --freeze", "compare --freeze"};

// Values in the list above that are fine for some flags: an empty allocator option string is
// PyTorch's default configuration; 1e23 is a (large) finite number; "[1]" is CLI11's list syntax
// and "1,,2" the list 1,2 (CLI11 skips empty elements).
bool legitimately_accepted(const std::string& key, const std::string& value) {
  if (key == "compare --alloc-conf" || key == "replay --alloc-conf") return value.empty() || value == " ";
  if (key == "train --lr" || key == "solve --time-limit") return value == "99999999999999999999999";
  if (key.ends_with(" --hidden")) return value == "[1]" || value == "1,,2";
  return false;
}

// Flags a command needs before any other flag is looked at, and a harmless value for them.
std::vector<std::string> required_args(const std::string& command, const std::string& sample_file) {
  if (command == "fit") return {"--device-memory", "1GiB"};
  if (command == "solve") return {"--input", "problem.csv"};
  if (command == "sample" || command == "generate") return {"--load", sample_file};
  if (command == "replay") return {sample_file};
  return {};
}

struct TempDir {
  TempDir() {
    path = fs::temp_directory_path() / ("memplan_hostile_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

TEST(HostileInput, EveryFlagOfEveryCommandRefusesBadValues) {
  TempDir tmp;
  const std::string existing = (tmp.path / "exists.safetensors").string();
  write_file(existing, "x");
  tools::CliApp walker;
  int tried = 0;
  // Under the sanitizers each flag gets every other bad value (the other half for the next flag):
  // each value still reaches every kind of validator. The normal build tries all of them.
  std::size_t flag_index = 0;
  for (const CLI::App* command : walker.app().get_subcommands({})) {
    const std::string name = command->get_name();
    for (const CLI::Option* option : command->get_options()) {
      if (option->get_expected_min() == 0) continue;  // flags without a value (--json, --help)
      const std::string flag = option->get_name();
      // Positional files (replay's snapshot) are not flags; their hostile files are tested with
      // their readers.
      if (flag.rfind('-', 0) != 0) continue;
      const std::string key = name + " " + flag;
      ++flag_index;
      std::size_t value_index = 0;
      for (const std::string& value : bad_values()) {
        if (testing::kSanitized && (value_index++ + flag_index) % 2 == 1) continue;
        std::vector<std::string> args = {name};
        const std::vector<std::string> required = required_args(name, existing);
        if (required.empty() || required[0] != flag) args.insert(args.end(), required.begin(), required.end());
        args.push_back(flag);
        args.push_back(value);
        const ParseOutcome o = parse_in_process(args);
        ++tried;
        ASSERT_NE(o.exit_code, -2) << key << " '" << value << "': " << o.output;
        if (o.parsed) {
          EXPECT_TRUE(kFreeText.count(key) || legitimately_accepted(key, value)) << key << " accepted the bad value '" << value.substr(0, 40) << "'";
          continue;
        }
        EXPECT_EQ(o.exit_code, tools::kExitUsage) << key << " '" << value.substr(0, 40) << "'";
        EXPECT_NE(o.output.find(flag), std::string::npos)
            << key << " '" << value.substr(0, 40) << "': the message does not name the flag:\n" << o.output;
      }
    }
  }
  // Unknown commands and flags.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"trian"}, {"train", "--bogus", "1"}, {"fit"}, {"solve", "--input"}, {"plan", "--batch"},
           {"train", "--steps", "3", "--epochs", "2"}, {"", ""}, {"train", "extra-positional"}}) {
    const ParseOutcome o = parse_in_process(args);
    ++tried;
    EXPECT_FALSE(o.parsed) << args[0];
    EXPECT_EQ(o.exit_code, tools::kExitUsage) << args[0] << ": " << o.output;
  }
  g_cases += tried;
  std::printf("hostile flag values parsed in-process: %d\n", tried);
  EXPECT_GT(tried, 500);
}

// Byte sizes and allocator options through the binary: exit 2 before any work, a message naming
// the flag, none of the command's output files written.
TEST(HostileInput, SizeAndOptionFlagsThroughTheBinary) {
  TempDir tmp;
  const std::string svg = (tmp.path / "out.svg").string();
  // Every value is also tried in-process above; a few through the binary check the exit code and
  // that no output file appears.
  const std::vector<std::string> values = {"", "nan", "-3GiB", std::string(5000, '7') + "GiB"};
  struct Case {
    std::vector<std::string> prefix;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"fit", "--model", "mlp"}, "--device-memory"},
      {{"fit", "--model", "mlp", "--device-memory", "1GiB"}, "--overhead"},
      {{"compare", "--model", "mlp", "--batch", "2", "--steps", "1", "--svg", svg}, "--device-memory"},
      {{"compare", "--model", "mlp", "--batch", "2", "--steps", "1", "--svg", svg}, "--alloc-conf"},
      {{"train", "--model", "mlp", "--steps", "1", "--data", (tmp.path / "nothing").string()}, "--device-memory"},
  };
  int tried = 0;
  for (const Case& c : cases) {
    for (const std::string& value : values) {
      if (c.flag == "--overhead" && value == "0") continue;  // no overhead is a valid answer
      if (c.flag == "--alloc-conf" && value.empty()) continue;  // PyTorch's defaults
      std::vector<std::string> args = c.prefix;
      args.push_back(c.flag);
      args.push_back(value);
      const ProcessResult r = run_memplan(args);
      ++tried;
      const std::string what = c.prefix[0] + " " + c.flag + " '" + value.substr(0, 20) + "'";
      ASSERT_TRUE(r.exited) << what << " crashed:\n" << r.output;
      EXPECT_EQ(r.exit_code, 2) << what << ":\n" << r.output;
      EXPECT_NE(r.output.find(c.flag), std::string::npos) << what << ": the message does not name the flag:\n"
                                                          << r.output;
      EXPECT_FALSE(fs::exists(svg)) << what << " left an output file";
    }
  }
  g_cases += tried;
  std::printf("hostile run-time flag values: %d\n", tried);
}

// --- file readers ---------------------------------------------------------------------------

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string le64(std::uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

std::string safetensors_file(const std::string& header_json, const std::string& data) {
  return le64(header_json.size()) + header_json + data;
}

struct FileCase {
  std::string name;
  std::string bytes;
};

// Runs `args` (which read `input`) and checks the refusal: non-zero exit, no signal, the file
// named in the message, `output` not created.
void expect_refused(const std::vector<std::string>& args, const std::string& input, const fs::path& output,
                    const std::string& what) {
  const ProcessResult r = run_memplan(args);
  ++g_cases;
  ASSERT_TRUE(r.exited) << what << " crashed:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << what << ":\n" << r.output;
  EXPECT_NE(r.exit_code, 3) << what << " is an internal error:\n" << r.output;
  EXPECT_NE(r.output.find(input), std::string::npos) << what << ": the message does not name " << input << ":\n"
                                                     << r.output;
  EXPECT_FALSE(fs::exists(output)) << what << " left a partial output file";
}

TEST(HostileInput, IdxFilesAreRefused) {
  TempDir tmp;
  const std::string header = be32(0x803) + be32(2) + be32(28) + be32(28);
  const std::string labels = be32(0x801) + be32(2) + std::string("\x01\x02", 2);
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> cases = {
      {"empty", {"", ""}},
      {"truncated header", {header.substr(0, 10), labels}},
      {"truncated pixels", {header + std::string(100, '\x10'), labels}},
      {"trailing data", {header + std::string(2 * 784 + 5, '\x10'), labels}},
      {"garbage", {std::string(4000, '\xa5'), std::string(10, '\x5a')}},
      {"huge count", {be32(0x803) + be32(0xffffffffu) + be32(28) + be32(28), labels}},
      {"zero rows", {be32(0x803) + be32(2) + be32(0) + be32(28), labels}},
      {"label count mismatch", {header + std::string(2 * 784, '\x10'), be32(0x801) + be32(3) + std::string(3, '\1')}},
      {"label out of range", {header + std::string(2 * 784, '\x10'), be32(0x801) + be32(2) + std::string("\x01\xff", 2)}},
      {"bad gzip", {std::string("\x1f\x8b\x08\x00", 4) + std::string(40, '\x33'), labels}},
  };
  for (const auto& [name, files] : cases) {
    const fs::path dir = tmp.path / "data";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string images_path = (dir / "train-images-idx3-ubyte").string();
    write_file(name == "bad gzip" ? images_path + ".gz" : images_path, files.first);
    write_file(dir / "train-labels-idx1-ubyte", files.second);
    const fs::path out = tmp.path / "weights.safetensors";
    expect_refused({"train", "--model", "mlp", "--steps", "1", "--quiet", "--data", dir.string(), "--save", out.string()},
                   dir.string(), out, "IDX " + name);
  }
  expect_refused({"train", "--model", "mlp", "--steps", "1", "--data", (tmp.path / "missing").string()},
                 (tmp.path / "missing").string(), tmp.path / "none", "IDX missing folder");
}

TEST(HostileInput, MinimallocCsvFilesAreRefused) {
  TempDir tmp;
  const std::vector<FileCase> cases = {
      {"empty", ""},
      {"garbage", std::string("\x7f\x45\x4c\x46\x02\x01\x01\x00", 8) + std::string(300, '\xee')},
      {"no header", "a,0,3,16\n"},
      {"truncated row", "id,lower,upper,size\na,0,"},
      {"negative size", "id,lower,upper,size\na,0,3,-16\n"},
      {"nan size", "id,lower,upper,size\na,0,3,nan\n"},
      {"inf lower", "id,lower,upper,size\na,inf,3,8\n"},
      {"huge size", "id,lower,upper,size\na,0,3,99999999999999999999999\n"},
      {"size over 2^60", "id,lower,upper,size\na,0,3,1152921504606846977\n"},
      {"wrong type", "id,lower,upper,size\na,zero,three,sixteen\n"},
      {"empty lifetime", "id,lower,upper,size\na,3,3,16\n"},
      {"duplicate id", "id,lower,upper,size\na,0,3,16\na,1,2,8\n"},
      {"long line", "id,lower,upper,size\n" + std::string(5000, 'x') + ",0,3,16\n"},
      {"fraction", "id,lower,upper,size\na,0,3,1.5\n"},
      {"negative offset", "id,lower,upper,size,offset\na,0,3,16,-8\n"},
  };
  const fs::path out = tmp.path / "packed.csv";
  for (const FileCase& c : cases) {
    const fs::path input = tmp.path / "problem.csv";
    write_file(input, c.bytes);
    expect_refused({"solve", "--input", input.string(), "--output", out.string()}, input.string(), out, "CSV " + c.name);
  }
  expect_refused({"solve", "--input", tmp.path.string(), "--output", out.string()}, tmp.path.string(), out,
                 "CSV directory");
  expect_refused({"solve", "--input", (tmp.path / "missing.csv").string(), "--output", out.string()},
                 (tmp.path / "missing.csv").string(), out, "CSV missing file");
}

TEST(HostileInput, SafetensorsFilesAreRefused) {
  TempDir tmp;
  const std::string f32x2(8, '\0');
  const std::vector<FileCase> cases = {
      {"empty", ""},
      {"shorter than the length", "abc"},
      {"huge header length", le64(0xffffffffffffffffull) + "{}"},
      {"header past the end", le64(1000) + "{}"},
      {"header not json", safetensors_file("not json at all", "")},
      {"header not an object", safetensors_file("[1,2,3]", "")},
      {"bad dtype", safetensors_file(R"({"w":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", f32x2)},
      {"negative shape", safetensors_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2)},
      {"nan shape", safetensors_file(R"({"w":{"dtype":"F32","shape":[NaN],"data_offsets":[0,8]}})", f32x2)},
      {"fractional shape", safetensors_file(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", f32x2)},
      {"huge shape", safetensors_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f32x2)},
      {"offsets outside", safetensors_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", f32x2)},
      {"truncated data", safetensors_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2.substr(0, 5))},
      {"offsets wrong type", safetensors_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}})", f32x2)},
      {"checksum mismatch",
       safetensors_file(R"({"__metadata__":{"memplan.data_sha256":"00"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                        f32x2)},
      {"metadata not strings", safetensors_file(R"({"__metadata__":{"memplan.step":7}})", "")},
      {"valid but not a gpt", safetensors_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2)},
  };
  const fs::path text = tmp.path / "text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 50; ++i) t << "hostile input makes robust readers " << i << "\n";
  }
  const fs::path out = tmp.path / "out.safetensors";
  for (const FileCase& c : cases) {
    const fs::path input = tmp.path / "weights.safetensors";
    write_file(input, c.bytes);
    expect_refused({"sample", "--load", input.string(), "--tokens", "4"}, input.string(), out, "safetensors " + c.name);
    if (c.name == "checksum mismatch" || c.name == "valid but not a gpt") {
      expect_refused({"train", "--model", "gpt", "--layers", "1", "--width", "16", "--heads", "2", "--seq", "8", "--batch",
                      "2", "--steps", "1", "--quiet", "--data", text.string(), "--load", input.string(), "--save",
                      out.string()},
                     input.string(), out, "train --load " + c.name);
    }
  }
}

TEST(HostileInput, TextFilesAreRefused) {
  TempDir tmp;
  const fs::path out = tmp.path / "out.safetensors";
  const auto train_gpt = [&](const std::string& data) {
    return std::vector<std::string>{"train", "--model", "gpt", "--layers", "1", "--width", "16", "--heads", "2", "--seq",
                                    "8", "--batch", "2", "--steps", "1", "--quiet", "--data", data, "--save", out.string()};
  };
  const fs::path empty = tmp.path / "empty.txt";
  write_file(empty, "");
  expect_refused(train_gpt(empty.string()), empty.string(), out, "text empty");
  const fs::path short_text = tmp.path / "short.txt";
  write_file(short_text, "tiny");
  expect_refused(train_gpt(short_text.string()), short_text.string(), out, "text too short");
  const fs::path empty_dir = tmp.path / "no_fortunes";
  fs::create_directories(empty_dir);
  expect_refused(train_gpt(empty_dir.string()), empty_dir.string(), out, "text empty folder");
  expect_refused(train_gpt((tmp.path / "missing").string()), (tmp.path / "missing").string(), out, "text missing");
  std::printf("hostile inputs tried so far in this process: %d\n", g_cases);
}

TEST(HostileInput, HuggingFaceConfigsAreRefused) {
  TempDir tmp;
  const std::string llama = R"("model_type":"llama","hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,)"
                            R"("num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256)";
  struct ConfigCase {
    std::string name;
    std::string bytes;
    std::string field;  // named in the message
  };
  const std::vector<ConfigCase> cases = {
      {"empty", "", "not a JSON config"},
      {"not JSON", "model_type = llama\n", "not a JSON config"},
      {"truncated", "{" + llama.substr(0, 40), "not a JSON config"},
      {"deeply nested", std::string(100000, '[') + std::string(100000, ']'), "a JSON object"},
      {"garbage", std::string("\x7f\x45\x4c\x46\x02\x01\x01\x00", 8) + std::string(300, '\xee'), "not a JSON config"},
      {"unknown model_type", R"({"model_type":"xlnet"})", "supported: gpt2, llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, granite, starcoder2, stablelm, olmoe, deepseek_v2, deepseek_v3, kimi_k2, opt, gpt_bigcode, phi3, olmo2, gpt_neox, falcon, mixtral, qwen2_moe, qwen3_moe, bert, vit, t5"},
      {"missing field", R"({"model_type":"llama","hidden_size":64})", "num_hidden_layers: missing"},
      {"wrong type", "{" + llama + R"(,"num_key_value_heads":[2]})", "num_key_value_heads: expected a positive integer"},
      {"negative size", R"({"model_type":"gpt2","n_embd":-768,"n_layer":2,"n_head":4,"vocab_size":50,"n_positions":64})", "n_embd"},
      {"heads not dividing", "{" + llama + R"(,"num_attention_heads":5})", "num_attention_heads 5 does not divide hidden_size 64"},
      {"bytes overflow", R"({"model_type":"gpt2","n_embd":1024,"n_layer":2,"n_head":4,"vocab_size":50,"n_positions":9000000000000000})",
       "n_positions x n_embd"},
      {"huge integer", "{" + llama + R"(,"vocab_size":99999999999999999999999})", "vocab_size"},
      {"NaN", "{" + llama + R"(,"rms_norm_eps":NaN})", "not a JSON config"},
  };
  const fs::path svg = tmp.path / "out.svg";
  for (const ConfigCase& c : cases) {
    const fs::path input = tmp.path / "config.json";
    write_file(input, c.bytes);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"fit", "--budget", "80GiB", "--config", input.string()},
          std::vector<std::string>{"plan", "--config", input.string(), "--out", svg.string()},
          std::vector<std::string>{"compare", "--steps", "1", "--config", input.string(), "--svg", svg.string()}}) {
      const ProcessResult r = run_memplan(args);
      ++g_cases;
      const std::string what = args[0] + " --config (" + c.name + ")";
      ASSERT_TRUE(r.exited) << what << " crashed:\n" << r.output;
      EXPECT_EQ(r.exit_code, 2) << what << ":\n" << r.output;
      EXPECT_NE(r.output.find(input.string()), std::string::npos) << what << ": the file is not named:\n" << r.output;
      EXPECT_NE(r.output.find(c.field), std::string::npos) << what << ": '" << c.field << "' is not named:\n" << r.output;
      EXPECT_FALSE(fs::exists(svg)) << what << " left an output file";
    }
  }
}

// --- endless streams, huge files and sizes that overflow: refused fast, in bounded memory ---

// The bound on a refusal's peak resident size. Sanitizer builds keep their own bookkeeping (ASan's
// shadow pages and its quarantine of freed blocks, up to 256 MiB by default), so there the bound
// is raised to what that bookkeeping can add; a reader that reads without bound still passes it
// within a second.
#if defined(__SANITIZE_ADDRESS__)
constexpr long kMaxRssKiB = 400 * 1024;
constexpr const char* kRssNote = "a sanitizer build: peak RSS bound 400 MiB (ASan's shadow and quarantine)";
#else
constexpr long kMaxRssKiB = 100 * 1024;
constexpr const char* kRssNote = "peak RSS bound 100 MiB";
#endif
constexpr double kMaxSeconds = 5.0;  // to refuse; the child is killed at 30 s

// Runs memplan, expects a usage error (exit 2) naming `named` within kMaxSeconds and kMaxRssKiB,
// and returns its output.
std::string expect_fast_refusal(const std::vector<std::string>& args, const std::string& named, const std::string& what) {
  const testing::MeasuredRun r = testing::run_cli_measured(args, 30.0);
  ++g_cases;
  std::printf("  %-46s exit %d  %6.2f s  peak RSS %6.1f MiB\n", what.c_str(), r.exit_code, r.seconds,
              static_cast<double>(r.peak_rss_kib) / 1024.0);
  EXPECT_FALSE(r.timed_out) << what << " did not end within 30 s:\n" << r.output;
  EXPECT_EQ(r.exit_code, 2) << what << ":\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << what << ":\n" << r.output;
  EXPECT_NE(r.output.find(named), std::string::npos) << what << ": the message does not name " << named << ":\n" << r.output;
  EXPECT_LT(r.seconds, kMaxSeconds) << what << " took " << r.seconds << " s to refuse";
  EXPECT_LT(r.peak_rss_kib, kMaxRssKiB) << what << " peaked at " << r.peak_rss_kib << " KiB (" << kRssNote << ")";
  return r.output;
}

// A file of `bytes` zero bytes that occupies no disk: ftruncate leaves a hole.
void make_sparse(const fs::path& path, std::int64_t bytes) {
  write_file(path, "");
  fs::resize_file(path, static_cast<std::uintmax_t>(bytes));
}

// Kinds of input no reader may read without bound, and where each reader takes them.
struct StreamCase {
  std::string name;
  std::function<void(const fs::path&)> make;  // creates the input at a path
};

std::vector<StreamCase> endless_and_huge(std::int64_t over_limit, std::int64_t under_limit) {
  std::vector<StreamCase> cases = {
      {"/dev/zero", [](const fs::path& p) { fs::create_symlink("/dev/zero", p); }},
      // Never opened for writing: a reader that opened it blocking would wait forever.
      {"a named pipe", [](const fs::path& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0); }},
      {"a sparse file over the limit", [over_limit](const fs::path& p) { make_sparse(p, over_limit); }},
  };
  if (under_limit > 0) {
    cases.push_back({"a sparse file of zeros under the limit", [under_limit](const fs::path& p) { make_sparse(p, under_limit); }});
  }
  return cases;
}

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

TEST(HostileInput, EndlessStreamsAndHugeFilesAreRefusedFastInBoundedMemory) {
  std::printf("%s\n", kRssNote);
  TempDir tmp;
  const fs::path text = tmp.path / "text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 50; ++i) t << "hostile input makes robust readers " << i << "\n";
  }
  // MiniMalloc CSV (solve): 1 GiB limit; zeros fail on the first line, read no further.
  for (const StreamCase& c : endless_and_huge(80 * kGiB, kGiB / 2)) {
    const fs::path input = tmp.path / "problem.csv";
    fs::remove(input);
    c.make(input);
    expect_fast_refusal({"solve", "--input", input.string()}, input.string(), "solve --input " + c.name);
  }
  // Weights (sample --load, train --load): 64 GiB limit; zeros are a header length of 0.
  for (const StreamCase& c : endless_and_huge(80 * kGiB, 8 * kGiB)) {
    const fs::path input = tmp.path / "weights.safetensors";
    fs::remove(input);
    c.make(input);
    expect_fast_refusal({"sample", "--load", input.string(), "--tokens", "4"}, input.string(), "sample --load " + c.name);
    expect_fast_refusal({"train", "--model", "mlp", "--steps", "1", "--quiet", "--load", input.string()}, input.string(),
                        "train --model mlp --load " + c.name);
  }
  // IDX images (train --data): 1 GiB limit, plain or gzipped; zeros are a bad magic number.
  for (const StreamCase& c : endless_and_huge(80 * kGiB, kGiB / 2)) {
    const fs::path dir = tmp.path / "idx";
    fs::remove_all(dir);
    fs::create_directories(dir);
    c.make(dir / "train-images-idx3-ubyte");
    write_file(dir / "train-labels-idx1-ubyte", be32(0x801) + be32(2) + std::string("\x01\x02", 2));
    expect_fast_refusal({"train", "--model", "mlp", "--steps", "1", "--quiet", "--data", dir.string()},
                        (dir / "train-images-idx3-ubyte").string(), "train --data (IDX images) " + c.name);
  }
  // Text (train --model gpt --data): 256 MiB limit. Zeros under it are valid text, read whole by
  // design, so only the endless and over-limit inputs are tried.
  for (const StreamCase& c : endless_and_huge(80 * kGiB, 0)) {
    const fs::path input = tmp.path / "corpus.txt";
    fs::remove(input);
    c.make(input);
    expect_fast_refusal({"train", "--model", "gpt", "--layers", "1", "--width", "16", "--heads", "2", "--seq", "8",
                         "--batch", "2", "--steps", "1", "--quiet", "--data", input.string()},
                        input.string(), "train --model gpt --data " + c.name);
  }
  // Hugging Face configs (fit/plan/compare --config): 16 MiB limit; zeros are not JSON.
  for (const StreamCase& c : endless_and_huge(80 * kGiB, 8 << 20)) {
    const fs::path input = tmp.path / "config.json";
    fs::remove(input);
    c.make(input);
    expect_fast_refusal({"fit", "--budget", "80GiB", "--config", input.string()}, input.string(), "fit --config " + c.name);
  }
  // A folder of text files with a pipe among them: the pipe is skipped (not a regular file).
  const fs::path folder = tmp.path / "texts";
  fs::create_directories(folder);
  ASSERT_EQ(::mkfifo((folder / "b-pipe").c_str(), 0600), 0);
  make_sparse(folder / "c-huge", 80 * kGiB);
  write_file(folder / "a-text", "short\n");
  expect_fast_refusal({"train", "--model", "gpt", "--layers", "1", "--width", "16", "--heads", "2", "--seq", "8",
                       "--batch", "2", "--steps", "1", "--quiet", "--data", folder.string()},
                      (folder / "c-huge").string(), "train --model gpt --data folder with a huge file");
}

// The value in "... the largest value that works with the other flags as given is N".
std::int64_t largest_in(const std::string& output) {
  const std::string marker = "the largest value that works with the other flags as given is ";
  const std::size_t at = output.find(marker);
  if (at == std::string::npos) return -1;
  return std::stoll(output.substr(at + marker.size()));
}

TEST(HostileInput, SizesThatOverflowAreUsageErrorsNamingTheFlagAndTheLargestThatWorks) {
  std::printf("%s\n", kRssNote);
  struct SizeCase {
    std::vector<std::string> args;  // the value of `flag` is the last argument
    std::string flag;
    std::int64_t granule = 1;
  };
  // Each dimension a step multiplies, on every command that plans one.
  const std::vector<SizeCase> planned = {
      {{"fit", "--model", "llama2-7b", "--budget", "80GiB", "--batch", "4000000000"}, "--batch"},
      {{"fit", "--model", "llama2-7b", "--budget", "80GiB", "--batch", "100000000"}, "--batch"},
      {{"plan", "--model", "gpt2", "--batch", "9223372036854775807"}, "--batch"},
      {{"plan", "--model", "llama-1b", "--seq", "100000000000"}, "--seq"},
      {{"compare", "--model", "llama-1b", "--seq", "100000000000"}, "--seq"},
      // materialized: the [B, heads, T, T] scores are what overflows (fused attention holds none)
      {{"plan", "--model", "vit-b16", "--attention", "materialized", "--image-size", "1600000"}, "--image-size", 16},
      {{"fit", "--model", "resnet50", "--budget", "80GiB", "--image-size", "4000000000"}, "--image-size"},
      {{"compare", "--model", "cnn", "--image-size", "9000000000"}, "--image-size"},
      {{"plan", "--model", "mlp", "--hidden", "10000000000000000"}, "--hidden"},
      {{"plan", "--model", "bert-base", "--batch", "1000000000000000000"}, "--batch"},
  };
  for (std::size_t k = 0; k < planned.size(); ++k) {
    const SizeCase& c = planned[k];
    std::string what;
    for (const std::string& a : c.args) what += a + " ";
    const std::string out = expect_fast_refusal(c.args, c.flag + " " + c.args.back(), what);
    const std::int64_t largest = largest_in(out);
    ASSERT_GT(largest, 0) << what << ": no largest value in:\n" << out;
    EXPECT_LT(largest, std::stoll(c.args.back()));
    EXPECT_EQ(largest % c.granule, 0) << what;
    // Under the sanitizers every eighth answer is planned at and past (two plans of a large model
    // each, seconds there); the refusals above, where the overflow checks run, are all kept.
    if (testing::kSanitized && k % 8 != 0) continue;
    // The answer is exact: that value plans, the next one does not.
    std::vector<std::string> at = {"plan", "--model", c.args[2], c.flag, std::to_string(largest)};
    if (c.args[3] == "--attention") at.insert(at.begin() + 3, {c.args[3], c.args[4]});
    const testing::MeasuredRun ok = testing::run_cli_measured(at, 60.0);
    EXPECT_EQ(ok.exit_code, 0) << "plan at the largest value " << largest << ":\n" << ok.output.substr(0, 2000);
    at.back() = std::to_string(largest + c.granule);
    const testing::MeasuredRun over = testing::run_cli_measured(at, 60.0);
    EXPECT_EQ(over.exit_code, 2) << "plan one step past the largest value:\n" << over.output.substr(0, 2000);
    EXPECT_NE(over.output.find(c.flag), std::string::npos) << over.output;
  }
  // At the largest batch, recomputed activations still add up past one arena: an answer too.
  {
    const std::string out = expect_fast_refusal({"plan", "--model", "llama2-7b", "--batch", "4000000000"}, "--batch",
                                                "plan --model llama2-7b --batch 4000000000");
    const std::string largest = std::to_string(largest_in(out));
    const testing::MeasuredRun r =
        testing::run_cli_measured({"plan", "--model", "llama2-7b", "--batch", largest, "--checkpoint", "optimal"}, 120.0);
    EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find("cannot be planned in one arena"), std::string::npos) << r.output.substr(0, 2000);
  }
  // train checks before it reads any data; layer counts before it builds anything large.
  const std::vector<SizeCase> trained = {
      {{"train", "--model", "gpt", "--steps", "1", "--quiet", "--width", "4000000000000"}, "--width", 4},
      {{"train", "--model", "gpt", "--steps", "1", "--quiet", "--attention", "materialized", "--seq", "1000000000000"}, "--seq"},  // [T, T] scores overflow
      {{"train", "--model", "gpt", "--steps", "1", "--quiet", "--batch", "1000000000000000000"}, "--batch"},
      {{"train", "--model", "mlp", "--steps", "1", "--quiet", "--batch", "1000000000000000000"}, "--batch"},
      {{"train", "--model", "mlp", "--steps", "1", "--quiet", "--hidden", "100000000000,100000000000"}, "--hidden"},
  };
  for (const SizeCase& c : trained) {
    std::string what;
    for (const std::string& a : c.args) what += a + " ";
    const std::string out = expect_fast_refusal(c.args, c.flag, what);
    EXPECT_GT(largest_in(out), 0) << what << ": no largest value in:\n" << out;
  }
  const std::string layers = expect_fast_refusal(
      {"train", "--model", "gpt", "--steps", "1", "--quiet", "--layers", "1000000000"}, "--layers 1000000000",
      "train --model gpt --layers 1000000000");
  EXPECT_NE(layers.find("the largest that works is"), std::string::npos) << layers;
}

TEST(HostileInput, ConfigSizesThatCannotBeRepresentedAreRefusedFast) {
  TempDir tmp;
  const std::string llama = R"({"model_type":"llama","hidden_size":64,"intermediate_size":160,"num_attention_heads":4,)"
                            R"("vocab_size":100,)";
  const fs::path layers = tmp.path / "layers.json";
  write_file(layers, llama + R"("num_hidden_layers":1000000000,"max_position_embeddings":256})");
  const std::string out = expect_fast_refusal({"plan", "--config", layers.string()}, "num_hidden_layers 1000000000",
                                              "plan --config (a billion layers)");
  EXPECT_NE(out.find("the largest that works is"), std::string::npos) << out;
  // Rotary positions: no table to overflow, but the default sequence length is the config's; 10^17
  // positions overflow even the tensors that grow linearly with it (fused attention stores no
  // [T, T] scores).
  const fs::path positions = tmp.path / "positions.json";
  write_file(positions, llama + R"("num_hidden_layers":2,"max_position_embeddings":100000000000000000})");
  const std::string seq = expect_fast_refusal({"fit", "--budget", "80GiB", "--config", positions.string()}, "--seq",
                                              "fit --config (10^17 positions)");
  EXPECT_GT(largest_in(seq), 0) << seq;
  EXPECT_NE(seq.find("the config's 100000000000000000 positions are the sequence length"), std::string::npos) << seq;
  const testing::MeasuredRun ok = testing::run_cli_measured(
      {"plan", "--config", positions.string(), "--seq", std::to_string(largest_in(seq))}, 60.0);
  EXPECT_EQ(ok.exit_code, 0) << ok.output.substr(0, 2000);
}

TEST(HostileInput, SavedModelsWhoseConfigCannotBeRepresentedAreRefused) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> configs = {
      {"layers", R"({\"vocab\":2,\"context\":8,\"layers\":1000000000,\"heads\":1,\"width\":8,\"tied_head\":true})"},
      {"context", R"({\"vocab\":2,\"context\":1000000000000000000,\"layers\":1,\"heads\":1,\"width\":8,\"tied_head\":true})"},
      {"width", R"({\"vocab\":2,\"context\":8,\"layers\":1,\"heads\":1,\"width\":100000000000,\"tied_head\":true})"},
  };
  for (const auto& [name, config] : configs) {
    const fs::path input = tmp.path / ("gpt_" + name + ".safetensors");
    write_file(input, safetensors_file(R"({"__metadata__":{"memplan.model":"gpt","memplan.vocab_hex":"6162","memplan.config":")" +
                                           config + R"("}})",
                                       ""));
    const std::string out = expect_fast_refusal({"sample", "--load", input.string(), "--tokens", "4"}, input.string(),
                                                "sample --load (config " + name + ")");
    EXPECT_NE(out.find("cannot be represented"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace memplan
