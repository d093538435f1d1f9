// ONNX import time at real scale: OnnxModel::load (the file mapped, protobuf parsing it without the
// initializers' data) beside protobuf's parse of the whole file into one message (what load did
// before), the forward graph built at a batch without values (what planning reads), and
// `memplan fit --onnx FILE --batch B` end to end as a user runs it, and with --max-batch (the
// largest batch under each checkpoint strategy, 80 GiB). Checks first that every
// initializer the import keeps holds the file's bytes.
//   bench_onnx_import [--files a.onnx,b.onnx] [--batch 64] [--rounds 3] [--json-out bench_onnx_import.json]
// The files come from `python3 tests/golden/make_onnx_fixtures.py /tmp/onnx_large --large`.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bench_util.h"
#include "memplan/import/onnx_import.h"

namespace memplan::bench {
namespace {

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "check failed: %s\n", what.c_str());
    std::exit(1);
  }
}

// protobuf's parse of the whole file from a stream, as OnnxModel::load did before.
bool parse_whole(const std::string& path, onnx::ModelProto& model) {
  std::ifstream in(path, std::ios::binary);
  return in && model.ParseFromIstream(&in);
}

// Every float initializer the import keeps equals the file's bytes, parsed by protobuf alone.
void check_values(const std::string& path) {
  onnx::ModelProto whole;
  check(parse_whole(path, whole), path + " parses");
  std::map<std::string, const onnx::TensorProto*> by_name;
  for (const auto& t : whole.graph().initializer()) by_name[t.name()] = &t;
  auto model = import::OnnxModel::load(path);
  check(model.ok(), path + " loads");
  import::ImportedGraph g = model.value()->build({});
  check(!g.initial_values.empty(), path + " has initializers");
  for (const auto& [id, values] : g.initial_values) {
    const std::string& name = g.graph.tensor(id).name;
    const onnx::TensorProto& t = *by_name.at(name);
    std::vector<float> expected(t.float_data().begin(), t.float_data().end());
    if (!t.raw_data().empty()) {
      expected.resize(t.raw_data().size() / 4);
      std::memcpy(expected.data(), t.raw_data().data(), t.raw_data().size());
    }
    check(values == expected, name + " of " + path + " holds the file's values");
  }
}

double fit_ms(const std::string& path, std::int64_t batch, const std::string& extra = "") {
  const std::string cmd = std::string(MEMPLAN_CLI_PATH) + " fit --onnx " + path + " --batch " + std::to_string(batch) +
                          " --device-memory 80GiB --json" + extra + " > /dev/null 2>&1";
  int status = 0;
  const double ms = time_ms([&] { status = std::system(cmd.c_str()); });
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0, cmd);
  return ms;
}

}  // namespace
}  // namespace memplan::bench

int main(int argc, char** argv) {
  using namespace memplan::bench;
  std::vector<std::string> files = {"/tmp/onnx_large/resnet50.onnx", "/tmp/onnx_large/vit_b_16.onnx"};
  std::int64_t batch = 64;
  int rounds = 3;
  std::string json_out = "bench_onnx_import.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--files" && i + 1 < argc) {
      files.clear();
      std::stringstream list(argv[++i]);
      for (std::string f; std::getline(list, f, ',');) files.push_back(f);
    } else if (a == "--batch" && i + 1 < argc) {
      batch = std::stoll(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::stoi(argv[++i]);
    } else if (a == "--json-out" && i + 1 < argc) {
      json_out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_onnx_import [--files a.onnx,b.onnx] [--batch 64] [--rounds 3] [--json-out FILE]\n");
      return 2;
    }
  }
  for (const std::string& f : files) {
    if (!std::filesystem::is_regular_file(f)) {
      std::fprintf(stderr, "%s not found: python3 tests/golden/make_onnx_fixtures.py /tmp/onnx_large --large exports it\n", f.c_str());
      return 2;
    }
    check_values(f);
  }
  std::vector<std::vector<std::string>> rows;
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& f : files) {
    std::vector<double> whole, load, build, fit, max_batch;
    std::int64_t parameters = 0;
    for (int r = 0; r < rounds; ++r) {  // interleaved, so the machine's load hits both alike
      onnx::ModelProto m;
      whole.push_back(time_ms([&] { check(parse_whole(f, m), f); }));
      std::shared_ptr<const memplan::import::OnnxModel> model;
      load.push_back(time_ms([&] { model = memplan::import::OnnxModel::load(f).value(); }));
      memplan::import::ImportOptions options;
      options.batch = batch;
      options.keep_values = false;
      build.push_back(time_ms([&] {
        const memplan::import::ImportedGraph g = model->build(options);
        parameters = 0;
        for (memplan::TensorId p : g.graph.parameters()) parameters += g.graph.tensor(p).shape.numel();
      }));
      fit.push_back(fit_ms(f, batch));
      max_batch.push_back(fit_ms(f, batch, " --max-batch"));
    }
    const std::string name = std::filesystem::path(f).filename().string();
    rows.push_back({name, std::to_string(std::filesystem::file_size(f) >> 20) + " MiB", std::to_string(parameters),
                    fmt(median(whole), 0), fmt(median(load), 0), fmt(median(build), 0), fmt(median(fit), 0),
                    fmt(median(max_batch), 0)});
    out.push_back({{"file", name}, {"bytes", std::filesystem::file_size(f)}, {"parameters", parameters}, {"batch", batch},
                   {"protobuf_whole_parse_ms", median(whole)}, {"load_ms", median(load)}, {"build_ms", median(build)},
                   {"fit_cli_ms", median(fit)}, {"fit_max_batch_cli_ms", median(max_batch)}, {"rounds", rounds}});
  }
  print_table({"file", "size", "parameters", "protobuf whole parse ms", "OnnxModel::load ms", "build ms (batch " + std::to_string(batch) + ")",
               "memplan fit ms", "memplan fit --max-batch ms"},
              rows);
  write_json(json_out, out);
  return 0;
}
