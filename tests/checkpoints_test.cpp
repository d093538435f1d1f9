// train --save-dir: periodic checkpoints and exact resume, tried as clusters treat jobs: killed
// (SIGKILL) at random moments, preempted (SIGTERM), the newest checkpoint truncated or
// bit-flipped, the disk full, several ranks under ZeRO-2, a rank dying.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "memplan/train/checkpoints.h"
#include "memplan/train/stop_signals.h"
#include "cli_util.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("memplan_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// A GPT small enough for a few hundred steps a second, with dropout (a random stream) and a
// cosine schedule (the step's position in the run), both of which a resume must continue.
std::vector<std::string> gpt_run(const std::string& extra) {
  std::vector<std::string> args = {"train", "--model", "gpt", "--layers", "2", "--width", "32", "--heads", "2", "--seq", "32",
                                   "--batch", "4", "--dropout", "0.1", "--lr-schedule", "cosine", "--eval-samples", "0",
                                   "--threads", "1", "--json"};
  std::istringstream more(extra);
  for (std::string word; more >> word;) args.push_back(word);
  return args;
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// `args` with `flag` set to `value` (replaced where it is given, else added).
std::vector<std::string> set_flag(std::vector<std::string> args, const std::string& flag, const std::string& value) {
  auto at = std::find(args.begin(), args.end(), flag);
  if (at == args.end()) return with(args, {flag, value});
  *(at + 1) = value;
  return args;
}

// The "params_sha256" of a --json report in `output`, or "" when there is none.
std::string params_sha(const std::string& output) {
  const std::string key = "\"params_sha256\": \"";
  const auto at = output.find(key);
  return at == std::string::npos ? "" : output.substr(at + key.size(), 64);
}

std::string reference_sha(const std::vector<std::string>& args) {
  const testing::MeasuredRun r = testing::run_cli_measured(args, 300.0);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return params_sha(r.output);
}

// The integer after "key": in a JSON text, or -1.
long long json_number(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size() + 4);
}

