"""Mutants of vLLM's Mooncake store coordinator: its hit loop, load, store and lookup masks.

Every edit is to vLLM 0.33.0's installed source
(``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/coordinator.py``); the
external-store suite reaches these functions through its adapter's ``lookup``,
``load_mask``, ``store_mask`` and ``lookup_mask``.
"""

from __future__ import annotations

from mutation import Mutant

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator"
STORE = f"{MODULE}:MooncakeStoreCoordinator"
POOL = f"{MODULE}:ExternalCachedBlockPool"
SUITE = "external-store"

MUTANTS: tuple[Mutant, ...] = (
    # -- ExternalCachedBlockPool -------------------------------------------------------------
    Mutant("store.pool.any-group-hit", f"{POOL}.get_cached_block",
           "if all(", "if any(", "wrong-group", SUITE,
           note="a hash stored for one member group of a spec group counts as a hit for all"),
    # -- MooncakeStoreCoordinator._verify_and_split_kv_cache_groups ----------------------------
    Mutant("store.split.loses-later-eagle-mark", f"{STORE}._verify_and_split_kv_cache_groups",
           "if g.is_eagle_group and not group.use_eagle:", "if False:", "skipped-step", SUITE,
           note="a draft mark on a group merged into an earlier spec group is forgotten"),
    Mutant("store.split.no-eagle-fallback", f"{STORE}._verify_and_split_kv_cache_groups",
           "if self.use_eagle and not any(", "if False and not any(", "skipped-step", SUITE,
           note="with EAGLE on and no group marked, no group gets the EAGLE drop"),
    # -- load_mask / store_mask / lookup_mask --------------------------------------------------
    Mutant("store.load-mask.drops-eagle-again", f"{STORE}.load_mask",
           "apply_eagle=False,", "apply_eagle=True,", "off-by-one", SUITE,
           note="the receiving side drops the EAGLE block from an already pruned hit"),
    Mutant("store.store-mask.writes-mamba", f"{STORE}.store_mask",
           "exclude_mamba=True", "exclude_mamba=False", "wrong-condition", SUITE,
           note="Mamba chunks are written positionally although their table is not append-only"),
    Mutant("store.lookup-mask.excludes-mamba", f"{STORE}.lookup_mask",
           "retention_interval=None,", "retention_interval=None, exclude_mamba=True,",
           "wrong-condition", SUITE,
           note="lookup boundaries of Mamba groups are masked out like the store's"),
    Mutant("store.reachable.no-eagle-shift", f"{STORE}._reachable_masks",
           "use_eagle = g_idx in self.eagle_group_ids", "use_eagle = False", "skipped-step", SUITE,
           note="an EAGLE sliding window's stored tail is not shifted onto its peek block"),
    Mutant("store.reachable.no-alignment", f"{STORE}._reachable_masks",
           "alignment_tokens=self.lcm_block_size", "alignment_tokens=None", "skipped-step", SUITE,
           note="store and lookup masks ignore the scheduler alignment, so windows store every block"),
    Mutant("store.reachable.end-chunk-short", f"{STORE}._reachable_masks",
           "end_chunk = aligned_token_len // spec.block_size",
           "end_chunk = aligned_token_len // spec.block_size - 1", "off-by-one", SUITE,
           note="the masks stop one chunk before the aligned length"),
    # -- _find_hit_blocks ---------------------------------------------------------------------
    Mutant("store.hit.single-group-ignores-mark", f"{STORE}._find_hit_blocks",
           "drop_eagle_block=apply_eagle and group_eagle", "drop_eagle_block=apply_eagle",
           "wrong-condition", SUITE,
           note="a lone spec group gets the EAGLE drop whether or not it is a draft group"),
    Mutant("store.hit.margin-capped-at-bound", f"{STORE}._find_hit_blocks",
           "len(block_hashes) * self.hash_block_size,", "max_length,", "off-by-one", SUITE,
           note="the EAGLE look-ahead stops at the bound instead of the hashed tokens"),
    Mutant("store.hit.mamba-eagle-margin", f"{STORE}._find_hit_blocks",
           "if drop_eagle_block and not isinstance(spec, MambaSpec):", "if drop_eagle_block:",
           "skipped-step", SUITE,
           note="a Mamba draft group is looked up past the verified hit although it drops nothing"),
    Mutant("store.hit.keeps-eagle-verified", f"{STORE}._find_hit_blocks",
           "eagle_verified.clear()", "pass", "skipped-step", SUITE,
           note="after the hit shrinks, EAGLE groups are not re-verified with their drop"),
    Mutant("store.hit.simple-hybrid-any-count", f"{STORE}._find_hit_blocks",
           "len(self.attention_groups) == 2 and", "len(self.attention_groups) >= 2 and",
           "wrong-condition", SUITE,
           note="three or more spec groups led by full attention stop after one pass, unconverged"),
    Mutant("store.hit.full-not-truncated", f"{STORE}._find_hit_blocks",
           "del full_blks[num_blocks:]", "pass", "skipped-step", SUITE,
           note="full-attention blocks past the converged hit stay in the load mask"),
    Mutant("store.hit.truncate-floor", f"{STORE}._find_hit_blocks",
           "num_blocks = cdiv(hit_length, group.spec.block_size)",
           "num_blocks = hit_length // group.spec.block_size", "off-by-one", SUITE,
           note="a hit ending inside a full-attention block loses that block from the load mask"),
)
