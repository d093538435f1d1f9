#include "memplan/runtime/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace memplan::runtime {

// ---- Blocks and pools -----------------------------------------------------------------------

// A block is a piece of one segment; prev/next are its address neighbours in that segment only.
// Free mapped blocks live in their pool's `blocks` set (best fit = lower_bound on (size,
// address)); unmapped parts of expandable segments live in `unmapped` (address order); allocated
// blocks live in active_blocks_.
struct CachingAllocator::Block {
  DeviceAddress address = 0;
  Bytes size = 0;
  Bytes requested_size = 0;
  std::int64_t stream = 0;  // a block serves only requests on the stream its segment was made for
  BlockPool* pool = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;
  bool mapped = true;  // false only for unmapped ranges of expandable segments
  ExpandableSegment* expandable = nullptr;
  std::int64_t gc_count_base = 0;  // pool's search count when the block became free

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

bool CachingAllocator::BySizeThenAddress::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

bool CachingAllocator::ByAddress::operator()(const Block* a, const Block* b) const {
  return a->address < b->address;
}

struct CachingAllocator::BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BySizeThenAddress> blocks;
  std::set<Block*, ByAddress> unmapped;
  bool is_small;
  std::int64_t get_free_blocks_call_count = 0;  // the gc's clock
};

// One reserved address range, grown and shrunk in pages of `page_size` bytes.
struct CachingAllocator::ExpandableSegment {
  DeviceAddress base = 0;
  Bytes size = 0;
  Bytes page_size = 0;
};

// ---- Stats and formatting -------------------------------------------------------------------

void Stat::increase(std::int64_t amount) {
  current += amount;
  peak = std::max(peak, current);
  allocated += amount;
}

void Stat::decrease(std::int64_t amount) {
  current -= amount;
  freed += amount;
}

std::string format_size(Bytes size_bytes) {
  char buf[64];
  if (size_bytes <= 1024) return std::to_string(size_bytes) + " bytes";
  if (size_bytes <= kMiB) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(size_bytes) / 1024.0);
  } else if (size_bytes <= 1024 * kMiB) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(size_bytes) / static_cast<double>(kMiB));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(size_bytes) / static_cast<double>(1024 * kMiB));
  }
  return buf;
}

// ---- Options --------------------------------------------------------------------------------

namespace {

bool is_power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

int log2_floor(std::int64_t v) { return static_cast<int>(std::bit_width(static_cast<std::uint64_t>(v))) - 1; }

int division_index(Bytes size_bytes) {
  const int log_size = log2_floor(size_bytes);
  return std::clamp(log_size - 20, 0, kRoundupPower2Intervals - 1);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, std::int64_t* out) {
  s = trim(s);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool parse_double(std::string_view s, double* out) {
  s = trim(s);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Splits on commas outside brackets.
std::vector<std::string_view> split_top_level(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || (s[i] == ',' && depth == 0)) {
      if (!trim(s.substr(start, i - start)).empty()) parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    } else if (s[i] == '[') {
      ++depth;
    } else if (s[i] == ']') {
      --depth;
    }
  }
  return parts;
}

Error option_error(std::string_view what) { return Error{"allocator option: " + std::string(what)}; }

}  // namespace

