// Periodic checkpoints of a training run (train --save-dir DIR --save-every N), and resuming
// from the newest one that is complete.
//
// DIR holds one folder per checkpoint, named by the steps done:
//
//   DIR/step-000000050/rank-00000-of-00002.safetensors   every rank's persistent state (its shard
//   DIR/step-000000050/rank-00001-of-00002.safetensors   under ZeRO), the step, the loss scaler
//   DIR/step-000000050/manifest.json                      written last, by rank 0
//
// A save is written into DIR/step-N.partial: each rank writes its shard (temporary file, fsync,
// rename); once every rank's shard is on disk, rank 0 writes the manifest (each shard's size and
// SHA-256, the run's flags) and renames the folder to DIR/step-N, then fsyncs DIR. A folder
// counts as a checkpoint only under its final name with a manifest whose shards check out, so a
// kill at any moment leaves the previous checkpoint as the newest complete one. The newest
// `keep` are kept.
//
// Saving overlaps training: between steps each rank copies its state into host memory (one
// shard's bytes: the snapshot, which lives outside the arena) and a thread writes it while the
// next steps run. The data order, dropout masks and learning-rate schedule follow from the
// step count, so the step is all the run's position a checkpoint needs besides the tensors.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memplan/common/byte_size.h"
#include "memplan/common/result.h"
#include "memplan/dist/communicator.h"
#include "memplan/runtime/executor.h"
#include "memplan/runtime/weights.h"

namespace memplan::train {

inline constexpr std::int64_t kDefaultSaveEvery = 500;
inline constexpr int kDefaultKeep = 2;

struct CheckpointOptions {
  std::string dir;            // empty: no periodic checkpoints
  std::int64_t every = kDefaultSaveEvery;  // steps between checkpoints; one is also saved at the end
  int keep = kDefaultKeep;    // the newest complete checkpoints kept (at least 1)
  bool continue_on_error = false;  // a failed save is reported and training goes on
};

// The flags a checkpoint must share with the run that resumes it, as (flag, value) pairs.
using RunIdentity = std::vector<std::pair<std::string, std::string>>;

inline constexpr const char* kManifestName = "manifest.json";
std::string checkpoint_name(std::int64_t step);  // "step-000000050"
std::string shard_name(int rank, int world);     // "rank-00000-of-00002.safetensors"

// The checkpoint a run resumes from, with this rank's shard read and checked.
struct ResumePoint {
  std::string dir;
  std::int64_t step = 0;
  std::string shard_path;
  runtime::WeightsFile shard;
};
struct ResumeSearch {
  std::optional<ResumePoint> found;  // none: no complete checkpoint (a fresh run)
  std::vector<std::string> skipped;  // newer checkpoints passed over, each with the reason
};

// The newest checkpoint in `dir` whose manifest reads and whose every shard has the size and
// SHA-256 the manifest gives (each rank checks its own; all ranks agree). A checkpoint of
// another world size or other flags is an Error naming the flag: resuming it would not continue
// this run. A collective when `comm` has several ranks.
Result<ResumeSearch> find_resume_point(const std::string& dir, const RunIdentity& identity, dist::Communicator& comm);

// What a shard file must be: its size, the SHA-256 of its header (the safetensors length word
// and JSON, which hold the data's SHA-256) and of its data. Hashing the data once, where the file
// is encoded, keeps the writer's work alongside training small.
struct ShardDigest {
  Bytes bytes = 0;
  std::string header_sha256, data_sha256;
};

// One committed save.
struct SaveRecord {
  std::int64_t step = 0;
  std::string dir;
  Bytes bytes = 0;               // this rank's shard
  double snapshot_seconds = 0;   // copying the state into host memory, between steps
  double write_seconds = 0;      // writing it out (overlapping the steps that followed)
};

class Checkpointer {
 public:
  Checkpointer(CheckpointOptions options, RunIdentity identity, std::int64_t total_steps, dist::Communicator& comm);
  ~Checkpointer();  // waits for a write in flight; uncommitted, it stays a .partial folder
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Creates the folder and removes what interrupted saves left (.partial folders). Collective.
  Status prepare();
  // After step `done` (1-based) of the run: commits a save whose shards are all written, starts a
  // save when `done` is a multiple of options.every, and agrees with the other ranks on stopping.
  // Returns whether any rank asked to stop (`stop_requested`: a signal). Collective every step
  // when there are several ranks. An Error: a save failed (unless continue_on_error).
  Result<bool> after_step(const runtime::Executor& executor, std::int64_t done, bool stop_requested);
  // Saves at `step` (unless the newest save is of that step) and waits until it is committed.
  // Collective.
  Status save_and_wait(const runtime::Executor& executor, std::int64_t step);

  // Whether `mine` holds on any rank (a collective with several ranks).
  bool any_rank(bool mine);
  // The run resumed from the checkpoint of `step`: it is not saved again.
  void resumed_at(std::int64_t step) { last_step_ = step; }

  const std::vector<SaveRecord>& saved() const { return saved_; }
  Bytes snapshot_bytes() const { return snapshot_bytes_; }  // the largest snapshot held
  // Saves and failures as they happen (rank 0's caller shows them).
  std::function<void(const std::string&)> note;

 private:
  enum WriteState : std::int64_t { kIdle = 0, kWriting = 1, kWritten = 2, kFailed = 3 };
  Status start(const runtime::Executor& executor, std::int64_t step);
  // Waits for the write in flight (when `wait`), then, once every rank's is written, commits it.
  Status settle(bool wait);
  Status commit();
  Status fail(const std::string& why);
  void prune() const;
  std::string partial_dir(std::int64_t step) const;

  CheckpointOptions options_;
  RunIdentity identity_;
  std::int64_t total_steps_ = 0;
  dist::Communicator& comm_;
  std::thread writer_;
  std::atomic<std::int64_t> state_{kIdle};
  std::string write_error_;  // set by the writer before state_ becomes kFailed
  ShardDigest digest_;       // set by the writer before state_ becomes kWritten
  bool pending_ = false;     // a save started and not yet committed or failed
  SaveRecord current_;
  runtime::WeightsSnapshot snapshot_;  // the writer's while a save is pending; reused by the next
  std::vector<ShardDigest> shards_;  // every rank's, for the manifest
  std::int64_t last_step_ = -1;  // the newest save started
  std::vector<SaveRecord> saved_;
  Bytes snapshot_bytes_ = 0;
};

}  // namespace memplan::train
