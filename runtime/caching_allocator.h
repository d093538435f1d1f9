// A re-implementation of PyTorch's CUDA caching allocator (the native backend, PyTorch 2.6/2.7
// behaviour) over any Device: the dynamic baseline that memplan's static arena plan
// is compared against. It reproduces PyTorch's rounding, pools, segment sizes, best-fit, split
// and coalescing rules, cache release on out-of-memory, empty_cache(), the max_split_size,
// roundup_power2_divisions, garbage_collection_threshold and expandable_segments options, the
// statistics under PyTorch's names and the OOM message. Blocks are cached per stream, but frees
// take effect at once (no events delay them across streams). It is not thread-safe and has no
// CUDA-graph pools. The rules it follows are in docs/caching_allocator.md.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/runtime/allocation_trace.h"
#include "memplan/runtime/device.h"
#include "memplan/runtime/virtual_memory.h"

namespace memplan::runtime {

inline constexpr Bytes kMiB = Bytes{1} << 20;
inline constexpr Bytes kMinBlockSize = 512;       // every request is a multiple of this
inline constexpr Bytes kSmallSize = 1 * kMiB;     // largest small-pool request
inline constexpr Bytes kSmallBuffer = 2 * kMiB;   // small-pool segment; small expandable page
inline constexpr Bytes kMinLargeAlloc = 10 * kMiB;
inline constexpr Bytes kLargeBuffer = 20 * kMiB;  // 1-10 MiB segment; oversize slack; large page
inline constexpr Bytes kRoundLarge = 2 * kMiB;
inline constexpr Bytes kUnlimitedSplitSize = std::numeric_limits<Bytes>::max();
inline constexpr int kRoundupPower2Intervals = 16;  // 1 MiB .. 64 GiB

struct CachingAllocatorOptions {
  // Blocks this size or larger are never split, and serve only requests at most 20 MiB smaller.
  Bytes max_split_size = kUnlimitedSplitSize;
  // Entry i covers request sizes in [2^i, 2^(i+1)) MiB (entry 0 also everything smaller, entry
  // 15 everything larger); 0 or 1 = plain 512-byte rounding, else a power of two.
  std::array<int, kRoundupPower2Intervals> roundup_power2_divisions{};
  // Fraction of the device this allocator may reserve (set_per_process_memory_fraction);
  // 0 = no limit. Needs a device that answers DeviceMemoryQuery.
  double per_process_memory_fraction = 0.0;
  // 0 = off; else 0 < t < 1, active only with a memory fraction.
  double garbage_collection_threshold = 0.0;
  // Grow one reserved address range per pool in 2 MiB / 20 MiB pages instead of allocating
  // segments. Needs a device that implements VirtualMemoryDevice.
  bool expandable_segments = false;

  // Parses PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "max_split_size_mb:100,expandable_segments:True,
  // roundup_power2_divisions:[64:8,>:1],garbage_collection_threshold:0.6". Also accepts
  // "per_process_memory_fraction:0.5". Unknown keys and bad values are errors.
  static Result<CachingAllocatorOptions> parse(std::string_view config);
  // The same options written back in that syntax (what snapshots report).
  std::string to_string() const;
};

// One statistic as PyTorch keeps it: current value, running peak, cumulative increases and
// decreases.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount);
  void decrease(std::int64_t amount);
  void reset_peak() { peak = current; }
};

enum class StatPool : std::uint8_t { all = 0, small_pool = 1, large_pool = 2 };
inline constexpr int kStatPools = 3;
using StatArray = std::array<Stat, kStatPools>;  // indexed by StatPool

struct AllocatorStats {
  StatArray allocation;            // live allocations
  StatArray segment;               // device allocations (not expandable maps)
  StatArray active;                // live (+ pending-free) blocks
  StatArray inactive_split;        // free blocks inside split segments (non-releasable)
  StatArray allocated_bytes;       // block sizes of live allocations
  StatArray reserved_bytes;        // bytes obtained from the device (allocated + mapped)
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;       // the callers' original sizes
  Stat oversize_allocations;       // live blocks >= max_split_size
  Stat oversize_segments;          // segments >= max_split_size
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;  // cudaMalloc calls, plus expandable maps
  std::int64_t num_device_free = 0;   // cudaFree calls, plus expandable unmaps
  Bytes max_split_size = -1;          // -1 = unlimited
};

// PyTorch's size formatting: "N bytes", "x.xx KiB", "x.xx MiB" or "x.xx GiB".
std::string format_size(Bytes size_bytes);