Result<CachingAllocatorOptions> CachingAllocatorOptions::parse(std::string_view config) {
  CachingAllocatorOptions o;
  for (std::string_view item : split_top_level(config)) {
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) return option_error("expected key:value, got '" + std::string(item) + "'");
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = trim(item.substr(colon + 1));
    if (key == "max_split_size_mb") {
      std::int64_t mb = 0;
      if (!parse_int(value, &mb) || mb < kLargeBuffer / kMiB) {
        return option_error("max_split_size_mb must be an integer >= 20, got '" + std::string(value) + "'");
      }
      o.max_split_size = mb >= kUnlimitedSplitSize / kMiB ? kUnlimitedSplitSize : mb * kMiB;
    } else if (key == "roundup_power2_divisions") {
      o.roundup_power2_divisions.fill(0);
      if (!value.empty() && value.front() == '[') {
        if (value.back() != ']') return option_error("roundup_power2_divisions: missing ']'");
        int last_index = -1;
        bool first = true;
        for (std::string_view entry : split_top_level(value.substr(1, value.size() - 2))) {
          const std::size_t c = entry.find(':');
          std::int64_t divisions = 0;
          if (c == std::string_view::npos || !parse_int(entry.substr(c + 1), &divisions) ||
              (divisions != 0 && !is_power_of_two(divisions))) {
            return option_error("roundup_power2_divisions: bad entry '" + std::string(entry) + "'");
          }
          const std::string_view k = trim(entry.substr(0, c));
          if (k == ">") {
            for (int i = last_index + 1; i < kRoundupPower2Intervals; ++i) {
              o.roundup_power2_divisions[static_cast<std::size_t>(i)] = static_cast<int>(divisions);
            }
            continue;
          }
          std::int64_t mb = 0;
          if (!parse_int(k, &mb) || !is_power_of_two(mb)) {
            return option_error("roundup_power2_divisions: key must be a power of two (MiB), got '" +
                                std::string(k) + "'");
          }
          const int index = std::min(log2_floor(mb), kRoundupPower2Intervals - 1);
          // The first key also covers every smaller interval.
          for (int i = first ? 0 : index; i <= index; ++i) {
            o.roundup_power2_divisions[static_cast<std::size_t>(i)] = static_cast<int>(divisions);
          }
          first = false;
          last_index = index;
        }
      } else {
        std::int64_t divisions = 0;
        if (!parse_int(value, &divisions) || (divisions != 0 && !is_power_of_two(divisions))) {
          return option_error("roundup_power2_divisions must be a power of two, got '" + std::string(value) + "'");
        }
        o.roundup_power2_divisions.fill(static_cast<int>(divisions));
      }
    } else if (key == "garbage_collection_threshold") {
      double t = 0;
      if (!parse_double(value, &t) || !(t > 0.0 && t < 1.0)) {
        return option_error("garbage_collection_threshold must be in (0, 1), got '" + std::string(value) + "'");
      }
      o.garbage_collection_threshold = t;
    } else if (key == "per_process_memory_fraction") {
      double f = 0;
      if (!parse_double(value, &f) || !(f > 0.0 && f <= 1.0)) {
        return option_error("per_process_memory_fraction must be in (0, 1], got '" + std::string(value) + "'");
      }
      o.per_process_memory_fraction = f;
    } else if (key == "expandable_segments") {
      if (value != "True" && value != "False") {
        return option_error("expandable_segments must be True or False, got '" + std::string(value) + "'");
      }
      o.expandable_segments = value == "True";
    } else if (key == "backend") {
      if (value != "native") return option_error("only backend:native is modelled, got '" + std::string(value) + "'");
    } else {
      return option_error("unknown key '" + std::string(key) + "'");
    }
  }
  return o;
}

std::string CachingAllocatorOptions::to_string() const {
  std::ostringstream s;
  auto sep = [&s, first = true]() mutable {
    if (!first) s << ',';
    first = false;
  };
  if (max_split_size != kUnlimitedSplitSize) {
    sep();
    s << "max_split_size_mb:" << max_split_size / kMiB;
  }
  if (std::any_of(roundup_power2_divisions.begin(), roundup_power2_divisions.end(), [](int d) { return d != 0; })) {
    sep();
    s << "roundup_power2_divisions:[";
    for (int i = 0; i < kRoundupPower2Intervals; ++i) {
      s << (i ? "," : "") << (Bytes{1} << i) << ':' << roundup_power2_divisions[static_cast<std::size_t>(i)];
    }
    s << ']';
  }
  if (per_process_memory_fraction > 0) {
    sep();
    s << "per_process_memory_fraction:" << per_process_memory_fraction;
  }
  if (garbage_collection_threshold > 0) {
    sep();
    s << "garbage_collection_threshold:" << garbage_collection_threshold;
  }
  if (expandable_segments) {
    sep();
    s << "expandable_segments:True";
  }
  return s.str();
}

// ---- Construction ---------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device& device, CachingAllocatorOptions options)
    : device_(device),
      memory_query_(dynamic_cast<DeviceMemoryQuery*>(&device)),
      vm_device_(dynamic_cast<VirtualMemoryDevice*>(&device)),
      options_(options),
      small_pool_(std::make_unique<BlockPool>(true)),
      large_pool_(std::make_unique<BlockPool>(false)) {
  MEMPLAN_CHECK(options_.max_split_size >= kLargeBuffer, "max_split_size below 20 MiB");
  for (int d : options_.roundup_power2_divisions) {
    MEMPLAN_CHECK(d == 0 || is_power_of_two(d), "roundup_power2_divisions entry " << d << " is not a power of two");
  }
  MEMPLAN_CHECK(options_.per_process_memory_fraction >= 0.0 && options_.per_process_memory_fraction <= 1.0,
                "memory fraction out of range");
  MEMPLAN_CHECK(options_.per_process_memory_fraction == 0.0 || memory_query_ != nullptr,
                "a memory fraction needs a device that reports its capacity");
  MEMPLAN_CHECK(options_.garbage_collection_threshold >= 0.0 && options_.garbage_collection_threshold < 1.0,
                "garbage_collection_threshold out of range");
  MEMPLAN_CHECK(!options_.expandable_segments || vm_device_ != nullptr,
                "expandable segments need a device with virtual-memory primitives (" << device.name() << " has none)");
  stats_.max_split_size = options_.max_split_size == kUnlimitedSplitSize ? -1 : options_.max_split_size;
}

