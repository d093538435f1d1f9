// KvPool and KvCacheManager (serve/kv_cache.h).
#include "memplan/serve/kv_cache.h"

#include <algorithm>
#include <string>

#include "memplan/common/check.h"

namespace memplan::serve {

std::string_view kv_layout_name(KvLayout layout) { return enum_name(kKvLayoutNames, layout); }

Result<KvPool> KvPool::allocate(runtime::Device& device, const KvPoolShape& shape) {
  MEMPLAN_CHECK(shape.layers > 0 && shape.width > 0 && shape.block_size > 0 && shape.blocks > 0 &&
                    (shape.caches == 1 || shape.caches == 2),
                "a KV pool needs positive layers, width, block size and blocks, and one or two caches a layer");
  Result<void*> base = device.allocate(shape.pool_bytes());
  if (!base) {
    return Error{"cannot allocate the KV cache pool of " + std::to_string(shape.pool_bytes()) + " bytes (" +
                 std::to_string(shape.blocks) + " blocks): " + base.error().message};
  }
  KvPool pool(device, shape, base.value());
  pool.staging_.resize(static_cast<std::size_t>(shape.block_size * shape.width * shape.element_bytes));
  return pool;
}

KvPool::KvPool(KvPool&& other) noexcept
    : device_(other.device_), shape_(other.shape_), base_(other.base_), staging_(std::move(other.staging_)) {
  other.base_ = nullptr;
}

KvPool::~KvPool() {
  if (base_ != nullptr) device_->deallocate(base_, shape_.pool_bytes());
}

void* KvPool::cache(std::int64_t layer, bool value) const {
  MEMPLAN_CHECK(layer >= 0 && layer < shape_.layers, "no layer " << layer << " in the KV pool");
  MEMPLAN_CHECK(!value || shape_.caches == 2, "the KV pool holds one (latent) cache a layer, no value cache");
  const Bytes cache_bytes = shape_.blocks * shape_.block_size * shape_.width * shape_.element_bytes;
  return static_cast<std::byte*>(base_) + (shape_.caches * layer + (value ? 1 : 0)) * cache_bytes;
}

void KvPool::copy_block(std::int64_t src, std::int64_t dst) {
  const Bytes bytes = static_cast<Bytes>(staging_.size());
  for (std::int64_t l = 0; l < shape_.layers; ++l) {
    for (std::int64_t c = 0; c < shape_.caches; ++c) {
      auto* base = static_cast<std::byte*>(cache(l, c == 1));
      device_->copy_to_host(staging_.data(), base + src * bytes, bytes);
      device_->copy_from_host(base + dst * bytes, staging_.data(), bytes);
    }
  }
}

KvCacheManager::KvCacheManager(KvLayout layout, const KvPoolShape& shape, std::int64_t context)
    : layout_(layout),
      shape_(shape),
      context_(context),
      table_width_((context + shape.block_size - 1) / shape.block_size),
      refs_(static_cast<std::size_t>(shape.blocks), 0),
      filled_(static_cast<std::size_t>(shape.blocks), 0),
      prefix_key_of_(static_cast<std::size_t>(shape.blocks), nullptr) {
  MEMPLAN_CHECK(shape.block_size > 0 && context > 0, "KV cache manager: block size and context must be positive");
  if (layout_ == KvLayout::paged) {
    for (std::int32_t b = 0; b < shape.blocks; ++b) free_.push_back(b);
  } else {
    for (std::int64_t s = 0; s < slabs(); ++s) free_slabs_.push_back(s);
  }
}

std::int32_t KvCacheManager::take_block() {
  const std::int32_t b = free_.front();
  free_.pop_front();
  forget_prefix(b);  // its old contents are about to be overwritten
  refs_[static_cast<std::size_t>(b)] = 1;
  filled_[static_cast<std::size_t>(b)] = 0;
  return b;
}

void KvCacheManager::forget_prefix(std::int32_t block) {
  const auto b = static_cast<std::size_t>(block);
  if (prefix_key_of_[b] == nullptr) return;
  prefix_blocks_.erase(*prefix_key_of_[b]);
  prefix_key_of_[b] = nullptr;
}

void KvCacheManager::drop_block(std::int32_t block) {
  const auto b = static_cast<std::size_t>(block);
  MEMPLAN_CHECK(refs_[b] > 0, "block " << block << " released more often than taken");
  if (--refs_[b] > 0) return;
  // Free, but a block holding a prompt prefix keeps its contents and registration until it is
  // taken again: freed blocks queue behind the others, so a prefix outlives its sequence as long
  // as the pool allows (vLLM's cached free blocks).
  if (prefix_key_of_[b] == nullptr) {
    filled_[b] = 0;
    free_.push_front(block);
  } else {
    free_.push_back(block);
  }
}

std::optional<std::int64_t> KvCacheManager::admit(SeqId id, const std::vector<std::int32_t>& tokens) {
  MEMPLAN_CHECK(!seqs_.contains(id), "sequence " << id << " admitted twice");
  const auto n = static_cast<std::int64_t>(tokens.size());
  MEMPLAN_CHECK(n >= 1 && n <= context_, "a sequence of " << n << " tokens in a context of " << context_);
  Seq seq;
  seq.table.assign(static_cast<std::size_t>(table_width_), -1);
  if (layout_ == KvLayout::contiguous) {
    if (free_slabs_.empty()) return std::nullopt;
    seq.slab = free_slabs_.front();
    free_slabs_.erase(free_slabs_.begin());
    for (std::int64_t i = 0; i < table_width_; ++i) {
      const auto b = static_cast<std::int32_t>(seq.slab * table_width_ + i);
      seq.table[static_cast<std::size_t>(i)] = b;
      refs_[static_cast<std::size_t>(b)] = 1;
      filled_[static_cast<std::size_t>(b)] = 0;
    }
    seqs_.emplace(id, std::move(seq));
    return 0;
  }
  // Paged: the leading blocks whose positions already hold exactly these tokens are shared.
  const std::int64_t bs = shape_.block_size;
  std::vector<std::int32_t> shared;
  std::int64_t shared_tokens = 0;
  for (std::int64_t i = 0; i * bs < n; ++i) {
    const std::int64_t end = std::min((i + 1) * bs, n);
    const auto it = prefix_blocks_.find(std::vector<std::int32_t>(tokens.begin(), tokens.begin() + end));
    if (it == prefix_blocks_.end()) break;
    shared.push_back(it->second);
    shared_tokens = end;
  }
  // The last position is always computed (its logits give the next token); when it lies in a
  // shared block, that block is copied first.
  const std::int64_t cached = std::min(shared_tokens, n - 1);
  const std::int64_t needed =
      (n + bs - 1) / bs - static_cast<std::int64_t>(shared.size()) + (shared_tokens == n ? 1 : 0);
  std::int64_t revived = 0;  // shared blocks now in the free queue (their sequences ended)
  for (std::int32_t b : shared) revived += refs_[static_cast<std::size_t>(b)] == 0 ? 1 : 0;
  if (static_cast<std::int64_t>(free_.size()) - promised_ < needed + revived) return std::nullopt;
  for (std::size_t i = 0; i < shared.size(); ++i) {
    seq.table[i] = shared[i];
    if (refs_[static_cast<std::size_t>(shared[i])]++ == 0) free_.erase(std::find(free_.begin(), free_.end(), shared[i]));
  }
  seq.tokens = tokens;
  seq.promised = needed;
  promised_ += needed;
  counters_.shared_prefix_tokens += cached;
  seqs_.emplace(id, std::move(seq));
  return cached;
}

bool KvCacheManager::ensure(SeqId id, std::int64_t pos, KvPool* pool) {
  auto it = seqs_.find(id);
  MEMPLAN_CHECK(it != seqs_.end(), "no sequence " << id);
  MEMPLAN_CHECK(pos >= 0 && pos < context_, "position " << pos << " outside the context of " << context_);
  if (layout_ == KvLayout::contiguous) return true;
  Seq& seq = it->second;
  std::int32_t& entry = seq.table[static_cast<std::size_t>(pos / shape_.block_size)];
  const bool fresh = entry < 0;
  // Copy before writing into a block another sequence holds, or over a position of a prompt
  // prefix the block is registered for (that content stays as registered for later prompts).
  const std::vector<std::int32_t>* key = fresh ? nullptr : prefix_key_of_[static_cast<std::size_t>(entry)];
  const bool shared = !fresh && (refs_[static_cast<std::size_t>(entry)] > 1 ||
                                 (key != nullptr && pos < static_cast<std::int64_t>(key->size())));
  if (!fresh && !shared) return true;
  if (free_.empty()) return false;
  const std::int32_t block = take_block();
  if (seq.promised > 0) {
    --seq.promised;
    --promised_;
  }
  if (shared) {
    MEMPLAN_CHECK(pool != nullptr, "copy-on-write needs the pool");
    pool->copy_block(entry, block);
    filled_[static_cast<std::size_t>(block)] = static_cast<std::int32_t>(pos % shape_.block_size);
    drop_block(entry);
    ++counters_.copy_on_write;
  }
  entry = block;
  return true;
}

void KvCacheManager::filled(SeqId id, std::int64_t n) {
  auto it = seqs_.find(id);
  MEMPLAN_CHECK(it != seqs_.end() && n >= 1, "no sequence " << id);
  Seq& seq = it->second;
  const std::int64_t bs = shape_.block_size, i = (n - 1) / bs;
  const std::int32_t block = seq.table[static_cast<std::size_t>(i)];
  MEMPLAN_CHECK(block >= 0, "position " << n - 1 << " of sequence " << id << " has no block");
  std::int32_t& f = filled_[static_cast<std::size_t>(block)];
  f = std::max<std::int32_t>(f, static_cast<std::int32_t>((n - 1) % bs + 1));
  if (layout_ != KvLayout::paged) return;
  // A block whose positions all hold admission-time tokens can be shared from now on.
  const auto known = static_cast<std::int64_t>(seq.tokens.size());
  if (n > known || n != std::min((i + 1) * bs, known)) return;
  if (prefix_key_of_[static_cast<std::size_t>(block)] != nullptr) return;
  auto [entry, inserted] =
      prefix_blocks_.emplace(std::vector<std::int32_t>(seq.tokens.begin(), seq.tokens.begin() + n), block);
  if (inserted) prefix_key_of_[static_cast<std::size_t>(block)] = &entry->first;
}

void KvCacheManager::release(SeqId id) {
  auto it = seqs_.find(id);
  MEMPLAN_CHECK(it != seqs_.end(), "no sequence " << id);
  Seq& seq = it->second;
  if (layout_ == KvLayout::contiguous) {
    for (std::int32_t b : seq.table) {
      refs_[static_cast<std::size_t>(b)] = 0;
      filled_[static_cast<std::size_t>(b)] = 0;
    }
    free_slabs_.insert(std::lower_bound(free_slabs_.begin(), free_slabs_.end(), seq.slab), seq.slab);
  } else {
    for (std::int32_t b : seq.table) {
      if (b >= 0) drop_block(b);
    }
    promised_ -= seq.promised;
  }
  seqs_.erase(it);
}

const std::vector<std::int32_t>& KvCacheManager::block_table(SeqId id) const {
  auto it = seqs_.find(id);
  MEMPLAN_CHECK(it != seqs_.end(), "no sequence " << id);
  return it->second.table;
}

std::int64_t KvCacheManager::free_blocks() const {
  return layout_ == KvLayout::paged ? static_cast<std::int64_t>(free_.size())
                                    : static_cast<std::int64_t>(free_slabs_.size()) * table_width_;
}

Bytes KvCacheManager::reserved_bytes() const {
  std::int64_t held = 0;
  for (std::int32_t r : refs_) held += r > 0 ? 1 : 0;
  return held * shape_.block_bytes();
}

Bytes KvCacheManager::token_bytes() const {
  std::int64_t tokens = 0;
  for (std::size_t b = 0; b < refs_.size(); ++b) {
    if (refs_[b] > 0) tokens += filled_[b];
  }
  return tokens * shape_.token_bytes();
}

}  // namespace memplan::serve
