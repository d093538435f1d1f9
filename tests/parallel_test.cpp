// memplan's CPU thread pool (kernels/cpu/parallel.h): every index of a loop runs exactly once,
// a chunk's slot is never shared by two chunks running at once and stays below the slot and
// chunk counts, loops nested in a chunk and loops from a second thread run on their caller, and a
// caller waiting on a thread that holds a chunk without running (as a preempted one does) counts
// a stall, and a child forked after the workers started runs loops on workers of its own and exits.
#include "memplan/kernels/cpu/parallel.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "memplan/kernels/kernel.h"

namespace memplan::kernels::cpu {
namespace {

// Restores the thread count a test changed.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : before_(cpu_threads()) { set_cpu_threads(threads); }
  ~ThreadCount() { set_cpu_threads(before_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int before_;
};

TEST(ParallelPool, SetCpuThreadsSetsThePoolsCount) {
  ThreadCount keep(1);
  EXPECT_EQ(cpu_threads(), 1);
  EXPECT_EQ(parallel_threads(), 1);
  set_cpu_threads(3);
  EXPECT_EQ(cpu_threads(), 3);
  EXPECT_EQ(parallel_threads(), 3);
  set_cpu_threads(0);  // the default
  EXPECT_EQ(cpu_threads(), default_parallel_threads());
  EXPECT_GE(cpu_threads(), 1);
}

TEST(ParallelPool, EveryIndexRunsOnceInChunksOfTheRightSize) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadCount keep(threads);
    for (std::int64_t n : {1, 2, 3, 7, 64, 1000, 100003}) {
      for (std::int64_t chunk : {1, 2, 5, 64, 4096}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        std::atomic<bool> bad_chunk{false};
        // Chunks hold `chunk` indices (the last may hold fewer), more when that would make more
        // than kMaxChunks of them.
        const std::int64_t size = (n + chunk - 1) / chunk > kMaxChunks ? (n + kMaxChunks - 1) / kMaxChunks : chunk;
        parallel_for(n, chunk, [&](std::int64_t begin, std::int64_t end, int) {
          if (begin % size != 0 || end <= begin || (end - begin != size && end != n)) bad_chunk = true;
          for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
        });
        EXPECT_FALSE(bad_chunk.load()) << "n " << n << " chunk " << chunk << " threads " << threads;
        for (std::int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1)
              << "index " << i << " of " << n << ", chunk " << chunk << ", threads " << threads;
        }
      }
    }
  }
}

TEST(ParallelPool, ALoopOfMoreThanTheMostChunksStillCoversEveryIndex) {
  ThreadCount keep(2);
  const std::int64_t n = 3 * kMaxChunks + 5;
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  std::atomic<std::int64_t> chunks{0};
  parallel_for(n, 1, [&](std::int64_t begin, std::int64_t end, int) {
    chunks.fetch_add(1);
    for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
  });
  EXPECT_LE(chunks.load(), kMaxChunks);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << i;
}

TEST(ParallelPool, NoTwoRunningChunksShareASlotAndSlotsStayBelowTheChunkCount) {
  for (int threads : {2, 3, 4}) {
    ThreadCount keep(threads);
    for (std::int64_t n : {1, 2, 3, 5, 40}) {
      std::vector<std::atomic<int>> in_use(static_cast<std::size_t>(threads));
      std::atomic<bool> shared{false}, out_of_range{false};
      for (int repeat = 0; repeat < 20; ++repeat) {
        parallel_for(n, 1, [&](std::int64_t, std::int64_t, int slot) {
          if (slot < 0 || slot >= parallel_threads() || slot >= n) {
            out_of_range = true;
            return;
          }
          if (in_use[static_cast<std::size_t>(slot)].fetch_add(1) != 0) shared = true;
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          in_use[static_cast<std::size_t>(slot)].fetch_sub(1);
        });
      }
      EXPECT_FALSE(shared.load()) << "threads " << threads << " n " << n;
      EXPECT_FALSE(out_of_range.load()) << "threads " << threads << " n " << n;
    }
  }
}