CachingAllocator::~CachingAllocator() {
  std::vector<Block*> all;
  for (auto& [address, block] : active_blocks_) all.push_back(block);
  for (BlockPool* pool : {small_pool_.get(), large_pool_.get()}) {
    all.insert(all.end(), pool->blocks.begin(), pool->blocks.end());
    all.insert(all.end(), pool->unmapped.begin(), pool->unmapped.end());
  }
  for (Block* head : all) {
    if (head->prev != nullptr) continue;
    if (head->expandable == nullptr) {
      Bytes size = 0;
      for (Block* b = head; b != nullptr; b = b->next) size += b->size;
      device_.deallocate(reinterpret_cast<void*>(head->address), size);
      continue;
    }
    // Mapped runs are whole pages: unmap each, then release the reservation.
    for (Block* b = head; b != nullptr;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      const DeviceAddress start = b->address;
      Bytes run = 0;
      for (; b != nullptr && b->mapped; b = b->next) run += b->size;
      vm_device_->unmap_pages(start, run);
    }
    vm_device_->release_address_range(head->expandable->base);
  }
  for (Block* b : all) delete b;
}

// ---- Sizes ----------------------------------------------------------------------------------

Bytes CachingAllocator::round_size(Bytes size_bytes, const CachingAllocatorOptions& options) {
  if (size_bytes < kMinBlockSize) return kMinBlockSize;
  const Bytes divisions = options.roundup_power2_divisions[static_cast<std::size_t>(division_index(size_bytes))];
  if (divisions > 1 && size_bytes > kMinBlockSize * divisions) {
    if (is_power_of_two(size_bytes)) return size_bytes;
    const Bytes floor = Bytes{1} << log2_floor(size_bytes);
    return align_up(size_bytes, floor / divisions);
  }
  return align_up(size_bytes, kMinBlockSize);
}

Bytes CachingAllocator::allocation_size(Bytes rounded_size) {
  if (rounded_size <= kSmallSize) return kSmallBuffer;
  if (rounded_size < kMinLargeAlloc) return kLargeBuffer;
  return align_up(rounded_size, kRoundLarge);
}

CachingAllocator::BlockPool& CachingAllocator::pool_for(Bytes rounded_size) {
  return rounded_size <= kSmallSize ? *small_pool_ : *large_pool_;
}

Bytes CachingAllocator::allowed_memory() const {
  if (options_.per_process_memory_fraction <= 0.0) return std::numeric_limits<Bytes>::max();
  return static_cast<Bytes>(options_.per_process_memory_fraction *
                            static_cast<double>(memory_query_->memory_info().total_bytes));
}

void CachingAllocator::update_stat(StatArray& stat, const BlockPool& pool, std::int64_t amount) {
  const auto pool_index = static_cast<std::size_t>(pool.is_small ? StatPool::small_pool : StatPool::large_pool);
  for (std::size_t i : {static_cast<std::size_t>(StatPool::all), pool_index}) {
    if (amount >= 0) {
      stat[i].increase(amount);
    } else {
      stat[i].decrease(-amount);
    }
  }
}

void CachingAllocator::record(TraceAction action, DeviceAddress address, Bytes size) {
  if (trace_ != nullptr) trace_->record(action, address, size);
}

void CachingAllocator::insert_free(BlockPool& pool, Block* block) {
  block->gc_count_base = pool.get_free_blocks_call_count;
  const bool inserted = pool.blocks.insert(block).second;
  MEMPLAN_CHECK(inserted, "block already in its free set");
}

// ---- malloc ---------------------------------------------------------------------------------

Result<void*> CachingAllocator::allocate(Bytes size_bytes, std::int64_t stream) {
  MEMPLAN_CHECK(size_bytes >= 0, "negative allocation size " << size_bytes);
  if (size_bytes == 0) return static_cast<void*>(nullptr);
  AllocParams p;
  p.stream = stream;
  p.size = round_size(size_bytes);
  p.pool = &pool_for(p.size);
  p.alloc_size = allocation_size(p.size);

  bool found = get_free_block(p);
  if (!found) {
    if (options_.per_process_memory_fraction > 0.0 && options_.garbage_collection_threshold > 0.0) {
      garbage_collect_cached_blocks();
    }
    // Each fallback runs only if the one before failed; the last is the only "retry".
    found = alloc_block(p, false) || (release_available_cached_blocks(p) && alloc_block(p, false));
    if (!found) {
      release_cached_blocks();
      found = alloc_block(p, true);
    }
  }
  if (!found) return out_of_memory(p);
  Block* block = alloc_found_block(p, size_bytes);
  return reinterpret_cast<void*>(block->address);
}

bool CachingAllocator::get_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (options_.per_process_memory_fraction > 0.0 && options_.garbage_collection_threshold > 0.0) {
    ++pool.get_free_blocks_call_count;
  }
  Block key;
  key.stream = p.stream;
  key.size = p.size;
  key.address = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
  if ((*it)->expandable != nullptr) {
    // A block that touches unmapped space can grow, so best fit judges it by what it could
    // grow to: prefer a later block whose growable size is smaller.
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
    };
    auto next = std::next(it);
    while ((*it)->expandable != nullptr && next != pool.blocks.end() && (*next)->stream == p.stream &&
           expandable_size(*next) < expandable_size(*it)) {
      it = next++;
    }
  }
  // An oversize block never serves a request below max_split_size, and serves an oversize
  // request only if it wastes less than 20 MiB (it will not be split).
  if (p.size < options_.max_split_size && (*it)->size >= options_.max_split_size) return false;
  if (p.size >= options_.max_split_size && (*it)->size >= p.size + kLargeBuffer) return false;
  p.block = *it;
  pool.blocks.erase(it);
  return true;
}

