// The KV cache of generation: one pool of fixed-size blocks allocated once on the device (every
// layer's keys and values), and a manager that hands blocks to sequences through block tables.
// Two layouts over the same pool: contiguous (each sequence reserves a slab of blocks for the
// model's whole context when admitted: the baseline) and paged (blocks taken one at a time as a
// sequence grows, freed when it ends, and blocks holding a common prompt prefix shared between
// sequences by reference count, copied on the first write, and kept for later prompts after
// their sequence ends until the pool needs them: vLLM's scheme). The manager is host
// bookkeeping; the decode step (models/gpt_decode.h) reads and writes the pool.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "memplan/common/enum_names.h"
#include "memplan/common/result.h"
#include "memplan/common/types.h"
#include "memplan/runtime/device.h"

namespace memplan::serve {

enum class KvLayout { contiguous, paged };
inline constexpr EnumName<KvLayout> kKvLayoutNames[] = {{"contiguous", KvLayout::contiguous},
                                                        {"paged", KvLayout::paged}};
std::string_view kv_layout_name(KvLayout layout);

// The pool's geometry: `blocks` blocks of `block_size` positions; a position holds a key and a
// value row (or, with caches = 1, multi-head latent attention's one row) of `width` elements of
// `element_bytes` for each of `layers` layers.
struct KvPoolShape {
  std::int64_t layers = 1;
  std::int64_t width = 1;  // elements per position, layer and cache (NKV * HD; MLA: kv_lora_rank + qk_rope)
  std::int64_t caches = 2;  // per layer: K and V, or 1 (MLA)
  std::int64_t block_size = 16;
  std::int64_t blocks = 0;
  Bytes element_bytes = 4;

  Bytes token_bytes() const { return caches * layers * width * element_bytes; }  // one position, every cache and layer
  Bytes block_bytes() const { return token_bytes() * block_size; }
  Bytes pool_bytes() const { return block_bytes() * blocks; }
  // The blocks `kv_memory` holds.
  static std::int64_t blocks_in(Bytes kv_memory, Bytes block_bytes) { return block_bytes > 0 ? kv_memory / block_bytes : 0; }
};

// One device allocation holding layer l's key cache and value cache (or its one latent cache),
// each [blocks, block_size, width], one after the other.
class KvPool {
 public:
  static Result<KvPool> allocate(runtime::Device& device, const KvPoolShape& shape);
  KvPool(KvPool&& other) noexcept;
  KvPool& operator=(KvPool&&) = delete;
  KvPool(const KvPool&) = delete;
  ~KvPool();

  const KvPoolShape& shape() const { return shape_; }
  // Layer `layer`'s key cache, or value cache (two caches a layer only).
  void* cache(std::int64_t layer, bool value) const;
  // Copies block `src` into block `dst` in every layer's caches (copy-on-write), through a host
  // buffer held since allocation: no device allocation.
  void copy_block(std::int64_t src, std::int64_t dst);

 private:
  KvPool(runtime::Device& device, const KvPoolShape& shape, void* base)
      : device_(&device), shape_(shape), base_(base) {}
  runtime::Device* device_;
  KvPoolShape shape_;
  void* base_ = nullptr;
  std::vector<std::byte> staging_;  // one block of one layer's cache
};

using SeqId = std::int64_t;

// Counters a run reports (copy-on-write copies, prompt positions found in shared blocks).
struct KvCounters {
  std::int64_t copy_on_write = 0;
  std::int64_t shared_prefix_tokens = 0;
};

// Block tables for sequences over a pool of `shape.blocks` blocks. Positions are written in order:
// the caller asks ensure(id, pos) before the decode step writes position pos, and filled(id, n)
// after it, once positions < n hold their keys and values.
class KvCacheManager {
 public:
  // `context`: the most positions one sequence holds (the model's context).
  KvCacheManager(KvLayout layout, const KvPoolShape& shape, std::int64_t context);

  KvLayout layout() const { return layout_; }
  std::int64_t table_width() const { return table_width_; }  // block-table entries per sequence
  // Sequences of a full context the pool holds at once in the contiguous layout.
  std::int64_t slabs() const { return layout_ == KvLayout::contiguous ? shape_.blocks / table_width_ : 0; }

  // Starts sequence `id` whose first positions will hold `tokens` (a prompt, or a preempted
  // sequence's prompt and output so far), when the pool has room for them (contiguous: a free
  // slab; paged: blocks for every position not already cached, beyond those other admitted
  // sequences are still promised). Returns how many leading positions are already cached in
  // shared blocks (paged; at most tokens.size() - 1, so the last position is always computed and
  // its logits seen), or nothing when there is no room.
  std::optional<std::int64_t> admit(SeqId id, const std::vector<std::int32_t>& tokens);
  // Makes position `pos` of `id` writable: a new block at a block boundary, a private copy of a
  // shared block or of one whose registered prompt prefix covers `pos` (copy-on-write through
  // `pool`). False when no block is free.
  bool ensure(SeqId id, std::int64_t pos, KvPool* pool);
  // Positions < n of `id` hold their keys and values now; complete prompt blocks become shareable.
  void filled(SeqId id, std::int64_t n);
  // The sequence ended or was preempted: its blocks go back to the pool (shared ones when their
  // last holder lets go).
  void release(SeqId id);

  // `id`'s block table, table_width() entries, -1 past its blocks.
  const std::vector<std::int32_t>& block_table(SeqId id) const;
  std::int64_t free_blocks() const;
  // Bytes of blocks held by sequences, and of positions in them that hold a token (a shared block
  // counts once).
  Bytes reserved_bytes() const;
  Bytes token_bytes() const;
  const KvCounters& counters() const { return counters_; }

 private:
  struct Seq {
    std::vector<std::int32_t> table;
    std::vector<std::int32_t> tokens;  // known tokens at admission (prefix-sharing keys)
    std::int64_t promised = 0;         // blocks admission counted on that are not taken yet
    std::int64_t slab = -1;
  };
  std::int32_t take_block();
  void drop_block(std::int32_t block);
  void forget_prefix(std::int32_t block);

  KvLayout layout_;
  KvPoolShape shape_;
  std::int64_t context_;
  std::int64_t table_width_;
  std::map<SeqId, Seq> seqs_;
  std::vector<std::int32_t> refs_;    // per block: sequences holding it
  std::vector<std::int32_t> filled_;  // per block: leading positions holding a token
  std::deque<std::int32_t> free_;     // paged: free blocks, lowest first at start
  std::vector<std::int64_t> free_slabs_;  // contiguous
  std::int64_t promised_ = 0;
  // paged prefix sharing: the tokens a block's positions (and all before them) hold -> the block;
  // only blocks whose positions are all filled with a prompt's tokens, held or free but not
  // taken since
  std::map<std::vector<std::int32_t>, std::int32_t> prefix_blocks_;
  std::vector<const std::vector<std::int32_t>*> prefix_key_of_;  // per block: its key in prefix_blocks_, or nullptr
  KvCounters counters_;
};

}  // namespace memplan::serve
