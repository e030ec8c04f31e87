"""Mutants of vLLM's KV-cache coordinators and of the KVCacheManager above them.

Every edit is to vLLM 0.33.0's installed source (``vllm/v1/core/kv_cache_coordinator.py``
and ``kv_cache_manager.py``): the unitary and base coordinator (``coordinator.``), the
hybrid coordinator's cache-hit loop and cacheable-prefix rule (``hybrid-coordinator.``) and
the manager's lookup and allocation (``manager.``). The manager suite reaches the manager,
the base coordinator and the hybrid coordinator's caching; the hybrid suite drives the
hybrid cache-hit lookup directly.
"""

from __future__ import annotations

from mutation import Mutant

COORDINATOR = "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator"
UNITARY = "vllm.v1.core.kv_cache_coordinator:UnitaryKVCacheCoordinator"
HYBRID = "vllm.v1.core.kv_cache_coordinator:HybridKVCacheCoordinator"
MANAGER = "vllm.v1.core.kv_cache_manager:KVCacheManager"

MUTANTS: tuple[Mutant, ...] = (
    # -- UnitaryKVCacheCoordinator.find_longest_cache_hit ----------------------------------------
    Mutant("coordinator.unitary-hit.no-eagle-drop", f"{UNITARY}.find_longest_cache_hit",
           "drop_eagle_block=0 in self.drop_eagle_group_ids", "drop_eagle_block=False",
           "skipped-step", "manager",
           note="with EAGLE, a one-group hit keeps its last block instead of recomputing it"),
    Mutant("coordinator.unitary-hit.bound-plus-one", f"{UNITARY}.find_longest_cache_hit",
           "max_length=max_cache_hit_length,", "max_length=max_cache_hit_length + 1,",
           "off-by-one", "manager",
           note="the hit bound is one token too high, so a block-aligned prompt hits in full"),
    # -- KVCacheCoordinator (base) -----------------------------------------------------------------
    Mutant("coordinator.blocks-to-allocate.last-group-only", f"{COORDINATOR}.get_num_blocks_to_allocate",
           "num_blocks_to_allocate += manager.get_num_blocks_to_allocate(",
           "num_blocks_to_allocate = manager.get_num_blocks_to_allocate(", "wrong-group", "manager",
           occurrence=1,
           note="the free-block check counts only the last group's blocks, so it admits what cannot fit"),
    Mutant("coordinator.new-computed.group-zero-hit", f"{COORDINATOR}.allocate_new_computed_blocks",
           "new_computed_blocks[i],", "new_computed_blocks[0],", "wrong-group", "manager",
           note="every group adopts the first group's hit blocks as its own"),
    Mutant("coordinator.new-blocks.no-lookahead-slots", f"{COORDINATOR}.allocate_new_blocks",
           "else num_tokens,", "else num_tokens_main_model,", "skipped-step", "manager",
           note="new blocks cover the main model's tokens only, not the lookahead slots"),
    Mutant("coordinator.cache.group-zero-cacheable", f"{COORDINATOR}.cache_blocks",
           "self.get_num_cacheable_tokens(num_computed_tokens, group_id)",
           "self.get_num_cacheable_tokens(num_computed_tokens, 0)", "wrong-group", "manager",
           note="every group caches as far as the first group's cacheable prefix (EAGLE, mixed block sizes)"),
    Mutant("coordinator.free.groups-reversed", f"{COORDINATOR}.free",
           "for manager in self.single_type_managers:",
           "for manager in reversed(self.single_type_managers):", "wrong-order", "manager",
           note="a finished request's groups are freed last group first, reordering the free queue"),
    # -- HybridKVCacheCoordinator.get_num_cacheable_tokens -----------------------------------------
    Mutant("hybrid-coordinator.cacheable.no-eagle-block", f"{HYBRID}.get_num_cacheable_tokens",
           "+ manager.block_size,", "+ 0,", "off-by-one", "manager",
           note="with EAGLE, the block just past the aligned boundary is not cached, so no later hit can drop it"),
    # -- HybridKVCacheCoordinator.find_longest_cache_hit -------------------------------------------
    Mutant("hybrid-coordinator.hit.no-eagle-margin", f"{HYBRID}.find_longest_cache_hit",
           "curr_hit_length + eagle_margin,", "curr_hit_length,", "off-by-one", "hybrid",
           note="an EAGLE group looks up only to the candidate, so its drop lands one block short"),
    Mutant("hybrid-coordinator.hit.drops-every-pass", f"{HYBRID}.find_longest_cache_hit",
           "eagle_verified.add(idx)", "pass", "skipped-step", "hybrid",
           note="an EAGLE group drops a block again on every pass of the fixed-point loop"),
    Mutant("hybrid-coordinator.hit.runs-past-first-pass", f"{HYBRID}.find_longest_cache_hit",
           "if is_simple_hybrid:", "if False:", "wrong-condition", "hybrid",
           note="full attention plus one other type loops past its single pass"),
    Mutant("hybrid-coordinator.hit.full-not-trimmed", f"{HYBRID}.find_longest_cache_hit",
           "del blks[num_blocks:]", "pass", "skipped-step", "hybrid",
           note="full-attention groups keep hit blocks beyond the reconciled hit length"),
    Mutant("hybrid-coordinator.hit.spec-group-shares-first", f"{HYBRID}.find_longest_cache_hit",
           "hit_blocks_by_group[group_id] = blocks", "hit_blocks_by_group[group_id] = hit_blocks[0]",
           "wrong-group", "hybrid",
           note="groups sharing one spec all report the first member's hit blocks"),
    Mutant("hybrid-coordinator.hit.mamba-eagle-margin", f"{HYBRID}.find_longest_cache_hit",
           "if drop_eagle_block and not isinstance(spec, MambaSpec):", "if drop_eagle_block:",
           "wrong-condition", "hybrid",
           note="a Mamba group gets the EAGLE look-ahead margin it never drops, so the hit outgrows full attention"),
    Mutant("hybrid-coordinator.hit.uncached-last-group", f"{HYBRID}.find_longest_cache_hit",
           "longest_hit_length = max(longest_hit_length, curr_hit_length)",
           "longest_hit_length = curr_hit_length", "skipped-step", "hybrid",
           note="the longest single-group hit is overwritten, so the uncached shared prefix is under-reported"),
    Mutant("hybrid-coordinator.per-group.no-eagle-drop", f"{HYBRID}.find_longest_cache_hit_per_group",
           "drop_eagle_block=use_eagle,", "drop_eagle_block=False,", "skipped-step", "hybrid",
           note="per-group lookups keep the EAGLE group's extra block"),
    # -- KVCacheManager ---------------------------------------------------------------------------
    Mutant("manager.lookup.no-last-token-cap", f"{MANAGER}.get_computed_blocks",
           "max_cache_hit_length = request.num_tokens - 1", "max_cache_hit_length = request.num_tokens",
           "off-by-one", "manager",
           note="a fully cached prompt hits in full, leaving no token to compute logits from"),
    Mutant("manager.allocate.refuses-exact-fit", f"{MANAGER}.allocate_slots",
           "if required_blocks > available_blocks:", "if required_blocks >= available_blocks:",
           "off-by-one", "manager",
           note="an allocation needing exactly the free blocks is refused"),
    Mutant("manager.allocate.window-one-token-late", f"{MANAGER}.allocate_slots",
           "max(0, total_computed_tokens - request.num_in_flight_tokens)",
           "max(0, total_computed_tokens - request.num_in_flight_tokens - 1)", "off-by-one", "manager",
           note="blocks leaving an attention window are freed one token late"),
    Mutant("manager.allocate.delayed-blocks-cached", f"{MANAGER}.allocate_slots",
           "if delay_cache_blocks:", "if False:", "wrong-condition", "manager",
           note="blocks whose KV is still to arrive are cached at once"),
    Mutant("manager.allocate.hit-not-adopted", f"{MANAGER}.allocate_slots",
           "new_computed_block_list is not self.empty_kv_cache_blocks.blocks",
           "new_computed_block_list is self.empty_kv_cache_blocks.blocks", "refcount", "manager",
           note="a waiting request's hit blocks are never touched nor put in its table"),
    Mutant("manager.allocate.caches-draft-slots", f"{MANAGER}.allocate_slots",
           "request.num_tokens,\n    )\n    self.coordinator.cache_blocks",
           "num_tokens_need_slot,\n    )\n    self.coordinator.cache_blocks", "wrong-condition", "manager",
           note="the caching bound counts draft and lookahead slots, not only finalized tokens"),
)