bool CachingAllocator::alloc_block(AllocParams& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  const Bytes size = p.alloc_size;
  if (options_.per_process_memory_fraction > 0.0 && total_reserved_ + size > allowed_memory()) return false;
  if (options_.expandable_segments) {
    p.block = try_allocate_expandable_block(*p.pool, p.size, p.stream);
    return p.block != nullptr;
  }
  Result<void*> ptr = device_.allocate(size);
  if (!ptr.ok()) return false;
  auto* block = new Block;
  block->address = reinterpret_cast<DeviceAddress>(ptr.value());
  block->size = size;
  block->stream = p.stream;
  block->pool = p.pool;
  p.block = block;
  total_reserved_ += size;
  update_stat(stats_.segment, *p.pool, 1);
  update_stat(stats_.reserved_bytes, *p.pool, size);
  if (size >= options_.max_split_size) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  record(TraceAction::segment_alloc, block->address, size);
  return true;
}

bool CachingAllocator::should_split(const Block* block, Bytes size) const {
  const Bytes remaining = block->size - size;
  if (block->pool->is_small || options_.expandable_segments) return remaining >= kMinBlockSize;
  return size < options_.max_split_size && remaining > kSmallSize;
}

CachingAllocator::Block* CachingAllocator::alloc_found_block(AllocParams& p, Bytes requested_size) {
  BlockPool& pool = *p.pool;
  Block* block = p.block;
  const bool already_split = block->is_split();
  const bool track_split = block->expandable == nullptr;
  if (should_split(block, p.size)) {
    // The front part is handed out; the remainder stays free right after it.
    Block* remaining = block;
    block = new Block;
    block->address = remaining->address;
    block->size = p.size;
    block->stream = remaining->stream;
    block->pool = &pool;
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev != nullptr) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->address += static_cast<DeviceAddress>(p.size);
    remaining->size -= p.size;
    insert_free(pool, remaining);
    if (track_split && already_split) {
      update_stat(stats_.inactive_split_bytes, pool, -block->size);
    } else if (track_split) {
      update_stat(stats_.inactive_split_bytes, pool, remaining->size);
      update_stat(stats_.inactive_split, pool, 1);
    }
  } else if (track_split && already_split) {
    update_stat(stats_.inactive_split_bytes, pool, -block->size);
    update_stat(stats_.inactive_split, pool, -1);
  }
  block->allocated = true;
  block->requested_size = requested_size;
  active_blocks_.emplace(block->address, block);
  update_stat(stats_.allocation, pool, 1);
  update_stat(stats_.allocated_bytes, pool, block->size);
  update_stat(stats_.active, pool, 1);
  update_stat(stats_.active_bytes, pool, block->size);
  update_stat(stats_.requested_bytes, pool, requested_size);
  if (block->size >= options_.max_split_size) stats_.oversize_allocations.increase(1);
  record(TraceAction::alloc, block->address, requested_size);
  return block;
}

Error CachingAllocator::out_of_memory(const AllocParams& p) {
  DeviceMemoryInfo info;
  if (memory_query_ != nullptr) {
    info = memory_query_->memory_info();
  } else {
    info.total_bytes = total_reserved_;  // the device cannot say more
  }
  record(TraceAction::oom, static_cast<DeviceAddress>(info.free_bytes), p.size);
  ++stats_.num_ooms;
  const auto all = static_cast<std::size_t>(StatPool::all);
  const Bytes allocated = stats_.allocated_bytes[all].current;
  const Bytes reserved = stats_.reserved_bytes[all].current;
  std::string message = "CUDA out of memory. Tried to allocate " + format_size(p.alloc_size) + ". GPU 0 has a total capacity of " +
                        format_size(info.total_bytes) + " of which " + format_size(info.free_bytes) + " is free. ";
  if (memory_query_ != nullptr) {
    message += "Including non-PyTorch memory, this process has " + format_size(info.total_bytes - info.free_bytes) +
               " memory in use. ";
  }
  if (options_.per_process_memory_fraction > 0.0) message += format_size(allowed_memory()) + " allowed; ";
  message += "Of the allocated memory " + format_size(allocated) + " is allocated by PyTorch, and " +
             format_size(reserved - allocated) + " is reserved by PyTorch but unallocated.";
  // Newer PyTorch (PR #173051) drops the hint when expandable segments are already on.
  if (!options_.expandable_segments) {
    message += " If reserved but unallocated memory is large try setting"
               " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";
  }
  message += "  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
  return Error{std::move(message)};
}