// Complete checkpoint folders (with a manifest) in `dir`, oldest first.
std::vector<std::string> complete_checkpoints(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (fs::exists(e.path() / train::kManifestName)) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path shard_of(const fs::path& checkpoint) { return checkpoint / train::shard_name(0, 1); }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The first SIGTERM or SIGINT is recorded for the loop; a second ends the process at once with
// 128 + the signal; the handlers go when the StopSignals does.
TEST(Checkpoints, TheFirstSignalIsRecordedAndTheSecondExitsAtOnce) {
  for (int signal : {SIGTERM, SIGINT}) {
    const pid_t child = ::fork();
    if (child == 0) {
      {
        train::StopSignals installed;
        ::raise(signal);
        if (train::StopSignals::received() != signal) ::_exit(1);
        ::raise(signal);  // does not return
      }
      ::_exit(2);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 128 + signal) << train::signal_name(signal);
  }
  const pid_t child = ::fork();
  if (child == 0) {
    { train::StopSignals installed; }
    ::raise(SIGTERM);  // the default action again: killed by the signal
    ::_exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
}

struct KillCase {
  const char* name;
  const char* flags;
};

class KilledRun : public ::testing::TestWithParam<KillCase> {};

// Killed with SIGKILL at random moments (during setup, a step or a save) and restarted each time,
// the run ends with the parameters of the run never stopped, bit for bit.
TEST_P(KilledRun, EndsAsTheRunNeverStopped) {
  // Under the sanitizers (each run there is 5-10x slower) two of the four cover their code: fp32
  // (the plain save and resume) and bf16 with recomputation (16-bit state, the loss scaler,
  // rewritten graphs). Every case runs in the normal build.
  const std::string name = GetParam().name;
  if (testing::kSanitized && name != "fp32" && name != "bf16_recompute") {
    GTEST_SKIP() << "under the sanitizers only fp32 and bf16_recompute run; the normal build runs " << name;
  }
  const std::vector<std::string> run = gpt_run(std::string("--steps 150 ") + GetParam().flags);
  const std::string expected = reference_sha(run);
  ASSERT_EQ(expected.size(), 64u);
  const fs::path dir = fresh_dir(GetParam().name);
  const std::vector<std::string> saving = with(run, {"--save-dir", dir.string(), "--save-every", "7"});
  std::mt19937 random(20261206);
  int resumed = 0, killed = 0;
  const int kills = testing::kSanitized ? 1 : 4;
  for (int attempt = 0; attempt < kills; ++attempt) {
    // A random moment within ~40 steps after the first step (after a first checkpoint, the first
    // time, so that some restart has one to resume whatever the machine's speed).
    const double after = std::uniform_real_distribution<double>(0.0, testing::kSanitized ? 2.0 : 0.3)(random);
    const testing::MeasuredRun r =
        testing::run_cli_measured(saving, 300.0, {SIGKILL, attempt == 0 ? "saved checkpoint" : "loss ", after});
    resumed += r.output.find("resuming from") != std::string::npos;
    if (r.term_signal == SIGKILL) ++killed;
    ASSERT_FALSE(r.timed_out) << r.output;
  }
  const testing::MeasuredRun last = testing::run_cli_measured(saving, 300.0);
  ASSERT_EQ(last.exit_code, 0) << last.output;
  resumed += last.output.find("resuming from") != std::string::npos;
  EXPECT_GE(killed, 1) << "no run was killed: the kill came too late to test anything";
  EXPECT_GE(resumed, 1) << "no run resumed from a checkpoint";
  EXPECT_EQ(params_sha(last.output), expected) << last.output;
  EXPECT_LE(complete_checkpoints(dir).size(), 2u) << "--keep 2 by default";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, KilledRun,
                         ::testing::Values(KillCase{"fp32", ""}, KillCase{"bf16", "--dtype bf16"},
                                           KillCase{"fp32_recompute", "--checkpoint sqrt"},
                                           KillCase{"bf16_recompute", "--dtype bf16 --checkpoint sqrt"}),
                         [](const auto& test) { return std::string(test.param.name); });

// SIGTERM (a scheduler's preemption) finishes the step, saves and exits with 143; the same
// command then ends as the run never stopped.
TEST(Checkpoints, SigtermSavesAndExits143AndTheRestartIsEqual) {
  const std::vector<std::string> run = gpt_run("--steps 400");
  const std::string expected = reference_sha(run);
  const fs::path dir = fresh_dir("sigterm");
  const std::vector<std::string> saving = with(run, {"--save-dir", dir.string(), "--save-every", "50"});
  const testing::MeasuredRun stopped = testing::run_cli_measured(saving, 300.0, {SIGTERM, "saved checkpoint", 0.0});
  ASSERT_EQ(stopped.exit_code, 143) << stopped.output;
  EXPECT_NE(stopped.output.find("stopped by SIGTERM after step"), std::string::npos) << stopped.output;
  EXPECT_EQ(params_sha(stopped.output), "") << "an interrupted run prints no report";
  const std::vector<std::string> saved = complete_checkpoints(dir);
  ASSERT_FALSE(saved.empty());
  // The step it stopped after is the newest checkpoint, whether or not --save-every falls on it.
  const auto after = stopped.output.find("stopped by SIGTERM after step ");
  ASSERT_NE(after, std::string::npos);
  const std::int64_t step = std::atoll(stopped.output.c_str() + after + std::string("stopped by SIGTERM after step ").size());
  EXPECT_LT(step, 400);
  EXPECT_EQ(saved.back(), train::checkpoint_name(step));

  const testing::MeasuredRun resumed = testing::run_cli_measured(saving, 300.0);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + (dir / saved.back()).string()), std::string::npos) << resumed.output;
  EXPECT_EQ(params_sha(resumed.output), expected);
  fs::remove_all(dir);
}

