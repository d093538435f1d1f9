// memplan's CPU thread pool (see parallel.h). Each thread's run of a loop's chunks is one atomic
// word naming the loop (its generation) and the run's first and last chunk: the owner claims from
// the front, others from the back, and a thread that wakes late can never claim a chunk of a loop
// other than the one it read.
#include "memplan/kernels/cpu/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace memplan::kernels::cpu {
namespace {

// How long an idle worker spins for the next loop before it sleeps: a step's loops follow each
// other within tens of microseconds, and a futex wake-up costs about as much.
constexpr auto kWorkerSpin = std::chrono::microseconds(50);
// How long the caller spins for chunks other threads still run before it sleeps. Longer than a
// worker: a caller that sleeps and is woken on a core another process holds waits for that
// process's time slice (bench_model_step's MLP with two busy processes on the two cores: 56-344
// waits over 1 ms in 500 steps at 20 us, 2-3 at 200 us, mean step 1.6-3.5x against 2.2-2.5x its
// time alone).
constexpr auto kCallerSpin = std::chrono::microseconds(200);

// The time slice a worker asks for (see request_short_time_slice): the shortest Linux allows.
constexpr std::uint64_t kWorkerTimeSliceNs = 100'000;

using Clock = std::chrono::steady_clock;
// A caller's wait for other threads' chunks longer than this (and than twice its own work in the
// loop) is a stall: a thread was not running.
constexpr Clock::duration kStallMin = std::chrono::milliseconds(1);

void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until ready() or `limit` has passed; true when ready() held.
template <typename Ready>
bool spin_until(Ready ready, std::chrono::microseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (ready()) return true;
    spin_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > limit) return ready();
  }
}

// A run's word: generation (32 bits) | one past its last chunk (16) | its first chunk (16).
constexpr std::uint64_t run_word(std::uint32_t generation, std::uint64_t first, std::uint64_t last) {
  return (std::uint64_t{generation} << 32) | (last << 16) | first;
}
constexpr std::uint32_t generation_of(std::uint64_t word) { return static_cast<std::uint32_t>(word >> 32); }
constexpr std::uint32_t last_of(std::uint64_t word) { return static_cast<std::uint32_t>((word >> 16) & 0xffff); }
constexpr std::uint32_t first_of(std::uint64_t word) { return static_cast<std::uint32_t>(word & 0xffff); }
static_assert(kMaxChunks < (1 << 16));

// Asks the scheduler for a short time slice for the calling thread (a pool worker). On a core
// shared with other processes, Linux's EEVDF scheduler (6.12 and later) then runs a worker soon
// after it wakes and, should it be preempted holding a chunk, soon again, instead of after a busy
// process's full slice, for which the caller would wait (bench_model_step's MLP with two busy
// processes, three runs each, interleaved: mean step 1.8-2.3x its time alone with it, 2.1-2.6x
// without). Kernels that do not know the setting keep their default; other policies (a batch or
// real-time one the user chose) and the nice value are left as they are.
void request_short_time_slice() {
#if defined(__linux__) && defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
  struct SchedAttr {  // the kernel's struct sched_attr
    std::uint32_t size, policy;
    std::uint64_t flags;
    std::int32_t nice;
    std::uint32_t priority;
    std::uint64_t runtime, deadline, period;
    std::uint32_t util_min, util_max;
  } attr{};
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0 || attr.policy != SCHED_OTHER) return;
  attr.size = sizeof(attr);
  attr.flags = 0;
  attr.runtime = kWorkerTimeSliceNs;
  (void)syscall(SYS_sched_setattr, 0, &attr, 0);
#endif
}

// The slot of the chunk this thread is running, or -1 outside any chunk.
thread_local int t_slot = -1;

class Pool;
Pool& pool();

class Pool {
 public:
  Pool() {
    set_threads(default_parallel_threads());
    pthread_atfork(nullptr, nullptr, [] { pool().forget_workers_in_forked_child(); });
  }
  ~Pool() = delete;  // see pool()
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void set_threads(int threads) {
    std::lock_guard<std::mutex> hold(busy_);
    threads = std::max(1, threads);
    if (threads == threads_) return;
    stop_workers();
    threads_ = threads;
    runs_ = std::make_unique<Run[]>(static_cast<std::size_t>(threads));
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }

  // A forked child has only the thread that forked: the workers stayed in the parent. Their
  // std::thread objects name threads that are gone, so they can be neither joined nor destroyed;
  // they are kept aside, and the child's next loop across threads starts workers of its own. A
  // thread of the parent may have held busy_ for a loop, which no thread of the child will finish:
  // the lock starts afresh (start_workers resets the rest). Not from inside a chunk, whose loop
  // the child could not complete anyway (its other chunks ran in the parent): the pool is then
  // left as it was.
  void forget_workers_in_forked_child() {
    if (t_slot >= 0) return;
    for (std::thread& t : workers_) orphaned_.push_back(std::move(t));
    workers_.clear();
    new (&busy_) std::mutex;
    sleeping_.store(0);
  }

  ParallelStats stats() const {
    return {loops_across_threads_.load(std::memory_order_relaxed), stalls_.load(std::memory_order_relaxed)};
  }
  void reset_stats() {
    loops_across_threads_.store(0);
    stalls_.store(0);
  }

  void run(std::int64_t n, std::int64_t chunk, ChunkFn fn, void* ctx) {
    if (n <= 0) return;
    chunk = std::clamp<std::int64_t>(chunk, 1, n);
    if ((n + chunk - 1) / chunk > kMaxChunks) chunk = (n + kMaxChunks - 1) / kMaxChunks;
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    std::unique_lock<std::mutex> hold(busy_, std::defer_lock);
    if (threads_ <= 1 || chunks == 1 || t_slot >= 0 || !hold.try_lock()) {
      const int slot = std::max(t_slot, 0);
      for (std::int64_t begin = 0; begin < n; begin += chunk) fn(ctx, begin, std::min(n, begin + chunk), slot);
      return;
    }
    const int threads = threads_.load(std::memory_order_relaxed);
    if (static_cast<int>(workers_.size()) != threads - 1) start_workers();
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    chunk_ = chunk;
    done_.store(0, std::memory_order_relaxed);
    const std::uint32_t generation = posted_.load() + 1;
    loop_.store((std::uint64_t{generation} << 32) | static_cast<std::uint64_t>(chunks), std::memory_order_release);
    // Each slot starts with its own run of chunks, as a static schedule would give it, so that a
    // thread finds the rows it wrote in the loop before in its cache; the others take from its end.
    // With fewer chunks than threads, the first slots get one each.
    for (int s = 0; s < threads; ++s) {
      const std::int64_t first = chunks >= threads ? chunks * s / threads : std::min<std::int64_t>(s, chunks);
      const std::int64_t last = chunks >= threads ? chunks * (s + 1) / threads : std::min<std::int64_t>(s + 1, chunks);
      runs_[s].word.store(run_word(generation, static_cast<std::uint64_t>(first), static_cast<std::uint64_t>(last)),
                          std::memory_order_release);
    }
    posted_.store(generation);
    if (sleeping_.load() > 0) posted_.notify_all();
    const Clock::time_point start = Clock::now();
    run_claims(generation, 0);
    const Clock::time_point claimed = Clock::now();
    const auto total = static_cast<std::uint32_t>(chunks);
    const auto all_done = [&] { return done_.load(std::memory_order_acquire) == total; };
    if (!spin_until(all_done, kCallerSpin)) {
      for (std::uint32_t seen; (seen = done_.load(std::memory_order_acquire)) != total;) {
        done_.wait(seen, std::memory_order_acquire);
      }
    }
    const Clock::time_point end = Clock::now();
    loops_across_threads_.fetch_add(1, std::memory_order_relaxed);
    // A wait far longer than the caller's own share of the loop means a thread was not running
    // (the one holding the last chunk, or the caller once it slept): other processes share the
    // cores. Only counted: running the next loops on the caller alone measured slower than
    // keeping every thread on.
    if (end - claimed > kStallMin && end - claimed > 2 * (claimed - start)) {
      stalls_.fetch_add(1, std::memory_order_relaxed);
    }
  }

 private:
  // Claims a chunk of loop `generation` from run `s`: its first chunk when `own`, else its last.
  // -1 when the run is empty or belongs to another loop.
  std::int64_t claim(int s, std::uint32_t generation, bool own) {
    std::atomic<std::uint64_t>& w = runs_[s].word;
    std::uint64_t word = w.load(std::memory_order_acquire);
    for (;;) {
      if (generation_of(word) != generation || first_of(word) >= last_of(word)) return -1;
      const std::uint64_t claimed = own ? word + 1 : word - (std::uint64_t{1} << 16);
      if (w.compare_exchange_weak(word, claimed, std::memory_order_acq_rel, std::memory_order_acquire)) {
        return own ? first_of(word) : last_of(word) - 1;
      }
    }
  }