// ---- free -----------------------------------------------------------------------------------

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  auto it = active_blocks_.find(reinterpret_cast<DeviceAddress>(ptr));
  MEMPLAN_CHECK(it != active_blocks_.end(), "free of a pointer the caching allocator did not hand out: " << ptr);
  Block* block = it->second;
  block->allocated = false;
  record(TraceAction::free_requested, block->address, block->requested_size);
  update_stat(stats_.allocation, *block->pool, -1);
  update_stat(stats_.allocated_bytes, *block->pool, -block->size);
  if (block->size >= options_.max_split_size) stats_.oversize_allocations.decrease(1);
  // One stream: no other stream can still be using the block, so it is free at once.
  free_block(block);
}

void CachingAllocator::free_block(Block* block) {
  record(TraceAction::free_completed, block->address, block->requested_size);
  active_blocks_.erase(block->address);  // before merging may move the block's start
  BlockPool& pool = *block->pool;
  const Bytes original_size = block->size;
  const Bytes requested_size = block->requested_size;
  std::int64_t inactive_split_blocks = 0;
  Bytes inactive_split_bytes = 0;
  for (Block* candidate : {block->prev, block->next}) {
    const Bytes subsumed = try_merge_blocks(block, candidate, pool);
    if (subsumed > 0) {
      inactive_split_blocks -= 1;
      inactive_split_bytes -= subsumed;
    }
  }
  block->requested_size = 0;
  insert_free(pool, block);
  if (block->is_split()) {
    inactive_split_blocks += 1;
    inactive_split_bytes += block->size;
  }
  if (block->expandable == nullptr) {
    update_stat(stats_.inactive_split, pool, inactive_split_blocks);
    update_stat(stats_.inactive_split_bytes, pool, inactive_split_bytes);
  }
  update_stat(stats_.active, pool, -1);
  update_stat(stats_.active_bytes, pool, -original_size);
  update_stat(stats_.requested_bytes, pool, -requested_size);
}

Bytes CachingAllocator::try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
  if (src == nullptr || src->allocated || src->mapped != dst->mapped) return 0;
  if (dst->prev == src) {
    dst->address = src->address;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const Bytes subsumed = src->size;
  dst->size += subsumed;
  const std::size_t erased = src->mapped ? pool.blocks.erase(src) : pool.unmapped.erase(src);
  MEMPLAN_CHECK(erased == 1, "merged a free block that was not in its pool");
  delete src;
  return subsumed;
}

// ---- Giving memory back ---------------------------------------------------------------------

bool CachingAllocator::release_available_cached_blocks(const AllocParams& p) {
  if (options_.max_split_size == kUnlimitedSplitSize) return false;
  BlockPool& pool = *p.pool;
  Block key;
  key.stream = p.stream;
  key.size = std::max(p.size, options_.max_split_size);
  key.address = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (it != pool.blocks.end() && (*it)->stream == p.stream && (*it)->expandable == nullptr && !(*it)->is_split()) {
    release_block(*it);  // the smallest cached oversize segment that covers the request
    return true;
  }
  // Otherwise free oversize segments from the largest down until the target is covered.
  if (it == pool.blocks.begin()) return false;
  Bytes released = 0;
  --it;
  while (released < key.size && (*it)->stream == p.stream && (*it)->size >= options_.max_split_size) {
    Block* current = *it;
    const bool is_first = it == pool.blocks.begin();
    if (!is_first) --it;
    if (current->expandable == nullptr && !current->is_split()) {
      released += current->size;
      release_block(current);
    }
    if (is_first) break;
  }
  return released >= key.size;
}

void CachingAllocator::release_cached_blocks() {
  ++stats_.num_sync_all_streams;  // one stream: nothing pending to wait for
  release_blocks(*large_pool_);
  release_blocks(*small_pool_);
}

void CachingAllocator::empty_cache() { release_cached_blocks(); }

void CachingAllocator::release_blocks(BlockPool& pool) {
  std::vector<Block*> to_unmap;  // unmapping edits the free set, so it waits for the loop
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* block = *it++;
    if (block->expandable != nullptr) {
      to_unmap.push_back(block);
    } else if (!block->is_split()) {
      release_block(block);
    }
  }
  for (Block* block : to_unmap) {
    unmap_block(block);
    if (!block->mapped && !block->is_split()) release_expandable_segment(block);
  }
  // Segments whose first growth failed (out of memory) were never mapped at all.
  for (auto it = pool.unmapped.begin(); it != pool.unmapped.end();) {
    Block* block = *it++;
    if (!block->is_split()) release_expandable_segment(block);
  }
}

void CachingAllocator::release_block(Block* block) {
  BlockPool& pool = *block->pool;
  device_.deallocate(reinterpret_cast<void*>(block->address), block->size);
  pool.blocks.erase(block);
  total_reserved_ -= block->size;
  update_stat(stats_.segment, pool, -1);
  update_stat(stats_.reserved_bytes, pool, -block->size);
  if (block->size >= options_.max_split_size) stats_.oversize_segments.decrease(1);
  ++stats_.num_device_free;
  record(TraceAction::segment_free, block->address, block->size);
  delete block;
}

// ---- Start state ------------------------------------------------------------------------------