// The newest checkpoint damaged (truncated, a bit flipped, its manifest gone): it is skipped,
// saying so, for the one before, and the run still ends equal.
TEST(Checkpoints, ADamagedNewestCheckpointIsSkippedForThePreviousOne) {
  const std::vector<std::string> run = gpt_run("--steps 20");
  const std::string expected = reference_sha(run);
  const fs::path dir = fresh_dir("damaged");
  const std::vector<std::string> saving = with(run, {"--save-dir", dir.string(), "--save-every", "5"});
  ASSERT_EQ(testing::run_cli_measured(saving, 300.0).exit_code, 0);
  ASSERT_EQ(complete_checkpoints(dir), (std::vector<std::string>{train::checkpoint_name(15), train::checkpoint_name(20)}));
  const fs::path newest = dir / train::checkpoint_name(20);
  const std::string good = read_file(shard_of(newest));
  const std::string manifest = read_file(newest / train::kManifestName);

  struct Damage {
    const char* what;
    std::function<void()> apply;
    const char* says;
  };
  const Damage damages[] = {
      {"truncated", [&] { write_file(shard_of(newest), good.substr(0, good.size() / 2)); }, "truncated"},
      {"bit flipped", [&] {
         std::string bad = good;
         bad[bad.size() - 100] = static_cast<char>(bad[bad.size() - 100] ^ 0x10);
         write_file(shard_of(newest), bad);
       }, "corrupted"},
      {"manifest gone", [&] { fs::remove(newest / train::kManifestName); }, "manifest"},
      // A manifest naming a file outside its folder is refused as such, before it is opened.
      {"shard outside the folder", [&] {
         const std::string shard = shard_of(newest).filename().string();
         std::string bad = manifest;
         bad.replace(bad.find("\"" + shard + "\""), shard.size() + 2, "\"../../../etc/passwd\"");
         write_file(newest / train::kManifestName, bad);
       }, "the manifest names shard '../../../etc/passwd', which is not a file of the checkpoint's folder"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    d.apply();
    const testing::MeasuredRun r = testing::run_cli_measured(saving, 300.0);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("skipping checkpoint " + newest.string()), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(d.says), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("resuming from " + (dir / train::checkpoint_name(15)).string()), std::string::npos) << r.output;
    EXPECT_EQ(params_sha(r.output), expected);
    // The rerun saved step 20 again; put the damage back on a fresh copy for the next case.
    write_file(shard_of(newest), good);
    write_file(newest / train::kManifestName, manifest);
  }
  fs::remove_all(dir);
}

// fit counts the host memory train's snapshot takes, to the byte (fp32 and bf16, with and
// without Adam's state).
TEST(Checkpoints, FitCountsTheHostSnapshotTrainTakes) {
  const fs::path dir = fresh_dir("fit");
  for (const std::string model : {"--model gpt --seq 32 --batch 4",
                                  "--model cnn --dtype bf16 --batch 8", "--model mlp --hidden 64 --optimizer sgd --batch 8"}) {
    SCOPED_TRACE(model);
    fs::remove_all(dir);
    const testing::CliResult trained = testing::run_cli("train " + model + " --steps 1 --eval-samples 0 --threads 1 --json "
                                                        "--save-dir " + dir.string(), false);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const testing::CliResult fit = testing::run_cli("fit " + model + " --device cpu --device-memory 1GiB --json", false);
    ASSERT_EQ(fit.exit_code, 0) << fit.output;
    const long long snapshot = json_number(trained.output, "snapshot_host_bytes");
    EXPECT_GT(snapshot, 0);
    EXPECT_EQ(json_number(fit.output, "host_snapshot_bytes"), snapshot);
    // The snapshot is the shard's tensors: the file is that and its header.
    const auto shard = static_cast<long long>(fs::file_size(shard_of(dir / train::checkpoint_name(1))));
    EXPECT_GT(shard, snapshot);
    EXPECT_LT(shard, snapshot + 65536);
  }
  fs::remove_all(dir);
}