  // Runs chunks of loop `generation`, its own run's first, then the others' from their ends,
  // until none is left to claim.
  void run_claims(std::uint32_t generation, int slot) {
    // Slots stay below the chunk count (a late thread may read a newer loop's word: it leaves).
    const std::uint64_t loop = loop_.load(std::memory_order_acquire);
    const auto chunks = static_cast<std::uint32_t>(loop);
    if (generation_of(loop) != generation || static_cast<std::uint32_t>(slot) >= chunks) return;
    t_slot = slot;
    const int threads = threads_.load(std::memory_order_relaxed);
    for (int k = 0; k < threads; ++k) {
      const int s = (slot + k) % threads;
      for (std::int64_t i; (i = claim(s, generation, k == 0)) >= 0;) {
        // The loop's fields stay until its last chunk is done: read them before this one is.
        const std::int64_t begin = i * chunk_;
        fn_(ctx_, begin, std::min(n_, begin + chunk_), slot);
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_one();
      }
    }
    t_slot = -1;
  }

  void worker(int slot) {
    request_short_time_slice();
    started_.fetch_add(1);
    started_.notify_all();
    std::uint32_t seen = posted_.load();
    for (;;) {
      std::uint32_t posted = seen;
      const auto new_loop = [&] { return (posted = posted_.load()) != seen || stopping_.load(); };
      if (!spin_until(new_loop, kWorkerSpin)) {
        sleeping_.fetch_add(1);
        posted_.wait(seen);
        sleeping_.fetch_sub(1);
        continue;
      }
      if (stopping_.load()) return;
      seen = posted;
      run_claims(posted, slot);
    }
  }

  void start_workers() {
    stop_workers();
    stopping_.store(false);
    started_.store(0);
    for (int slot = 1; slot < threads_; ++slot) workers_.emplace_back([this, slot] { worker(slot); });
    // Returns once every worker waits for loops, so no thread is still starting when the loop
    // that started them returns. A process may fork between loops then: a thread's start takes
    // allocator locks in some runtimes (AddressSanitizer's, which has no fork handler to release
    // them), and a child forked in the middle of it would deadlock in its first allocation.
    for (int n; (n = started_.load()) != threads_ - 1;) started_.wait(n);
  }

  void stop_workers() {
    if (workers_.empty()) return;
    stopping_.store(true);
    posted_.fetch_add(1);
    posted_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex busy_;  // held by the thread whose loop the pool runs
  std::atomic<int> threads_{1};  // changed only while busy_ is held
  std::vector<std::thread> workers_;
  std::vector<std::thread> orphaned_;  // a forked child's: the parent's workers (see above)

  // The loop being run: written before its claim word is published, read after a claim.
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t n_ = 0, chunk_ = 1;

  struct Run {
    alignas(64) std::atomic<std::uint64_t> word{0};
  };
  std::unique_ptr<Run[]> runs_ = std::make_unique<Run[]>(1);  // one per slot
  std::atomic<std::uint64_t> loop_{0};  // the current loop's generation (high half) and chunk count
  std::atomic<std::uint32_t> done_{0};     // chunks of the current loop finished
  std::atomic<std::uint32_t> posted_{0};   // the newest loop's generation (workers wait on it)
  std::atomic<int> sleeping_{0};           // workers asleep in posted_.wait
  std::atomic<int> started_{0};            // workers that reached their loop
  std::atomic<bool> stopping_{false};

  std::atomic<std::int64_t> loops_across_threads_{0}, stalls_{0};
};

// Never destroyed: at exit the workers simply end with the process, so no exit path joins them,
// not a thread's exit while another runs a loop, nor a forked child's (its orphaned_ workers).
Pool& pool() {
  static Pool* const p = new Pool;
  return *p;
}

}  // namespace

void parallel_chunks(std::int64_t n, std::int64_t chunk, ChunkFn fn, void* ctx) { pool().run(n, chunk, fn, ctx); }

int parallel_threads() { return pool().threads(); }

ParallelStats parallel_stats() { return pool().stats(); }

void reset_parallel_stats() { pool().reset_stats(); }

int default_parallel_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && n > 0 && n <= 4096) return static_cast<int>(n);
  }
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return std::max(1u, std::thread::hardware_concurrency());
}

void set_parallel_threads(int threads) { pool().set_threads(threads); }

}  // namespace memplan::kernels::cpu