class CachingAllocator {
 public:
  explicit CachingAllocator(Device& device, CachingAllocatorOptions options = {});
  ~CachingAllocator();  // returns every segment to the device, live blocks included
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nullptr for 0 bytes. Out of memory is an Error with PyTorch's message. Each stream has its
  // own cached blocks (and expandable segments): a block freed on one stream never serves
  // another, as in PyTorch; one stream (0) is what training steps use.
  Result<void*> allocate(Bytes size_bytes, std::int64_t stream = 0);
  void free(void* ptr);  // nullptr is a no-op; an unknown pointer is a programmer error
  // Returns every fully free segment (and, for expandable segments, every fully free page).
  void empty_cache();

  // ---- Start state, for replaying a trace recorded after a run began (trace/) ----
  // One block of a segment that already existed: allocated ones become live allocations.
  struct RestoredBlock {
    Bytes size = 0;
    Bytes requested_size = 0;  // allocated blocks only
    bool allocated = false;
  };
  // Adds a segment that existed before this allocator's history: obtained from the device like
  // any segment (counted in reserved bytes, not as a device allocation of this history) and cut
  // into `blocks` (address order, covering it exactly, multiples of 512, no two free blocks
  // adjacent). Returns its base address; block i starts at base + the sizes before it.
  Result<DeviceAddress> restore_segment(bool large_pool, const std::vector<RestoredBlock>& blocks, std::int64_t stream = 0);
  // Returns the segment starting at `base` to the device if it is entirely free, as a cache
  // release (empty_cache() or an out-of-memory retry) would. False if no such free segment.
  bool release_segment(DeviceAddress base);
  // The largest free cached block of either pool (what the biggest request served without a new
  // segment could be).
  Bytes largest_free_block() const;

  // The block behind a live allocation (its rounded, possibly unsplit size).
  Bytes block_size(const void* ptr) const;

  const AllocatorStats& stats() const { return stats_; }
  // Flat, sorted, under PyTorch's keys: "allocated_bytes.all.current", "num_ooms", ...
  std::map<std::string, std::int64_t> memory_stats() const;
  void reset_peak_stats();

  AllocatorSnapshot snapshot() const;
  // Events go to `trace` (not owned) until set to nullptr.
  void set_trace(AllocationTrace* trace) { trace_ = trace; }

  const CachingAllocatorOptions& options() const { return options_; }
  Bytes round_size(Bytes size_bytes) const { return round_size(size_bytes, options_); }
  // The block size a request of `size_bytes` gets under `options` (section 2 of the rules).
  static Bytes round_size(Bytes size_bytes, const CachingAllocatorOptions& options);
  static Bytes allocation_size(Bytes rounded_size);  // segment size on a cache miss

 private:
  struct Block;
  struct BlockPool;
  struct ExpandableSegment;
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct AllocParams {
    std::int64_t stream = 0;
    Bytes size = 0;        // rounded request
    Bytes alloc_size = 0;  // segment size on a miss
    BlockPool* pool = nullptr;
    Block* block = nullptr;
  };

  BlockPool& pool_for(Bytes rounded_size);
  bool get_free_block(AllocParams& p);
  bool alloc_block(AllocParams& p, bool is_retry);
  bool should_split(const Block* block, Bytes size) const;
  Block* alloc_found_block(AllocParams& p, Bytes requested_size);
  void free_block(Block* block);
  Bytes try_merge_blocks(Block* dst, Block* src, BlockPool& pool);
  void insert_free(BlockPool& pool, Block* block);
  bool release_available_cached_blocks(const AllocParams& p);
  void release_cached_blocks();
  void release_blocks(BlockPool& pool);
  void release_block(Block* block);
  void garbage_collect_cached_blocks();
  Error out_of_memory(const AllocParams& p);

  // Expandable segments.
  Block* try_allocate_expandable_block(BlockPool& pool, Bytes size, std::int64_t stream);
  Block* find_expandable_block(BlockPool& pool, Bytes size, std::int64_t stream);
  bool map_block(Block* to_map, Bytes size);
  void unmap_block(Block* block);
  void release_expandable_segment(Block* block);

  void update_stat(StatArray& stat, const BlockPool& pool, std::int64_t amount);
  void record(TraceAction action, DeviceAddress address, Bytes size);
  Bytes allowed_memory() const;

  Device& device_;
  DeviceMemoryQuery* memory_query_;  // nullptr when the device cannot say its capacity
  VirtualMemoryDevice* vm_device_;   // nullptr when it has no virtual-memory primitives
  CachingAllocatorOptions options_;
  std::unique_ptr<BlockPool> small_pool_;
  std::unique_ptr<BlockPool> large_pool_;
  std::unordered_map<DeviceAddress, Block*> active_blocks_;
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments_;
  AllocatorStats stats_;
  Bytes total_reserved_ = 0;
  AllocationTrace* trace_ = nullptr;
};

}  // namespace memplan::runtime