// A checkpoint of other flags would not continue this run: refused, naming the flag.
TEST(Checkpoints, OtherFlagsAreRefusedNamingTheFlag) {
  const fs::path dir = fresh_dir("flags");
  const std::vector<std::string> run = gpt_run("--steps 6");
  const std::vector<std::string> saving = with(run, {"--save-dir", dir.string(), "--save-every", "3"});
  ASSERT_EQ(testing::run_cli_measured(saving, 300.0).exit_code, 0);
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--batch", "8"}, {"--dtype", "bf16"}, {"--seed", "3"}, {"--lr", "0.01"}}) {
    const testing::MeasuredRun r = testing::run_cli_measured(set_flag(saving, flag, value), 300.0);
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find("and this run has " + flag + " "), std::string::npos) << r.output;
  }
  const testing::MeasuredRun load = testing::run_cli_measured(with(saving, {"--load", shard_of(dir / train::checkpoint_name(6)).string()}), 300.0);
  EXPECT_EQ(load.exit_code, 2) << load.output;
  EXPECT_NE(load.output.find("--load"), std::string::npos) << load.output;
  fs::remove_all(dir);
}

// The disk fills up during the third save: the save fails naming the path and the reason, the
// second checkpoint stays the newest and loads, nothing half-written counts; with
// --on-save-error continue the run goes on.
TEST(Checkpoints, ADiskFullKeepsThePreviousCheckpointLoadable) {
  const std::vector<std::string> run = gpt_run("--steps 12");
  const std::string expected = reference_sha(run);
  const fs::path probe = fresh_dir("disk_probe");
  ASSERT_EQ(testing::run_cli_measured(with(run, {"--save-dir", probe.string(), "--save-every", "4"}), 300.0).exit_code, 0);
  const auto shard = static_cast<long long>(fs::file_size(shard_of(probe / train::checkpoint_name(12))));
  const auto manifest = static_cast<long long>(fs::file_size(probe / train::checkpoint_name(12) / train::kManifestName));
  fs::remove_all(probe);

  const fs::path dir = fresh_dir("disk_full");
  const std::vector<std::string> saving = with(run, {"--save-dir", dir.string(), "--save-every", "4"});
  const std::string room = std::to_string(2 * (shard + manifest) + shard / 2);  // two checkpoints and half a shard
  ::setenv("MEMPLAN_FAULT_DISK_FULL_AFTER_BYTES", room.c_str(), 1);
  const testing::MeasuredRun full = testing::run_cli_measured(saving, 300.0);
  const testing::MeasuredRun goes_on = testing::run_cli_measured(
      with(run, {"--save-dir", (dir.string() + "_continue"), "--save-every", "4", "--on-save-error", "continue"}), 300.0);
  ::unsetenv("MEMPLAN_FAULT_DISK_FULL_AFTER_BYTES");

  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_NE(full.output.find("cannot save the checkpoint of step 12"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find(dir.string() + "/" + train::checkpoint_name(12) + ".partial/" + train::shard_name(0, 1)),
            std::string::npos) << full.output;
  EXPECT_NE(full.output.find("No space left on device"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find((dir / train::checkpoint_name(8)).string() + ", is intact"), std::string::npos) << full.output;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{train::checkpoint_name(4), train::checkpoint_name(8)})) << "a partial save was left";

  const testing::MeasuredRun resumed = testing::run_cli_measured(saving, 300.0);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + (dir / train::checkpoint_name(8)).string()), std::string::npos);
  EXPECT_EQ(params_sha(resumed.output), expected);

  EXPECT_EQ(goes_on.exit_code, 0) << goes_on.output;
  EXPECT_NE(goes_on.output.find("training goes on (--on-save-error continue)"), std::string::npos) << goes_on.output;
  EXPECT_EQ(params_sha(goes_on.output), expected);
  fs::remove_all(dir);
  fs::remove_all(dir.string() + "_continue");
}

// Sends `signal` to every memplan process whose command line names `marker` (the ranks of one
// run, not mpirun); returns how many it signalled.
int signal_memplan_processes(const std::string& marker, int signal) {
  int signalled = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.starts_with(std::string(MEMPLAN_CLI_PATH) + " ") && cmdline.find(marker) != std::string::npos) {
      signalled += ::kill(static_cast<pid_t>(std::stol(pid)), signal) == 0;
    }
  }
  return signalled;
}

