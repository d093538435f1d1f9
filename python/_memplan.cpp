// The Python package's native half: runs a memplan command in-process (the CLI's own flags,
// validation, errors and JSON: tools/cli_app.h) with inputs handed over in memory and reports
// kept in memory (common/memory_files.h). The GIL is released while the command runs, and
// Ctrl-C in Python stops it (common/cancellation.h) and raises KeyboardInterrupt.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/byte_size.h"
#include "memplan/common/cancellation.h"
#include "memplan/common/memory_files.h"
#include "tools/cli_app.h"
#include "tools/commands.h"

namespace py = pybind11;

namespace {

using memplan::tools::CapturedRun;

// How often the waiting Python thread looks for a pending KeyboardInterrupt.
constexpr auto kSignalPoll = std::chrono::milliseconds(20);

struct Outcome {
  CapturedRun run;
  std::map<std::string, std::optional<std::string>> outputs;
  std::string setup_error;  // an input or output that could not be registered
};

Outcome run_with_files(const std::vector<std::string>& args, const std::map<std::string, std::string>& inputs,
                       const std::vector<std::string>& outputs) {
  // Calls from several Python threads take turns: the in-memory names ("<snapshot dict>") are the
  // same for every call, and commands run one at a time in a process anyway.
  static std::mutex one_call_at_a_time;
  std::lock_guard lock(one_call_at_a_time);
  Outcome o;
  std::vector<memplan::ScopedMemoryInput> in;
  for (const auto& [name, bytes] : inputs) {
    auto made = memplan::ScopedMemoryInput::create(name, bytes);
    if (!made) {
      o.setup_error = made.error().message;
      return o;
    }
    in.push_back(std::move(made).value());
  }
  std::vector<memplan::ScopedMemoryOutput> out;
  for (const std::string& name : outputs) {
    auto made = memplan::ScopedMemoryOutput::create(name);
    if (!made) {
      o.setup_error = made.error().message;
      return o;
    }
    out.push_back(std::move(made).value());
  }
  o.run = memplan::tools::run_cli_captured(args);
  for (const memplan::ScopedMemoryOutput& m : out) o.outputs[m.name()] = m.bytes();
  return o;
}

py::dict run(const std::vector<std::string>& args, const std::map<std::string, py::bytes>& inputs,
             const std::vector<std::string>& outputs) {
  std::map<std::string, std::string> input_bytes;
  for (const auto& [name, bytes] : inputs) input_bytes[name] = std::string(bytes);
  bool interrupted = false;
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  Outcome o;
  {
    py::gil_scoped_release no_gil;
    memplan::clear_cancellation();
    std::future<Outcome> done =
        std::async(std::launch::async, [&] { return run_with_files(args, input_bytes, outputs); });
    while (done.wait_for(kSignalPoll) != std::future_status::ready) {
      if (interrupted) continue;
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {  // a signal handler raised (Ctrl-C: KeyboardInterrupt)
        PyErr_Fetch(&type, &value, &traceback);
        interrupted = true;
        memplan::request_cancellation();
      }
    }
    o = done.get();
    memplan::clear_cancellation();
  }
  if (interrupted) {
    PyErr_Restore(type, value, traceback);
    throw py::error_already_set();
  }
  if (!o.setup_error.empty()) throw py::value_error(o.setup_error);
  py::dict result;
  result["exit_code"] = o.run.exit_code;
  result["out"] = py::bytes(o.run.out).attr("decode")("utf-8", "replace");
  result["err"] = py::bytes(o.run.err).attr("decode")("utf-8", "replace");
  result["seconds"] = o.run.seconds;
  py::dict written;
  for (const auto& [name, bytes] : o.outputs) {
    if (bytes) written[py::str(name)] = py::bytes(*bytes);
    else written[py::str(name)] = py::none();
  }
  result["outputs"] = written;
  return result;
}

// Each option of a command: its long name (without --), whether it takes a value, and whether
// it takes several; positionals under their name.
std::vector<std::tuple<std::string, bool, bool>> command_options(const std::string& command) {
  memplan::tools::CliApp cli;
  const CLI::App* app = nullptr;
  for (const CLI::App* sub : cli.app().get_subcommands({})) {
    if (sub->get_name() == command) app = sub;
  }
  if (app == nullptr) throw py::value_error("no memplan command '" + command + "'");
  std::vector<std::tuple<std::string, bool, bool>> out;
  for (const CLI::Option* opt : app->get_options()) {
    const std::vector<std::string>& names = opt->get_lnames();
    const std::string name = !names.empty() ? names.front() : opt->get_name();  // a positional's own name
    if (name == "help" || name.empty()) continue;
    out.emplace_back(name, opt->get_expected_max() > 0, opt->get_expected_max() > 1);  // a flag expects none
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_memplan, m) {
  m.doc() = "memplan's native module: commands run in-process (use the memplan package, not this)";
  m.def("run", &run, py::arg("args"), py::arg("inputs"), py::arg("outputs"),
        "Runs a memplan command line in-process; returns exit_code, out, err, seconds and the outputs' bytes");
  m.def("command_options", &command_options, py::arg("command"));
  m.def(
      "parse_byte_size",
      [](const std::string& text) {
        auto bytes = memplan::parse_byte_size(text);
        if (!bytes) throw py::value_error(bytes.error().message);
        return bytes.value();
      },
      py::arg("text"), "Bytes in a size such as \"80GiB\", \"24GB\" or \"4096\"");
  m.attr("exit_usage") = memplan::tools::kExitUsage;
  m.attr("exit_failure") = memplan::tools::kExitFailure;
  m.attr("exit_cancelled") = memplan::tools::kExitCancelled;
}
