// memplan's CPU thread pool: the loops of the CPU kernels run on it.
//
// A fork-join team (OpenMP's) makes every thread of the team take part in every loop: a loop ends
// when the last thread has arrived, so a step of a few dozen loops runs at the speed of whichever
// thread the operating system has most recently preempted. With other processes on the cores
// nothing schedules a team together, and a two-thread step then ran 4-5x slower than alone. Here a
// loop is a list of chunks that any thread claims; the caller claims chunks too, and waits only
// for chunks another thread has claimed and not yet finished. A thread that has not been
// scheduled by the time the chunks run out simply takes no part. A chunk's bounds depend on the
// loop alone (never on the thread count or on which thread runs it), so results are the same bits
// at every thread count.
#pragma once

#include <cstdint>
#include <type_traits>

namespace memplan::kernels::cpu {

// The most chunks one loop is split into (chunk sizes grow to fit).
inline constexpr std::int64_t kMaxChunks = 1 << 15;

// The function a loop runs: fn(ctx, begin, end, slot) over [begin, end), a chunk of the loop.
// `slot` is the running thread's own, below parallel_threads() and below the loop's chunk count (in
// a loop run inside another loop's chunk, it is that chunk's slot): one thread runs one chunk at
// a time, so per-slot scratch is never shared.
using ChunkFn = void (*)(void* ctx, std::int64_t begin, std::int64_t end, int slot);

// Runs fn over [0, n) in chunks of `chunk` (the last one shorter; more per chunk when that would
// make over kMaxChunks chunks, so fn must handle every index of [begin, end)) on the pool's
// threads and the caller's, and returns when every chunk has run. On one thread, with one chunk,
// or while another thread's loop holds the pool, the chunks run in order on the calling thread; a
// loop inside a chunk of a loop that went across threads runs there too, with that chunk's slot.
// fn must not throw: an exception in a chunk terminates the process.
void parallel_chunks(std::int64_t n, std::int64_t chunk, ChunkFn fn, void* ctx);

// The pool's thread count, the caller's included (kernels::set_cpu_threads sets it); also the
// number of slots a loop's chunks may be given, which sizes per-slot scratch.
int parallel_threads();
// Sets the pool's thread count (at least 1); call between loops. A child forked between loops
// keeps the count and starts workers of its own at its first loop across threads.
void set_parallel_threads(int threads);
// The count a process starts with: OMP_NUM_THREADS when it holds a positive number (the variable
// users already set for CPU frameworks), else the cores in this process's CPU affinity mask.
int default_parallel_threads();

// What the pool has done since the process started (or since reset_parallel_stats): loops run
// across threads, and stalls among them: the caller waited over a millisecond for other threads'
// chunks because a thread was not running, a sign that other processes share the cores.
struct ParallelStats {
  std::int64_t loops_across_threads = 0;
  std::int64_t stalls = 0;
};
ParallelStats parallel_stats();
void reset_parallel_stats();

// f(begin, end, slot) over [0, n) in chunks of `chunk`.
template <typename F>
void parallel_for(std::int64_t n, std::int64_t chunk, F&& f) {
  using Fn = std::remove_reference_t<F>;
  parallel_chunks(
      n, chunk,
      [](void* ctx, std::int64_t begin, std::int64_t end, int slot) noexcept {
        (*static_cast<Fn*>(ctx))(begin, end, slot);
      },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// Loops over fewer elements than this run on the calling thread: below it, waking a thread costs
// more than it saves.
inline constexpr std::int64_t kParallelMinElements = 1 << 15;
// Elements a chunk of a light loop (an elementwise op) holds.
inline constexpr std::int64_t kChunkElements = 1 << 14;

// f(begin, end) over [0, n) for items of about `item_elements` elements of work each: in chunks of
// about kChunkElements elements, in parallel only when the loop has kParallelMinElements.
template <typename F>
void parallel_ranges(std::int64_t n, std::int64_t item_elements, F&& f) {
  item_elements = item_elements < 1 ? 1 : item_elements;
  if (n * item_elements < kParallelMinElements) {
    if (n > 0) f(std::int64_t{0}, n);
    return;
  }
  const std::int64_t chunk = kChunkElements / item_elements < 1 ? 1 : kChunkElements / item_elements;
  parallel_for(n, chunk, [&](std::int64_t begin, std::int64_t end, int) { f(begin, end); });
}

// Elements of work per item when `items` items hold `total` elements.
constexpr std::int64_t elements_per(std::int64_t total, std::int64_t items) {
  return items > 0 ? total / items : total;
}

// f(i) for each i in [0, n), items of about `item_elements` elements each (see parallel_ranges).
template <typename F>
void parallel_each(std::int64_t n, std::int64_t item_elements, F&& f) {
  parallel_ranges(n, item_elements, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) f(i);
  });
}

}  // namespace memplan::kernels::cpu
