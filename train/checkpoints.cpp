#include "memplan/train/checkpoints.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memplan/common/atomic_file.h"
#include "memplan/common/input_file.h"
#include "memplan/common/sha256.h"

namespace memplan::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kFormat = "memplan checkpoint 1";
constexpr const char* kPartialSuffix = ".partial";
constexpr Bytes kMaxManifestBytes = Bytes{16} << 20;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every rank's `mine` (the same count on each), rank by rank; `mine` alone for one process.
std::vector<std::int64_t> gather(dist::Communicator& comm, const std::vector<std::int64_t>& mine) {
  const int world = comm.world_size();
  if (world == 1) return mine;
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(world));
  comm.all_gather_shards(mine.data(), all.data(), static_cast<std::int64_t>(all.size()), dist::ElementType::i64);
  return all;
}

// The step a checkpoint folder's name gives ("step-000000050" -> 50), or -1.
std::int64_t step_of(const std::string& name) {
  constexpr std::string_view prefix = "step-";
  if (!name.starts_with(prefix) || name.size() == prefix.size() || name.size() > prefix.size() + 18) return -1;
  std::int64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

// Complete-looking checkpoint folders (final name) in `dir`, newest first.
std::vector<std::pair<std::int64_t, fs::path>> checkpoint_folders(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t step = step_of(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec)) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// 32 hex digits of a SHA-256 as 4 int64 (for a gather) and back.
std::vector<std::int64_t> hex_words(const std::string& hex) {
  std::vector<std::int64_t> words;
  for (std::size_t i = 0; i < 64; i += 16) words.push_back(static_cast<std::int64_t>(std::stoull(hex.substr(i, 16), nullptr, 16)));
  return words;
}
std::string words_hex(const std::int64_t* words) {
  std::string hex;
  for (int i = 0; i < 4; ++i) {
    char part[17];
    std::snprintf(part, sizeof part, "%016llx", static_cast<unsigned long long>(words[i]));
    hex += part;
  }
  return hex;
}

struct Manifest {
  std::int64_t step = 0;
  int world = 0;
  RunIdentity flags;
  std::vector<std::pair<std::string, ShardDigest>> shards;  // file name, what it must be
};

Result<Manifest> read_manifest(const fs::path& folder) {
  auto bytes = read_regular_file((folder / kManifestName).string(), kMaxManifestBytes, "checkpoint manifest");
  if (!bytes) return bytes.error();
  Manifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(bytes.value());
    if (j.at("format").get<std::string>() != kFormat) return Error{"not a '" + std::string(kFormat) + "' manifest"};
    m.step = j.at("step").get<std::int64_t>();
    m.world = j.at("world").get<int>();
    for (const auto& [flag, value] : j.at("flags").items()) m.flags.emplace_back(flag, value.get<std::string>());
    for (const auto& s : j.at("shards")) {
      m.shards.push_back({s.at("file").get<std::string>(), ShardDigest{s.at("bytes").get<Bytes>(),
                                                                       s.at("header_sha256").get<std::string>(),
                                                                       s.at("data_sha256").get<std::string>()}});
    }
  } catch (const nlohmann::json::exception& e) {
    return Error{"the manifest does not parse: " + std::string(e.what())};
  }
  if (m.world < 1 || static_cast<int>(m.shards.size()) != m.world) return Error{"the manifest lists the wrong number of shards"};
  // A shard is a file of the checkpoint's own folder: a name with a directory in it (or . or ..)
  // would open something else, so it is refused before anything is read.
  for (const auto& [file, digest] : m.shards) {
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
      return Error{"the manifest names shard '" + file + "', which is not a file of the checkpoint's folder"};
    }
  }
  return m;
}

// Why this run cannot continue the checkpoint `m` in `folder`, or nothing.
std::optional<std::string> identity_mismatch(const Manifest& m, const fs::path& folder, const RunIdentity& identity,
                                             int world) {
  const std::string where = folder.string();
  if (m.world != world) {
    return where + " was written by " + std::to_string(m.world) + " ranks and this run has " + std::to_string(world) +
           ": resume it with mpirun -np " + std::to_string(m.world) +
           " (memplan does not re-shard a checkpoint), or give another --save-dir to start afresh";
  }
  for (const auto& [flag, value] : identity) {
    auto it = std::find_if(m.flags.begin(), m.flags.end(), [&](const auto& f) { return f.first == flag; });
    const std::string saved = it == m.flags.end() ? "(not recorded)" : it->second;
    if (saved != value) {
      return where + " was saved by a run with " + flag + " " + saved + ", and this run has " + flag + " " + value +
             ": rerun with the checkpoint's " + flag + " to resume it, or give another --save-dir to start afresh";
    }
  }
  return std::nullopt;
}

