// Runs the memplan binary from tests and captures its exit code and output.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memplan::testing {

// A sanitizer build (ASan + UBSan): tests that spend most of their time in many large plans or
// runs check a sample there, which runs the same code; the plain build checks them all.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout, then stderr when `merge_stderr`
};

// The exit status `timeout` gives a command it stopped (see mpirun below).
inline constexpr int kMpirunTimedOut = 124;

// Runs memplan with `env` (shell assignments such as "LD_DEBUG=libs", or empty) before it.
inline CliResult run_cli_with_env(const std::string& env, const std::string& args, bool merge_stderr = true) {
  const std::string cmd =
      env + " " + std::string(MEMPLAN_CLI_PATH) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  auto run = [&] {
    CliResult r;
    FILE* pipe = popen(cmd.c_str(), "r");
    if (pipe == nullptr) return r;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  CliResult r = run();
  // An Open MPI job that outlived its limit is run once more, saying so: on an oversubscribed
  // machine mpirun itself has been seen to hang (once in many CI runs, every rank's work done
  // in seconds elsewhere). A hang in memplan's own collectives repeats and still fails.
  if (r.exit_code == kMpirunTimedOut && env.find("mpirun") != std::string::npos) {
    std::fprintf(stderr, "note: mpirun did not finish in its time limit; running it once more: %s\n", cmd.c_str());
    r = run();
  }
  return r;
}

inline CliResult run_cli(const std::string& args, bool merge_stderr = true) {
  return run_cli_with_env("", args, merge_stderr);
}

// The `env` that runs memplan as `ranks` processes under Open MPI's mpirun as CI runs it: as root,
// oversubscribed, the sanitizer settings passed to every rank and Open MPI's own allocations kept
// out of the leak report (tests/lsan_mpi.supp; full unwinding, as the fast unwinder loses the
// stack inside Open MPI's libraries and no suppression can match).
// `limited`: the job runs under `timeout`, so a run that takes seconds (minutes under the
// sanitizers) and hangs fails after kMpirunLimitS instead of holding the suite until ctest's own
// limit. Callers that time the run themselves and signal mpirun directly pass false.
inline constexpr int kMpirunLimitS = 300;
inline std::string mpirun(int ranks, bool limited = true) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "LSAN_OPTIONS=suppressions=" MEMPLAN_TEST_SOURCE_DIR "/lsan_mpi.supp:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS} " +
         (limited ? "timeout -k 10 " + std::to_string(kMpirunLimitS) + " " : std::string()) +
         "mpirun -np " + std::to_string(ranks) +
         " --oversubscribe -x LSAN_OPTIONS -x ASAN_OPTIONS -x UBSAN_OPTIONS -x OMP_NUM_THREADS";
}

// A run of memplan as a child process, measured: its own peak resident size and wall time,
// killed when it outlives `timeout_s`. The peak is the child's VmHWM after its exec, read as it
// runs: wait4's ru_maxrss would count the test process's pages the forked child held before exec
// (the sanitizer build's test process alone is hundreds of MiB).
struct MeasuredRun {
  int exit_code = -1;      // -1: killed by a signal (a crash, or the timeout)
  bool timed_out = false;
  std::string output;      // stdout and stderr together (the first MiB)
  int term_signal = 0;      // the signal that ended it, if one did
  long peak_rss_kib = 0;
  double seconds = 0.0;
};

// A signal for a child run: sent once its output holds `after_output` (empty: at once) and
// `after_s` more seconds have passed. signal 0: none.
struct SignalPlan {
  int signal = 0;
  std::string after_output;
  double after_s = 0.0;
  // Called with the child's pid instead of sending it `signal` (to signal other processes).
  std::function<void(pid_t)> action;
  // When set, checked instead of after_output (a file the run writes, say).
  std::function<bool()> when;
};

// Runs `argv` (argv[0] the program's path) as a child process; see MeasuredRun.
// The high-water resident size of process `pid` (KiB), 0 when it cannot be read (it exited).
inline long vm_hwm_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

inline MeasuredRun run_measured(const std::vector<std::string>& argv_in, double timeout_s, const SignalPlan& plan = {}) {
  MeasuredRun r;
  int out[2];
  if (::pipe(out) != 0) return r;
  int exec_seen[2];  // closed in the child by its exec (O_CLOEXEC): its memory is its own from then on
  if (::pipe2(exec_seen, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(exec_seen[0]);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::close(out[1]);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    std::vector<char*> argv;
    for (const std::string& a : argv_in) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv.front(), argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(exec_seen[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(exec_seen[0]);
    return r;
  }
  {
    char byte = 0;
    while (::read(exec_seen[0], &byte, 1) < 0 && errno == EINTR) {
    }
    ::close(exec_seen[0]);
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  int status = 0;
  struct rusage usage {};
  bool reaped = false;
  bool signalled = plan.signal == 0;
  std::optional<std::chrono::steady_clock::time_point> seen;  // when after_output appeared
  auto drain = [&] {
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
      if (r.output.size() < (std::size_t{1} << 20)) r.output.append(buf, static_cast<std::size_t>(n));
    }
  };
  while (!reaped) {
    struct pollfd p {out[0], POLLIN, 0};
    ::poll(&p, 1, 5);
    drain();
    r.peak_rss_kib = std::max(r.peak_rss_kib, vm_hwm_kib(pid));
    reaped = ::wait4(pid, &status, WNOHANG, &usage) == pid;
    const auto now = std::chrono::steady_clock::now();
    if (!reaped && !signalled) {
      const bool ready = plan.when ? plan.when() : r.output.find(plan.after_output) != std::string::npos;
      if (!seen && ready) seen = now;
      if (seen && std::chrono::duration<double>(now - *seen).count() >= plan.after_s) {
        if (plan.action) {
          plan.action(pid);
        } else {
          ::kill(pid, plan.signal);
        }
        signalled = true;
      }
    }
    const double elapsed = std::chrono::duration<double>(now - start).count();
    if (!reaped && elapsed > timeout_s) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      reaped = ::wait4(pid, &status, 0, &usage) == pid;
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  drain();
  ::close(out[0]);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return r;
}

inline MeasuredRun run_cli_measured(const std::vector<std::string>& args, double timeout_s, const SignalPlan& plan = {}) {
  std::vector<std::string> argv = {MEMPLAN_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_measured(argv, timeout_s, plan);
}

}  // namespace memplan::testing