TEST(ParallelPool, ALoopInsideAChunkRunsOnThatChunksThreadWithItsSlot) {
  ThreadCount keep(3);
  std::atomic<bool> wrong{false};
  std::vector<std::atomic<int>> hits(6 * 100);
  parallel_for(6, 1, [&](std::int64_t outer, std::int64_t, int slot) {
    const std::thread::id self = std::this_thread::get_id();
    parallel_for(100, 7, [&](std::int64_t begin, std::int64_t end, int inner_slot) {
      if (std::this_thread::get_id() != self || inner_slot != slot) wrong = true;
      for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(outer * 100 + i)].fetch_add(1);
    });
  });
  EXPECT_FALSE(wrong.load());
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ParallelPool, TwoCallingThreadsEachGetEveryIndexOfTheirOwnLoops) {
  ThreadCount keep(2);
  auto caller = [](std::vector<int>& out) {
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> hits(513);
      parallel_for(513, 16, [&](std::int64_t begin, std::int64_t end, int) {
        for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) out.push_back(h.load());
    }
  };
  std::vector<int> a, b;
  std::thread other(caller, std::ref(b));
  caller(a);
  other.join();
  for (int v : a) ASSERT_EQ(v, 1);
  for (int v : b) ASSERT_EQ(v, 1);
}

TEST(ParallelPool, AThreadHoldingAChunkWithoutRunningIsCountedAsAStallAndTheLoopStillCompletes) {
  ThreadCount keep(2);
  reset_parallel_stats();
  // The worker's chunk takes 40 ms, as if its thread were preempted, the caller's 2 ms (time for
  // the worker to wake and claim its chunk; should it not, the caller runs both chunks, nothing
  // stalls, and the loop is repeated).
  std::atomic<int> ran{0};
  int loops = 0;
  for (; loops < 20 && parallel_stats().stalls == 0; ++loops) {
    parallel_for(2, 1, [&](std::int64_t, std::int64_t, int slot) {
      std::this_thread::sleep_for(std::chrono::milliseconds(slot == 0 ? 2 : 40));
      ran.fetch_add(1);
    });
    EXPECT_EQ(ran.load(), 2 * (loops + 1));  // the loop returned only once both chunks had run
  }
  EXPECT_EQ(parallel_stats().stalls, 1);
  EXPECT_EQ(parallel_stats().loops_across_threads, loops);
  // A loop whose chunks all take about as long is not a stall. Up to five tries: on a loaded
  // machine the worker may really be kept off a core for over 6 ms, which is a stall.
  bool quiet_loop = false;
  for (int tries = 0; tries < 5 && !quiet_loop; ++tries) {
    const std::int64_t before = parallel_stats().stalls;
    parallel_for(2, 1, [](std::int64_t, std::int64_t, int) { std::this_thread::sleep_for(std::chrono::milliseconds(3)); });
    quiet_loop = parallel_stats().stalls == before;
  }
  EXPECT_TRUE(quiet_loop) << "five loops of equal 3 ms chunks all counted as stalls";
}

TEST(ParallelPool, AForkedChildStartsWorkersOfItsOwnAndExitsThoughTheParentsStayed) {
  ThreadCount keep(2);
  std::vector<std::atomic<int>> warm(64);
  parallel_for(64, 1, [&](std::int64_t begin, std::int64_t, int) { warm[static_cast<std::size_t>(begin)] = 1; });
  // The loop above started the workers; it returns only once they are running. Under
  // AddressSanitizer, whose runtime has no fork handler, a child forked while a worker was still
  // starting (holding the sanitizer allocator's lock) deadlocked at its first allocation or exit.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only this thread exists here. Every index must still run once, a worker of the child's own
    // must take part (a chunk on slot 1: the caller's is 0), set_cpu_threads must not wait for the
    // parent's workers, and exit() (static destructors included) must not either.
    const auto every_index_once = [](std::int64_t n) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      parallel_for(n, 10, [&](std::int64_t begin, std::int64_t end, int) {
        for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) {
        if (h.load() != 1) return false;
      }
      return true;
    };
    if (!every_index_once(1000)) std::exit(3);
    bool worker_ran = false;
    for (int tries = 0; tries < 50 && !worker_ran; ++tries) {
      std::atomic<bool> on_slot_1{false};
      parallel_for(2, 1, [&](std::int64_t, std::int64_t, int slot) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (slot == 1) on_slot_1 = true;
      });
      worker_ran = on_slot_1.load();
    }
    if (!worker_ran) std::exit(4);
    set_cpu_threads(3);
    if (parallel_threads() != 3 || !every_index_once(1001)) std::exit(5);
    std::exit(0);
  }
  int status = -1;
  pid_t done = 0;
  for (int waited_ms = 0; waited_ms < 20000 && (done = waitpid(child, &status, WNOHANG)) == 0; waited_ms += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the forked child did not exit within 20 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: an index of the child's loop did not run exactly once; 4: no worker of "
                                       "the child ran a chunk; 5: the child's loop at 3 threads went wrong";
}

}  // namespace
}  // namespace memplan::kernels::cpu