Result<DeviceAddress> CachingAllocator::restore_segment(bool large_pool, const std::vector<RestoredBlock>& blocks,
                                                       std::int64_t stream) {
  if (options_.expandable_segments) return Error{"restoring segments is not modelled with expandable segments"};
  if (blocks.empty()) return Error{"a restored segment needs at least one block"};
  Bytes total = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const RestoredBlock& b = blocks[i];
    if (b.size <= 0 || b.size % kMinBlockSize != 0) {
      return Error{"restored block " + std::to_string(i) + " has size " + std::to_string(b.size) + ", not a positive multiple of 512"};
    }
    if (!b.allocated && i > 0 && !blocks[i - 1].allocated) return Error{"restored segment has two adjacent free blocks"};
    if (b.allocated && (b.requested_size <= 0 || b.requested_size > b.size)) {
      return Error{"restored block " + std::to_string(i) + " requests " + std::to_string(b.requested_size) + " of its " +
                   std::to_string(b.size) + " bytes"};
    }
    total += b.size;
  }
  Result<void*> ptr = device_.allocate(total);
  if (!ptr.ok()) return ptr.error();
  BlockPool& pool = large_pool ? *large_pool_ : *small_pool_;
  const auto base = reinterpret_cast<DeviceAddress>(ptr.value());
  total_reserved_ += total;
  update_stat(stats_.segment, pool, 1);
  update_stat(stats_.reserved_bytes, pool, total);
  if (total >= options_.max_split_size) stats_.oversize_segments.increase(1);
  DeviceAddress at = base;
  Block* prev = nullptr;
  const bool split = blocks.size() > 1;
  for (const RestoredBlock& rb : blocks) {
    auto* block = new Block;
    block->address = at;
    block->size = rb.size;
    block->stream = stream;
    block->pool = &pool;
    block->prev = prev;
    if (prev != nullptr) prev->next = block;
    prev = block;
    at += static_cast<DeviceAddress>(rb.size);
    if (rb.allocated) {
      block->allocated = true;
      block->requested_size = rb.requested_size;
      active_blocks_.emplace(block->address, block);
      update_stat(stats_.allocation, pool, 1);
      update_stat(stats_.allocated_bytes, pool, block->size);
      update_stat(stats_.active, pool, 1);
      update_stat(stats_.active_bytes, pool, block->size);
      update_stat(stats_.requested_bytes, pool, rb.requested_size);
      if (block->size >= options_.max_split_size) stats_.oversize_allocations.increase(1);
    } else {
      insert_free(pool, block);
      if (split) {
        update_stat(stats_.inactive_split, pool, 1);
        update_stat(stats_.inactive_split_bytes, pool, block->size);
      }
    }
  }
  return base;
}

bool CachingAllocator::release_segment(DeviceAddress base) {
  for (BlockPool* pool : {large_pool_.get(), small_pool_.get()}) {
    for (Block* block : pool->blocks) {
      if (block->address == base && !block->is_split() && block->expandable == nullptr) {
        release_block(block);
        return true;
      }
    }
  }
  return false;
}

Bytes CachingAllocator::largest_free_block() const {
  Bytes largest = 0;
  for (const BlockPool* pool : {large_pool_.get(), small_pool_.get()}) {
    if (!pool->blocks.empty()) largest = std::max(largest, (*pool->blocks.rbegin())->size);
  }
  return largest;
}

void CachingAllocator::garbage_collect_cached_blocks() {
  const Bytes threshold = static_cast<Bytes>(options_.garbage_collection_threshold * static_cast<double>(allowed_memory()));
  if (total_reserved_ <= threshold) return;
  const Bytes target = total_reserved_ - threshold;
  BlockPool& pool = *large_pool_;
  auto age = [&pool](const Block* b) { return pool.get_free_blocks_call_count - b->gc_count_base; };
  auto freeable = [](const Block* b) { return !b->is_split() && b->expandable == nullptr; };
  std::int64_t total_age = 0;
  std::int64_t freeable_count = 0;
  for (const Block* b : pool.blocks) {
    if (!freeable(b)) continue;
    total_age += age(b);
    ++freeable_count;
  }
  // Free the blocks at least as old as the average, again and again, until the target is met.
  Bytes reclaimed = 0;
  bool freed_one = true;
  while (reclaimed < target && freed_one && freeable_count > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable_count);
    freed_one = false;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* block = *it++;
      if (!freeable(block) || static_cast<double>(age(block)) < age_threshold) continue;
      freed_one = true;
      reclaimed += block->size;
      total_age -= age(block);
      --freeable_count;
      release_block(block);
    }
  }
}

// ---- Expandable segments --------------------------------------------------------------------

CachingAllocator::Block* CachingAllocator::try_allocate_expandable_block(BlockPool& pool, Bytes size, std::int64_t stream) {
  Block* candidate = find_expandable_block(pool, size, stream);
  if (candidate == nullptr) return nullptr;
  // candidate is unmapped, or free and followed by unmapped space; map until it is big enough.
  if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, size))) return nullptr;
  while (candidate->size < size) {
    Block* next = candidate->next;
    MEMPLAN_CHECK(next != nullptr && !next->mapped, "expandable growth expected unmapped space");
    if (!map_block(next, std::min(size - candidate->size, next->size))) return nullptr;
    candidate = next;  // map_block merged the old candidate into it
  }
  pool.blocks.erase(candidate);
  return candidate;
}