// This rank's shard of `m`, read and checked against the manifest and its own data checksum.
Result<ResumePoint> read_shard(const Manifest& m, const fs::path& folder, int rank) {
  const auto& [file, expected] = m.shards[static_cast<std::size_t>(rank)];
  ResumePoint point;
  point.dir = folder.string();
  point.step = m.step;
  point.shard_path = (folder / file).string();
  auto bytes = read_regular_file(point.shard_path, runtime::kMaxWeightsFileBytes, "checkpoint shard");
  if (!bytes) return bytes.error();
  const std::string& got = bytes.value();
  if (static_cast<Bytes>(got.size()) != expected.bytes) {
    return Error{point.shard_path + " holds " + std::to_string(got.size()) + " bytes, the manifest says " +
                 std::to_string(expected.bytes) + " (truncated?)"};
  }
  // The header (which holds the data's SHA-256) as the manifest says; the data is checked
  // against it as the file is parsed.
  std::uint64_t header = 0;
  for (int i = 7; i >= 0 && got.size() >= 8; --i) header = (header << 8) | static_cast<unsigned char>(got[static_cast<std::size_t>(i)]);
  if (got.size() < 8 || header > got.size() - 8 || sha256_hex(got.data(), 8 + header) != expected.header_sha256) {
    return Error{point.shard_path + ": its header differs from the manifest's SHA-256 (corrupted)"};
  }
  auto parsed = runtime::parse_weights_file(std::move(bytes).value(), point.shard_path);
  if (!parsed) return parsed.error();
  point.shard = std::move(parsed).value();
  return point;
}

}  // namespace

std::string checkpoint_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%09lld", static_cast<long long>(step));
  return name;
}

std::string shard_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d-of-%05d.safetensors", rank, world);
  return name;
}

Result<ResumeSearch> find_resume_point(const std::string& dir, const RunIdentity& identity, dist::Communicator& comm) {
  ResumeSearch search;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return search;
  const int world = comm.world_size();
  for (const auto& [step, folder] : checkpoint_folders(dir)) {
    auto manifest = read_manifest(folder);
    // Every rank reads the same manifest, so they skip or refuse alike.
    if (!manifest) {
      search.skipped.push_back(folder.string() + ": " + manifest.error().message);
      continue;
    }
    if (manifest.value().step != step) {
      search.skipped.push_back(folder.string() + ": the manifest is of step " + std::to_string(manifest.value().step));
      continue;
    }
    if (auto why = identity_mismatch(manifest.value(), folder, identity, world)) return Error{*why};
    auto shard = read_shard(manifest.value(), folder, comm.rank());
    const std::vector<std::int64_t> ok = gather(comm, {shard ? 1 : 0});
    std::string bad;
    for (int r = 0; r < world; ++r) {
      if (ok[static_cast<std::size_t>(r)] == 0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    }
    if (bad.empty()) {
      search.found = std::move(shard).value();
      return search;
    }
    search.skipped.push_back(shard ? folder.string() + ": the shard of rank " + bad + " does not check out"
                                   : shard.error().message);
  }
  return search;
}

Checkpointer::Checkpointer(CheckpointOptions options, RunIdentity identity, std::int64_t total_steps,
                           dist::Communicator& comm)
    : options_(std::move(options)), identity_(std::move(identity)), total_steps_(total_steps), comm_(comm) {}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
}

std::string Checkpointer::partial_dir(std::int64_t step) const {
  return (fs::path(options_.dir) / (checkpoint_name(step) + kPartialSuffix)).string();
}

Status Checkpointer::prepare() {
  std::int64_t ok = 1;
  std::string why;
  if (comm_.rank() == 0) {
    std::error_code ec;
    fs::create_directories(options_.dir, ec);
    if (ec || !fs::is_directory(options_.dir)) {
      ok = 0;
      why = "--save-dir " + options_.dir + ": cannot create the folder: " + (ec ? ec.message() : "not a folder");
    }
    for (const fs::directory_entry& e : fs::directory_iterator(options_.dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(kPartialSuffix) && step_of(name.substr(0, name.size() - std::string_view(kPartialSuffix).size())) >= 0) fs::remove_all(e.path(), ec);
    }
  }
  const std::vector<std::int64_t> all = gather(comm_, {ok});
  if (all.front() == 0) return Error{why.empty() ? "--save-dir " + options_.dir + ": rank 0 cannot create the folder" : why};
  return Status::success();
}

