// Runs the memplan binary from tests and captures its exit code and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <string>

namespace memplan::testing {

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout, then stderr when `merge_stderr`
};

// Runs memplan with `env` (shell assignments such as "LD_DEBUG=libs", or empty) before it.
inline CliResult run_cli_with_env(const std::string& env, const std::string& args, bool merge_stderr = true) {
  const std::string cmd =
      env + " " + std::string(MEMPLAN_CLI_PATH) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CliResult run_cli(const std::string& args, bool merge_stderr = true) {
  return run_cli_with_env("", args, merge_stderr);
}

}  // namespace memplan::testing