CachingAllocator::Block* CachingAllocator::find_expandable_block(BlockPool& pool, Bytes size, std::int64_t stream) {
  auto allocatable = [](const Block* b) { return b != nullptr && !b->allocated; };
  auto has_room = [&](const Block* b) {
    Bytes bytes = 0;
    for (; bytes < size && allocatable(b); b = b->next) bytes += b->size;
    return bytes >= size;
  };
  // Lowest address first, so holes left by unmapping are refilled before the tail grows.
  for (Block* unmapped : pool.unmapped) {
    if (unmapped->stream != stream) continue;  // one expandable segment per stream and pool
    Block* c = allocatable(unmapped->prev) ? unmapped->prev : unmapped;
    if (has_room(c)) return c;
  }
  // A new segment: address space for 1.125 x the device, rounded to pages, nothing mapped.
  const Bytes page = pool.is_small ? kSmallBuffer : kLargeBuffer;
  const Bytes total = memory_query_->memory_info().total_bytes;
  const Bytes reserve = align_up(total + total / 8, page);
  Result<DeviceAddress> base = vm_device_->reserve_address_range(reserve);
  if (!base.ok()) return nullptr;
  auto segment = std::make_unique<ExpandableSegment>();
  segment->base = base.value();
  segment->size = reserve;
  segment->page_size = page;
  auto* block = new Block;
  block->address = segment->base;
  block->size = reserve;
  block->stream = stream;
  block->pool = &pool;
  block->mapped = false;
  block->expandable = segment.get();
  expandable_segments_.push_back(std::move(segment));
  pool.unmapped.insert(block);
  return block;
}

bool CachingAllocator::map_block(Block* to_map, Bytes size) {
  MEMPLAN_CHECK(!to_map->mapped && size > 0 && size <= to_map->size, "bad map request");
  const ExpandableSegment& es = *to_map->expandable;
  const Bytes offset = static_cast<Bytes>(to_map->address - es.base);
  MEMPLAN_CHECK(offset % es.page_size == 0, "unmapped range not page-aligned");
  const Bytes mapped_size = align_up(size, es.page_size);
  if (!vm_device_->map_pages(to_map->address, mapped_size).ok()) return false;
  BlockPool& pool = *to_map->pool;
  pool.unmapped.erase(to_map);
  to_map->mapped = true;
  if (mapped_size < to_map->size) {
    auto* rest = new Block;
    rest->stream = to_map->stream;
    rest->address = to_map->address + static_cast<DeviceAddress>(mapped_size);
    rest->size = to_map->size - mapped_size;
    rest->pool = &pool;
    rest->mapped = false;
    rest->expandable = to_map->expandable;
    rest->prev = to_map;
    rest->next = to_map->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    to_map->next = rest;
    to_map->size = mapped_size;
    pool.unmapped.insert(rest);
  }
  try_merge_blocks(to_map, to_map->prev, pool);
  try_merge_blocks(to_map, to_map->next, pool);
  insert_free(pool, to_map);
  total_reserved_ += mapped_size;
  update_stat(stats_.reserved_bytes, pool, mapped_size);
  ++stats_.num_device_alloc;
  record(TraceAction::segment_map, es.base + static_cast<DeviceAddress>(offset), mapped_size);
  return true;
}

void CachingAllocator::unmap_block(Block* block) {
  const ExpandableSegment& es = *block->expandable;
  // Only whole pages inside the block can go; partial-page slivers stay mapped and free.
  const Bytes begin = align_up(static_cast<Bytes>(block->address - es.base), es.page_size);
  const Bytes end = static_cast<Bytes>(block->address - es.base) + block->size;
  const Bytes end_page = end / es.page_size * es.page_size;
  if (begin >= end_page) return;
  const DeviceAddress start = es.base + static_cast<DeviceAddress>(begin);
  const Bytes size = end_page - begin;
  vm_device_->unmap_pages(start, size);
  BlockPool& pool = *block->pool;
  pool.blocks.erase(block);
  const Bytes before = static_cast<Bytes>(start - block->address);
  if (before > 0) {
    auto* sliver = new Block;
    sliver->stream = block->stream;
    sliver->address = block->address;
    sliver->size = before;
    sliver->pool = &pool;
    sliver->expandable = block->expandable;
    sliver->prev = block->prev;
    if (sliver->prev != nullptr) sliver->prev->next = sliver;
    sliver->next = block;
    block->prev = sliver;
    insert_free(pool, sliver);
  }
  const Bytes after = block->size - before - size;
  if (after > 0) {
    auto* sliver = new Block;
    sliver->stream = block->stream;
    sliver->address = start + static_cast<DeviceAddress>(size);
    sliver->size = after;
    sliver->pool = &pool;
    sliver->expandable = block->expandable;
    sliver->next = block->next;
    if (sliver->next != nullptr) sliver->next->prev = sliver;
    sliver->prev = block;
    block->next = sliver;
    insert_free(pool, sliver);
  }
  block->address = start;
  block->size = size;
  block->mapped = false;
  try_merge_blocks(block, block->prev, pool);
  try_merge_blocks(block, block->next, pool);
  pool.unmapped.insert(block);
  total_reserved_ -= size;
  update_stat(stats_.reserved_bytes, pool, -size);
  ++stats_.num_device_free;
  record(TraceAction::segment_unmap, start, size);
}