// The same command as `ranks` processes under mpirun, through a shell that execs mpirun (so a
// signal reaches mpirun itself), with `last_rank_env` set for the last rank only when given.
std::vector<std::string> under_mpirun(int ranks, const std::vector<std::string>& args, const std::string& last_rank_env = "") {
  std::string command;
  for (const std::string& a : args) command += " " + a;
  const std::string cli = std::string(MEMPLAN_CLI_PATH) + command;
  std::string line = testing::mpirun(last_rank_env.empty() ? ranks : ranks - 1, /*limited=*/false) + " " + cli;
  line.replace(line.find(" mpirun "), 8, " exec mpirun ");
  if (!last_rank_env.empty()) line += " : -np 1 -x " + last_rank_env + " " + cli;
  return {"/bin/sh", "-c", line};
}

// Two ranks under ZeRO-2 (gradients and optimizer state sharded, each rank saving its shard):
// preempted by SIGTERM to mpirun, they stop after the same step and save; a rank killed in the
// middle of a save makes mpirun end the job naming it, without hanging; every restart ends as
// the run never stopped, and a different world size is refused.
TEST(Checkpoints, TwoRanksUnderZero2StopKillAndResumeExactly) {
  // Long enough for the signal to land well before the end (under ASan the steps are slower).
  const std::string steps = testing::kSanitized ? "250" : "1500";
  const std::vector<std::string> run = gpt_run("--steps " + steps + " --zero 2");
  const testing::MeasuredRun reference = testing::run_measured(under_mpirun(2, run), 300.0);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::string expected = params_sha(reference.output);
  ASSERT_EQ(expected.size(), 64u);
  const fs::path dir = fresh_dir("zero2");
  const std::vector<std::string> saving = with(run, {"--save-dir", dir.string(), "--save-every", "10"});

  // SIGTERM to every rank once the first checkpoint is complete, as a scheduler preempting the
  // job sends it (Open MPI's mpirun would forward one it got, but kills the ranks a second later,
  // too soon under ASan): they agree on the step to stop after, save it and stop well before the
  // end.
  testing::SignalPlan preempt;
  preempt.signal = SIGTERM;
  preempt.when = [&] { return fs::exists(dir / train::checkpoint_name(10) / train::kManifestName); };
  preempt.action = [&](pid_t) { EXPECT_EQ(signal_memplan_processes(dir.string(), SIGTERM), 2) << "not both ranks were found"; };
  const testing::MeasuredRun stopped = testing::run_measured(under_mpirun(2, saving), 300.0, preempt);
  EXPECT_FALSE(stopped.timed_out);
  EXPECT_NE(stopped.exit_code, 0) << stopped.output;
  ASSERT_FALSE(complete_checkpoints(dir).empty());
  const std::string newest = complete_checkpoints(dir).back();
  EXPECT_LT(newest, train::checkpoint_name(std::stoll(steps))) << "the run did not stop";
  EXPECT_TRUE(fs::exists(dir / newest / train::shard_name(1, 2)));

  // Rank 1 dies (SIGKILL) halfway through writing its first shard after the restart.
  const auto shard = static_cast<long long>(fs::file_size(dir / newest / train::shard_name(1, 2)));
  const testing::MeasuredRun killed = testing::run_measured(
      under_mpirun(2, saving, "MEMPLAN_FAULT_KILL_AFTER_BYTES=" + std::to_string(shard / 2)), 120.0);
  EXPECT_FALSE(killed.timed_out) << "the surviving rank hung";
  EXPECT_NE(killed.exit_code, 0);
  EXPECT_NE(killed.output.find("rank 1"), std::string::npos) << killed.output;
  EXPECT_EQ(complete_checkpoints(dir).back(), newest) << "a save a rank died in counts as complete";

  const testing::MeasuredRun one = testing::run_cli_measured(saving, 300.0);
  EXPECT_EQ(one.exit_code, 2) << one.output;
  EXPECT_NE(one.output.find("mpirun -np 2"), std::string::npos) << one.output;

  const testing::MeasuredRun resumed = testing::run_measured(under_mpirun(2, saving), 300.0);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_EQ(params_sha(resumed.output), expected);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memplan