Status Checkpointer::start(const runtime::Executor& executor, std::int64_t step) {
  const auto t0 = Clock::now();
  const std::string folder = partial_dir(step);
  const std::string path = (fs::path(folder) / shard_name(comm_.rank(), comm_.world_size())).string();
  // The writer is done with the previous snapshot (settled), so its memory is taken again.
  // What trains only: frozen parameters are the seed's again when the run resumes (its identity
  // records --seed and the fine-tuning flags), so a LoRA or QLoRA checkpoint is adapters and state.
  runtime::snapshot_weights(executor, {{"memplan.total_steps", std::to_string(total_steps_)}}, snapshot_, /*frozen=*/false);
  current_ = SaveRecord{step, (fs::path(options_.dir) / checkpoint_name(step)).string(), 0, 0.0, 0.0};
  snapshot_bytes_ = std::max(snapshot_bytes_, static_cast<Bytes>(snapshot_.data.size()));
  current_.snapshot_seconds = seconds_since(t0);
  last_step_ = step;
  pending_ = true;
  state_ = kWriting;
  // Hashing, encoding and writing happen on the writer, alongside the next steps.
  writer_ = std::thread([this, folder, path] {
    // The lowest priority: the writer takes the cores the training threads leave idle, rather
    // than slowing the steps (Linux gives each thread its own nice value).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
    const runtime::WeightsSnapshot& snapshot = snapshot_;
    const auto w0 = Clock::now();
    Status written = Status::success();
    auto header = runtime::weights_file_header(snapshot, path, &digest_.data_sha256);
    std::error_code ec;
    if (!header) {
      written = header.error();
    } else if (fs::create_directories(folder, ec); ec) {
      written = Error{folder + ": cannot create the folder: " + ec.message()};
    } else {
      const std::string_view pieces[] = {header.value(), snapshot.data};
      written = write_file_atomically(path, pieces);
      digest_.bytes = static_cast<Bytes>(header.value().size() + snapshot.data.size());
      digest_.header_sha256 = sha256_hex(header.value().data(), header.value().size());
      current_.bytes = digest_.bytes;
    }
    current_.write_seconds = seconds_since(w0);
    if (!written) {
      write_error_ = written.error().message;
      state_ = kFailed;
    } else {
      state_ = kWritten;
    }
  });
  return Status::success();
}

