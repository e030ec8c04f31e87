"""Mutants of vLLM's single-type KV-cache managers (one manager per KV-cache group).

Every edit is to vLLM 0.33.0's installed ``vllm/v1/core/single_type_kv_cache_manager.py``:
the shared base class (admission count, hit adoption, allocation, freeing, the window's
freeing loop), full attention, sliding window (with its EAGLE and alignment steps), chunked
local attention, and Mamba in its "none" cache mode. Mamba's "align" mode is not specified
yet, so none of its code is mutated here (the list at the end names it).
"""

from __future__ import annotations

from mutation import Mutant

MODULE = "vllm.v1.core.single_type_kv_cache_manager"
BASE = f"{MODULE}:SingleTypeKVCacheManager"
FULL = f"{MODULE}:FullAttentionManager"
SWA = f"{MODULE}:SlidingWindowManager"
CHUNKED = f"{MODULE}:ChunkedLocalAttentionManager"
MAMBA = f"{MODULE}:MambaManager"

MUTANTS: tuple[Mutant, ...] = (
    # -- SingleTypeKVCacheManager: admission count ---------------------------------------------
    Mutant("single-type.num-to-allocate.floor-plus-one", f"{BASE}.get_num_blocks_to_allocate",
           "num_required_blocks = cdiv(num_tokens, self.block_size)",
           "num_required_blocks = num_tokens // self.block_size + 1", "off-by-one", "manager",
           note="a request ending on a block boundary asks for one block too many and is refused "
                "when the pool holds exactly enough"),
    Mutant("single-type.num-to-allocate.ignores-evictable-hits", f"{BASE}.get_num_blocks_to_allocate",
           "return num_new_blocks + num_evictable_blocks", "return num_new_blocks", "skipped-step", "manager",
           note="hit blocks taken out of the free queue are not counted, so admission over-commits the pool"),
    # -- SingleTypeKVCacheManager: adopting a hit ----------------------------------------------
    Mutant("single-type.add-computed.no-touch", f"{BASE}.add_local_computed_blocks",
           "self.block_pool.touch(new_computed_blocks)", "pass", "refcount", "manager",
           note="adopted hit blocks take no reference and stay in the free queue"),
    Mutant("single-type.add-computed.no-null-padding", f"{BASE}.add_local_computed_blocks",
           "req_blocks.extend([self._null_block] * num_skipped_blocks)", "pass", "skipped-step", "manager",
           note="a hit past the window loses its leading null blocks, so the table is shifted left"),
    # -- SingleTypeKVCacheManager: allocation and freeing ------------------------------------
    Mutant("single-type.allocate.floor-blocks", f"{BASE}.allocate_new_blocks",
           "num_required_blocks = cdiv(num_tokens, self.block_size)",
           "num_required_blocks = num_tokens // self.block_size", "off-by-one", "manager",
           note="the last, partly filled block is not allocated"),
    Mutant("single-type.free.forward-order", f"{BASE}.free",
           "reversed(self.pop_blocks_for_free(request_id))", "self.pop_blocks_for_free(request_id)",
           "wrong-order", "manager",
           note="a finished request's blocks are freed head first, so its prefix is evicted before its tail"),
    Mutant("single-type.pop.keeps-cached-count", f"{BASE}.pop_blocks_for_free",
           "self.num_cached_block.pop(request_id, None)", "pass", "skipped-step", "manager",
           note="a preempted request comes back with its old cached-block count and is taken for a "
                "running one"),
    Mutant("single-type.remove-range.head-first", f"{BASE}._remove_blocks_in_range",
           "self.block_pool.free_blocks(freed)", "self.block_pool.free_blocks(freed[::-1])",
           "free-queue-end", "manager",
           note="blocks leaving the window are queued in the opposite order, so the wrong one is "
                "evicted first"),
    Mutant("single-type.remove-skipped.ceil-blocks", f"{BASE}.remove_skipped_blocks",
           "num_skipped_tokens // self.block_size", "cdiv(num_skipped_tokens, self.block_size)",
           "off-by-one", "manager",
           note="a block only partly outside the window is freed while the window still reads it"),
    # -- FullAttentionManager ----------------------------------------------------------------------
    Mutant("full.hit.ceil-bound", f"{FULL}.find_longest_cache_hit",
           "max_length // block_size)", "cdiv(max_length, block_size))", "off-by-one", "hybrid",
           note="the hit may cover the block holding the last prompt token, past the lookup bound"),
    Mutant("full.hit.keeps-single-eagle-block", f"{FULL}.find_longest_cache_hit",
           "if drop_eagle_block and hit_length > 0:", "if drop_eagle_block and hit_length > block_size:",
           "off-by-one", "hybrid",
           note="with EAGLE a hit of exactly one block keeps it instead of recomputing it"),
    Mutant("full.partial-tail.eagle-limit", f"{FULL}._cache_partial_tail_block",
           "else request.num_prompt_tokens - 1", "else request.num_prompt_tokens", "off-by-one", "manager",
           note="without EAGLE the partial tail entry is keyed at the whole prompt, a boundary a "
                "resend never looks up",
           equivalent="without EAGLE nothing reads a partial tail entry in any configuration kvoracle "
                      "specifies: the hybrid coordinator caches only whole scheduler blocks, so the two "
                      "boundaries differ only for a prompt of whole scheduler blocks, where the right "
                      "boundary lies in the last block, already cached under its full key; an entry "
                      "inside a block is looked up only by fine-grained partial hash hits "
                      "(enable_partial_hash_hits), which need an align-mode Mamba group coarser than "
                      "the hash block, a configuration KV-MAMBA-003 leaves unspecified (read in vLLM "
                      "0.33.0, and traced: the entry is registered for an 8-token prompt with blocks "
                      "of 2 and 4 tokens, and for no other length)"),
    # -- SlidingWindowManager -------------------------------------------------------------------------
    Mutant("swa.skipped-tokens.window-plus-one", f"{SWA}.get_num_skipped_tokens",
           "- self.sliding_window + 1", "- self.sliding_window", "off-by-one", "manager",
           note="the window is taken one token wider, so a block leaving it is freed one step late"),
    Mutant("swa.contiguous.full-window", f"{SWA}._contiguous_blocks_for_hit",
           "cdiv(window_size - 1, block_size)", "cdiv(window_size, block_size)", "off-by-one", "hybrid",
           note="a hit demands a run covering the whole window instead of window - 1 tokens"),
    Mutant("swa.contiguous.no-eagle-block", f"{SWA}._contiguous_blocks_for_hit",
           "blocks += 1", "blocks += 0", "skipped-step", "hybrid",
           note="with EAGLE the run is not lengthened by the block the drop removes"),
    Mutant("swa.hit.miss-keeps-run", f"{SWA}.find_longest_cache_hit",
           "num_contiguous_blocks = 0", "pass", "wrong-condition", "hybrid", occurrence=1,
           note="a missing block does not end the run, so cached blocks around a gap count as contiguous"),
    Mutant("swa.hit.alignment-ignores-eagle", f"{SWA}.find_longest_cache_hit",
           "post_pop_blocks = i if drop_eagle_block else i + 1", "post_pop_blocks = i + 1",
           "skipped-step", "hybrid",
           note="with EAGLE the run's end is checked against the alignment before the drop, not after"),
    Mutant("swa.hit.no-realign-after-eagle", f"{SWA}.find_longest_cache_hit",
           "and len(computed_blocks[0]) * block_size % alignment_tokens != 0", "and False",
           "skipped-step", "hybrid", occurrence=1,
           note="after the EAGLE drop the hit is not rounded back down to the alignment"),
    Mutant("swa.mask.one-block-short", f"{SWA}.reachable_block_mask",
           "(i - shift) % per_segment >= per_segment - need", "(i - shift) % per_segment > per_segment - need",
           "off-by-one", "manager",
           note="each segment caches one block fewer than a hit at its boundary needs"),
    Mutant("swa.mask.no-eagle-shift", f"{SWA}.reachable_block_mask",
           "shift = 1 if use_eagle else 0", "shift = 0", "skipped-step", "manager",
           note="with EAGLE the cached tail ends on the boundary instead of one block past it"),
    # -- ChunkedLocalAttentionManager -----------------------------------------------------------
    Mutant("chunked.hit.chunk-start-before-bound", f"{CHUNKED}.find_longest_cache_hit",
           "max_length\n            // kv_cache_spec.attention_chunk_size",
           "(max_length - 1)\n            // kv_cache_spec.attention_chunk_size", "off-by-one", "hybrid",
           note="a bound on a chunk boundary looks the previous chunk up instead of marking it all null"),
    Mutant("chunked.skipped-tokens.previous-chunk", f"{CHUNKED}.get_num_skipped_tokens",
           "num_computed_tokens // self.attention_chunk_size",
           "(num_computed_tokens - 1) // self.attention_chunk_size", "off-by-one", "manager",
           note="a request exactly at a chunk boundary keeps the finished chunk's blocks"),
    # -- MambaManager ("none" mode; the lookup is mode-free) -----------------------------------------
    Mutant("mamba.skipped-tokens.drops-last-state", f"{MAMBA}.get_num_skipped_tokens",
           "return num_computed_tokens - 1", "return num_computed_tokens", "off-by-one", "manager",
           note="at a block boundary the block holding the running state is freed too"),
    Mutant("mamba.hit.alignment-off-by-one", f"{MAMBA}.find_longest_cache_hit",
           "(i + 1) * block_size % alignment_tokens != 0", "i * block_size % alignment_tokens != 0",
           "off-by-one", "hybrid",
           note="a state is accepted when it starts, not ends, on an aligned boundary"),
)

