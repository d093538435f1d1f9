// The Python package's native half: runs a memplan command in-process (the CLI's own flags,
// validation, errors and JSON, inputs handed over and reports kept in memory: tools/cli_app.h).
// Calls from several Python threads take turns there. The GIL is released while the command runs, and
// Ctrl-C in Python stops it (common/cancellation.h) and raises KeyboardInterrupt.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memplan/common/byte_size.h"
#include "memplan/common/cancellation.h"
#include "tools/cli_app.h"
#include "tools/commands.h"

namespace py = pybind11;

namespace {

using memplan::tools::CapturedRun;

// How often the waiting Python thread looks for a pending KeyboardInterrupt.
constexpr auto kSignalPoll = std::chrono::milliseconds(20);

py::dict run(const std::vector<std::string>& args, const std::map<std::string, py::bytes>& inputs,
             const std::vector<std::string>& outputs) {
  std::map<std::string, std::string> input_bytes;
  for (const auto& [name, bytes] : inputs) input_bytes[name] = std::string(bytes);
  bool interrupted = false;
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  CapturedRun o;
  {
    py::gil_scoped_release no_gil;
    memplan::clear_cancellation();
    std::future<CapturedRun> done =
        std::async(std::launch::async, [&] { return memplan::tools::run_cli_captured(args, input_bytes, outputs); });
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
  py::dict result;
  result["exit_code"] = o.exit_code;
  result["out"] = py::bytes(o.out).attr("decode")("utf-8", "replace");
  result["err"] = py::bytes(o.err).attr("decode")("utf-8", "replace");
  result["seconds"] = o.seconds;
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
