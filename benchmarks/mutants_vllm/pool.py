"""Mutants of vLLM's block pool, its free queue, its hash map and its block hashing.

Every edit is to vLLM 0.33.0's installed source (``vllm/v1/core/block_pool.py`` and
``kv_cache_utils.py``); the manager suite reaches all of these functions on every step.
"""

from __future__ import annotations

from mutation import Mutant

POOL = "vllm.v1.core.block_pool:BlockPool"
QUEUE = "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue"
HASH_MAP = "vllm.v1.core.block_pool:BlockHashToBlockMap"
UTILS = "vllm.v1.core.kv_cache_utils"

MUTANTS: tuple[Mutant, ...] = (
    # -- BlockPool.touch -------------------------------------------------------------------
    Mutant("pool.touch.double-ref", f"{POOL}.touch",
           "block.ref_cnt += 1", "block.ref_cnt += 2", "refcount", "manager",
           note="a hit takes two references, so its blocks are never freed"),
    Mutant("pool.touch.keeps-free-hit-queued", f"{POOL}.touch",
           "if block.ref_cnt == 0:", "if False:", "free-queue-end", "manager",
           note="a free hit stays in the free queue while referenced (it can be evicted)"),
    Mutant("pool.touch.touches-null", f"{POOL}.touch",
           "if block.is_null:", "if False:", "skipped-step", "manager",
           note="the null block is touched like any other block",
           equivalent="vLLM 0.33 keeps no reference count for the null block (free_blocks skips it and "
                      "nothing reads it), so a touch of it changes nothing a step can observe"),
    # -- BlockPool.free_blocks ---------------------------------------------------------------
    Mutant("pool.free.frees-referenced", f"{POOL}.free_blocks",
           "if block.ref_cnt == 0:", "if block.ref_cnt <= 1:", "off-by-one", "manager",
           note="a block still referenced by another request goes back to the free queue"),
    Mutant("pool.free.no-decref", f"{POOL}.free_blocks",
           "block.ref_cnt -= 1", "block.ref_cnt -= 0", "refcount", "manager",
           note="freeing keeps the reference, so nothing is ever freed"),
    Mutant("pool.free.unhashed-to-tail", f"{POOL}.free_blocks",
           "self.free_block_queue.prepend_n(blocks_to_evict_first)",
           "self.free_block_queue.append_n(blocks_to_evict_first)", "free-queue-end", "manager",
           note="blocks that never hit are queued behind cached prefixes"),
    Mutant("pool.free.hashed-to-head", f"{POOL}.free_blocks",
           "self.free_block_queue.append_n(blocks_to_evict_last)",
           "self.free_block_queue.prepend_n(blocks_to_evict_last)", "free-queue-end", "manager",
           note="cached prefixes are queued first, so they are evicted first"),
    Mutant("pool.free.hashed-reversed", f"{POOL}.free_blocks",
           "self.free_block_queue.append_n(blocks_to_evict_last)",
           "self.free_block_queue.append_n(blocks_to_evict_last[::-1])", "wrong-order", "manager",
           note="a request's cached blocks are queued in the reverse of the order given"),
    Mutant("pool.free.hashed-as-unhashed", f"{POOL}.free_blocks",
           "if block.block_hash is None or not self.enable_caching:",
           "if block.block_hash is not None or not self.enable_caching:", "wrong-condition", "manager",
           note="cached and uncached blocks swap free-queue ends"),
    # -- BlockPool.get_new_blocks ------------------------------------------------------------
    Mutant("pool.new.refuses-last-free", f"{POOL}.get_new_blocks",
           "if num_blocks > self.get_num_free_blocks():", "if num_blocks >= self.get_num_free_blocks():",
           "off-by-one", "manager",
           note="a request for exactly the free blocks is refused"),
    Mutant("pool.new.keeps-stale-hash", f"{POOL}.get_new_blocks",
           "self._maybe_evict_cached_block(block)", "pass", "stale-hash", "manager",
           note="a reused block stays in the prefix cache under its old hash"),
    Mutant("pool.new.reversed", f"{POOL}.get_new_blocks",
           "self.free_block_queue.popleft_n(num_blocks)", "self.free_block_queue.popleft_n(num_blocks)[::-1]",
           "wrong-order", "manager",
           note="new blocks are handed out in the reverse of free-queue order"),
    # -- BlockPool hashes ----------------------------------------------------------------------
    Mutant("pool.remove-hashes.keeps-block-hash", f"{POOL}._remove_cached_block_hashes",
           "block.reset_hash()", "pass", "stale-hash", "manager",
           note="an evicted block keeps its hash"),
    Mutant("pool.evict.ignores-request", f"{POOL}.evict_blocks",
           "self._maybe_evict_cached_block(block)", "pass", "skipped-step", "manager",
           note="evicting blocks by id leaves them in the prefix cache"),
    Mutant("pool.reset.with-one-block-in-use", f"{POOL}.reset_prefix_cache",
           "if num_used_blocks != 1:", "if num_used_blocks > 2:", "off-by-one", "manager",
           note="the cache is reset while one request still holds a block"),
    Mutant("pool.reset.keeps-block-hashes", f"{POOL}.reset_prefix_cache",
           "block.reset_hash()", "pass", "stale-hash", "manager",
           note="a reset empties the hash map but leaves every block's hash",
           equivalent="a reset needs every block free; a free block's own hash is read only when it is "
                      "allocated or evicted, and both clear it after looking it up in the emptied map"),
    Mutant("pool.cached.partial-group-hit", f"{POOL}.get_cached_block",
           "return None", "continue", "wrong-group", "hybrid",
           note="a hash cached in some of the groups asked for counts as a hit"),
    # -- BlockPool.cache_full_blocks -----------------------------------------------------------
    Mutant("pool.cache.skips-last-new-block", f"{POOL}.cache_full_blocks",
           "new_full_blocks = blocks[num_cached_blocks:num_full_blocks]",
           "new_full_blocks = blocks[num_cached_blocks:num_full_blocks - 1]", "off-by-one", "manager",
           note="the last block that became full is never cached"),
    Mutant("pool.cache.hash-shifted", f"{POOL}.cache_full_blocks",
           "block_hash = new_block_hashes[i]", "block_hash = new_block_hashes[i - 1 if i else i]",
           "off-by-one", "manager",
           note="each new block after the first is cached under its predecessor's hash"),
    Mutant("pool.cache.group-zero", f"{POOL}.cache_full_blocks",
           "block_hash, kv_cache_group_id", "block_hash, 0", "wrong-group", "hybrid",
           note="every group's blocks are cached under group 0"),
    Mutant("pool.cache.ignores-mask", f"{POOL}.cache_full_blocks",
           "if blk.is_null or (block_mask is not None and not block_mask[i]):", "if blk.is_null:",
           "skipped-step", "manager",
           note="blocks a sliding window can never hit are cached anyway"),
    # -- FreeKVCacheBlockQueue -----------------------------------------------------------------
    Mutant("queue.prepend.reversed", f"{QUEUE}.prepend_n",
           "for block in blocks:", "for block in reversed(blocks):", "wrong-order", "manager",
           note="blocks put at the head are queued in the reverse of the order given"),
    Mutant("queue.append-n.reversed", f"{QUEUE}.append_n",
           "for block in blocks:", "for block in reversed(blocks):", "wrong-order", "manager",
           note="blocks put at the tail are queued in the reverse of the order given"),
    Mutant("queue.popleft-n.count-one-short", f"{QUEUE}.popleft_n",
           "self.num_free_blocks -= n", "self.num_free_blocks -= n - 1", "off-by-one", "manager",
           note="the free count drifts up by one on every multi-block allocation"),
    Mutant("queue.remove.no-count", f"{QUEUE}.remove",
           "self.num_free_blocks -= 1", "pass", "refcount", "manager",
           note="a hit taken out of the free queue still counts as free"),
    # -- BlockHashToBlockMap -----------------------------------------------------------------
    Mutant("hash-map.insert.replaces-duplicate", f"{HASH_MAP}.insert",
           "self._cache[key] = {blocks.block_id: blocks, block.block_id: block}", "self._cache[key] = block",
           "stale-hash", "manager",
           note="a second block under one hash replaces the first in the map"),
    Mutant("hash-map.pop.keeps-mismatch-out", f"{HASH_MAP}.pop",
           "self._cache[key] = blocks", "pass", "stale-hash", "manager", occurrence=0,
           note="popping a hash for another block drops the block the hash maps to",
           equivalent="pop's only caller, BlockPool._remove_cached_block_hashes, pops the block's own keys "
                      "(block_hash and cached_block_hashes_by_block), and every path that lists a block under "
                      "a key records the key on the block and the other way round (_insert_block_hash, "
                      "_remove_cached_block_hashes, move_block_hashes, reset_prefix_cache: KV-POOL-015), so a "
                      "lone block under the key is always the one popped and the branch is never taken"),
    # -- block hashing -------------------------------------------------------------------------
    Mutant("hash.block.ignores-parent", f"{UTILS}:hash_block_tokens",
           "if not parent_block_hash:", "if True:", "stale-hash", "manager",
           note="a block's hash does not chain over its prefix"),
)