Status Checkpointer::settle(bool wait) {
  if (!pending_) return Status::success();
  if (wait && writer_.joinable()) writer_.join();
  // Every rank's state, and once written its shard's digest (for the manifest).
  constexpr std::size_t kWords = 10;  // state, size, 4 + 4 words of SHA-256
  const std::int64_t state = state_.load();
  std::vector<std::int64_t> mine(kWords, 0);
  mine[0] = state;
  if (state == kWritten) {
    mine[1] = digest_.bytes;
    const std::vector<std::int64_t> header = hex_words(digest_.header_sha256), data = hex_words(digest_.data_sha256);
    std::copy(header.begin(), header.end(), mine.begin() + 2);
    std::copy(data.begin(), data.end(), mine.begin() + 6);
  }
  const std::vector<std::int64_t> all = gather(comm_, mine);
  bool all_written = true;
  std::string failed;
  for (int r = 0; r < comm_.world_size(); ++r) {
    const std::int64_t s = all[kWords * static_cast<std::size_t>(r)];
    all_written = all_written && s == kWritten;
    if (s == kFailed) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (failed.empty() && !all_written) return Status::success();  // still writing somewhere
  if (writer_.joinable()) writer_.join();
  pending_ = false;
  if (!failed.empty()) {
    return fail(state == kFailed ? write_error_ : "rank " + failed + " could not write its shard");
  }
  shards_.clear();
  for (int r = 0; r < comm_.world_size(); ++r) {
    const std::int64_t* w = all.data() + kWords * static_cast<std::size_t>(r);
    shards_.push_back(ShardDigest{w[1], words_hex(w + 2), words_hex(w + 6)});
  }
  return commit();
}

Status Checkpointer::commit() {
  std::int64_t ok = 1;
  std::string why;
  if (comm_.rank() == 0) {
    nlohmann::ordered_json j;  // in the order written: the flags as the run lists them
    j["format"] = kFormat;
    j["step"] = current_.step;
    j["total_steps"] = total_steps_;
    j["world"] = comm_.world_size();
    j["flags"] = nlohmann::ordered_json::object();
    for (const auto& [flag, value] : identity_) j["flags"][flag] = value;
    j["shards"] = nlohmann::ordered_json::array();
    for (int r = 0; r < comm_.world_size(); ++r) {
      const ShardDigest& d = shards_[static_cast<std::size_t>(r)];
      j["shards"].push_back({{"file", shard_name(r, comm_.world_size())}, {"bytes", d.bytes},
                             {"header_sha256", d.header_sha256}, {"data_sha256", d.data_sha256}});
    }
    const std::string folder = partial_dir(current_.step);
    Status s = write_file_atomically((fs::path(folder) / kManifestName).string(), j.dump(2) + "\n");
    if (s) {
      std::error_code ec;
      fs::remove_all(current_.dir, ec);  // a checkpoint of the same step passed over as corrupt
      fs::rename(folder, current_.dir, ec);
      if (ec) s = Error{folder + ": cannot rename it to " + current_.dir + ": " + ec.message()};
      else sync_directory(options_.dir);
    }
    if (!s) {
      ok = 0;
      why = s.error().message;
    }
  }
  if (gather(comm_, {ok}).front() == 0) return fail(why.empty() ? "rank 0 could not write the manifest" : why);
  saved_.push_back(current_);
  if (note) {
    std::ostringstream line;
    line.precision(3);
    line << "saved checkpoint " << current_.dir << " (" << format_bytes(current_.bytes) << (comm_.world_size() > 1 ? " a rank" : "")
         << ": snapshot " << current_.snapshot_seconds * 1e3 << " ms between steps, written in " << current_.write_seconds * 1e3
         << " ms alongside training)";
    note(line.str());
  }
  if (comm_.rank() == 0) prune();
  return Status::success();
}

Status Checkpointer::fail(const std::string& why) {
  std::error_code ec;
  if (comm_.rank() == 0) fs::remove_all(partial_dir(current_.step), ec);
  std::string message = "cannot save the checkpoint of step " + std::to_string(current_.step) + ": " + why;
  message += saved_.empty() ? "" : "\nthe previous checkpoint, " + saved_.back().dir + ", is intact and loadable";
  if (!options_.continue_on_error) {
    return Error{message + "\ntraining stops (--on-save-error continue would go on without this checkpoint)"};
  }
  if (note) note(message + "; training goes on (--on-save-error continue)");
  return Status::success();
}

void Checkpointer::prune() const {
  std::vector<std::pair<std::int64_t, fs::path>> complete;
  for (auto& [step, folder] : checkpoint_folders(options_.dir)) {
    std::error_code ec;
    if (fs::exists(folder / kManifestName, ec)) complete.emplace_back(step, folder);
  }
  for (std::size_t i = static_cast<std::size_t>(std::max(options_.keep, 1)); i < complete.size(); ++i) {
    std::error_code ec;
    fs::remove_all(complete[i].second, ec);
  }
  sync_directory(options_.dir);
}

bool Checkpointer::any_rank(bool mine) {
  const std::vector<std::int64_t> all = gather(comm_, {mine ? 1 : 0});
  return std::any_of(all.begin(), all.end(), [](std::int64_t s) { return s != 0; });
}

Result<bool> Checkpointer::after_step(const runtime::Executor& executor, std::int64_t done, bool stop_requested) {
  const bool due = options_.every > 0 && done % options_.every == 0;
  // Stopping is agreed before anything else, so every rank leaves the loop after the same step.
  const bool stop = any_rank(stop_requested);
  // A save due now waits for the one in flight; otherwise a finished one is committed.
  if (Status s = settle(due); !s) return s.error();
  if (due && !stop) {
    if (Status s = start(executor, done); !s) return s.error();
  }
  return stop;
}

Status Checkpointer::save_and_wait(const runtime::Executor& executor, std::int64_t step) {
  if (Status s = settle(true); !s) return s;
  if (last_step_ == step) {
    // Resumed at the last step: nothing to save, but a run killed between a commit and its
    // pruning may have left one checkpoint too many (none newer than the one resumed is left).
    if (comm_.rank() == 0) prune();
    return Status::success();
  }
  if (Status s = start(executor, step); !s) return s;
  return settle(true);
}

}  // namespace memplan::train