void CachingAllocator::release_expandable_segment(Block* block) {
  ExpandableSegment* es = block->expandable;
  MEMPLAN_CHECK(block->size == es->size && !block->mapped, "releasing an expandable segment that is in use");
  block->pool->unmapped.erase(block);
  vm_device_->release_address_range(es->base);
  std::erase_if(expandable_segments_, [es](const std::unique_ptr<ExpandableSegment>& s) { return s.get() == es; });
  delete block;
}

// ---- Introspection --------------------------------------------------------------------------

Bytes CachingAllocator::block_size(const void* ptr) const {
  auto it = active_blocks_.find(reinterpret_cast<DeviceAddress>(ptr));
  MEMPLAN_CHECK(it != active_blocks_.end(), "block_size of a pointer that is not allocated");
  return it->second->size;
}

void CachingAllocator::reset_peak_stats() {
  for (StatArray* s : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& stat : *s) stat.reset_peak();
  }
  stats_.oversize_allocations.reset_peak();
  stats_.oversize_segments.reset_peak();
}

std::map<std::string, std::int64_t> CachingAllocator::memory_stats() const {
  std::map<std::string, std::int64_t> out;
  auto add_stat = [&out](const std::string& name, const Stat& s) {
    out[name + ".current"] = s.current;
    out[name + ".peak"] = s.peak;
    out[name + ".allocated"] = s.allocated;
    out[name + ".freed"] = s.freed;
  };
  const std::pair<const char*, const StatArray*> arrays[] = {
      {"allocation", &stats_.allocation},
      {"segment", &stats_.segment},
      {"active", &stats_.active},
      {"inactive_split", &stats_.inactive_split},
      {"allocated_bytes", &stats_.allocated_bytes},
      {"reserved_bytes", &stats_.reserved_bytes},
      {"active_bytes", &stats_.active_bytes},
      {"inactive_split_bytes", &stats_.inactive_split_bytes},
      {"requested_bytes", &stats_.requested_bytes},
  };
  const char* pool_names[kStatPools] = {"all", "small_pool", "large_pool"};
  for (const auto& [name, array] : arrays) {
    for (int i = 0; i < kStatPools; ++i) {
      add_stat(std::string(name) + "." + pool_names[i], (*array)[static_cast<std::size_t>(i)]);
    }
  }
  add_stat("oversize_allocations", stats_.oversize_allocations);
  add_stat("oversize_segments", stats_.oversize_segments);
  out["num_alloc_retries"] = stats_.num_alloc_retries;
  out["num_ooms"] = stats_.num_ooms;
  out["num_sync_all_streams"] = stats_.num_sync_all_streams;
  out["num_device_alloc"] = stats_.num_device_alloc;
  out["num_device_free"] = stats_.num_device_free;
  out["max_split_size"] = stats_.max_split_size;
  return out;
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  AllocatorSnapshot snap;
  snap.settings.config = options_.to_string();
  snap.settings.max_split_size = stats_.max_split_size;
  snap.settings.garbage_collection_threshold = options_.garbage_collection_threshold;
  snap.settings.expandable_segments = options_.expandable_segments;
  snap.settings.roundup_power2_divisions = options_.roundup_power2_divisions;

  std::vector<const Block*> all;
  for (const auto& [address, block] : active_blocks_) all.push_back(block);
  for (const BlockPool* pool : {small_pool_.get(), large_pool_.get()}) {
    all.insert(all.end(), pool->blocks.begin(), pool->blocks.end());
  }
  // A segment starts at a segment's first block, or (expandable) where a mapped run starts.
  for (const Block* head : all) {
    if (head->prev != nullptr && head->prev->mapped) continue;
    SegmentSnapshot seg;
    seg.address = head->address;
    seg.large_pool = !head->pool->is_small;
    seg.is_expandable = head->expandable != nullptr;
    for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
      BlockSnapshot bs;
      bs.address = b->address;
      bs.size = b->size;
      bs.requested_size = b->allocated ? b->requested_size : 0;
      bs.state = b->allocated ? BlockState::active_allocated : BlockState::inactive;
      seg.total_size += b->size;
      if (b->allocated) {
        seg.allocated_size += b->size;
        seg.active_size += b->size;
        seg.requested_size += b->requested_size;
      }
      seg.blocks.push_back(bs);
    }
    snap.segments.push_back(std::move(seg));
  }
  std::sort(snap.segments.begin(), snap.segments.end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  return snap;
}

}  // namespace memplan::runtime