# Out of scope: code reached only with Mamba's "align" cache mode (or the fine-grained hash
# hits that need it), which the suites do not specify yet (KV-MAMBA-003):
#   MambaManager.get_num_blocks_to_allocate / allocate_new_blocks, their "align" branches
#     (checkpoint reservation, relocation of speculative blocks, CoW of a partial hit);
#   MambaManager._needs_internal_checkpoint, _relocate_speculative_block,
#     _cache_partial_tail_block, finalize_partial_tail_offload, reachable_block_mask (sparse
#     retention), the "align" parts of _remove_blocks_in_range, remove_skipped_blocks,
#     pop_blocks_for_free and cache_blocks (boundary-state offloads);
#   MambaManager.get_num_blocks_to_allocate's same-step hit deferral (cached_blocks_this_step:
#     needs prefix caching, hence "align");
#   MambaManager.find_longest_cache_hit's fine-grained branch (alignment below the block size);
#   SingleTypeKVCacheManager._has_partial_local_hit, _apply_cow and the partial-hit parts of
#     get_num_blocks_to_allocate / add_local_computed_blocks / allocate_new_blocks, and
#     FullAttentionManager.find_longest_cache_hit's phase 2 (fine-grained interior probes):
#     partial hash hits are enabled only with a Mamba group in "align" mode.
# Not mutable here: methods that call a zero-argument super() carry a __class__ cell, which
# mutation.py refuses to recompile -- so MambaManager's "none" branches of
# get_num_blocks_to_allocate and allocate_new_blocks (the speculative state blocks), its
# remove_skipped_blocks and cache_blocks, and FullAttentionManager.cache_blocks.
# Not generated by the suites either: retention_interval (sparse SWA retention and the
# shared-prefix boundaries of cache_blocks), extra_retained_tokens (multi-module MTP), DCP/PCP,
# RSWAManager, CircularBufferManager, CrossAttentionManager's lookup, SinkFullAttentionManager
# and the HiSparse managers.
