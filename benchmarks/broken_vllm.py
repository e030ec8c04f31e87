"""The meta-tests' broken engines, re-created around vLLM's real ``KVCacheManager``.

``tests/broken_engines.py`` breaks kvoracle's *reference* engine; these classes
break *vLLM 0.33* the same way, so that the time the suite takes to convict a
bug can be measured on a production manager (``benchmarks/bench_vllm.py``
part c) and the convictions can be required by a test
(``tests/test_bench_vllm.py``).

Each class is the vLLM adapter (:class:`VllmEngine`) with exactly one behaviour
replaced. Where the bug lives inside vLLM, ``configure`` builds the real
manager and then replaces one method *on the live object* (the block pool, the
single-type manager or the coordinator it built), so vLLM's own code runs
everywhere else. The replacement is written here, not copied from vLLM.
``EXPECTED`` maps each class to the rule the suite must report, and is the same
mapping as ``broken_engines.EXPECTED``.

vLLM is imported only when an engine is built (through the adapter), so this
module imports without vLLM.
"""

from __future__ import annotations

import time
from typing import Any

from kvoracle.conformance.engines.vllm import VllmEngine


class _Patched(VllmEngine):
    """Builds vLLM's manager, then lets ``patch`` replace one behaviour on it."""

    def configure(self, config) -> None:
        super().configure(config)
        self.patch(self.manager)

    def patch(self, manager: Any) -> None:
        raise NotImplementedError

    @staticmethod
    def _single_type_manager(manager: Any) -> Any:
        # kvoracle's configurations have one KV-cache group, so one single-type manager.
        (stm,) = manager.coordinator.single_type_managers
        return stm


# -- 1. frees a request's blocks head first --------------------------------------------------
class ForwardFree(_Patched):
    name = "broken-vllm-forward-free"

    def patch(self, manager: Any) -> None:
        stm = self._single_type_manager(manager)
        pool = stm.block_pool

        def free(request_id: str) -> None:
            # bug: allocation order instead of reversed, so head blocks are evicted first
            pool.free_blocks(stm.pop_blocks_for_free(request_id))

        stm.free = free


# -- 2. forgets that touching a free hit consumes a free block -------------------------------
class ForgetsEvictableHits(_Patched):
    name = "broken-vllm-forgets-evictable-hits"

    def patch(self, manager: Any) -> None:
        # bug: hits waiting in the free queue are not counted against the free blocks, so
        # allocate_slots admits a request the pool cannot hold
        self._single_type_manager(manager)._get_num_evictable_blocks = lambda blocks: 0


# -- 3. the hit is one block short ----------------------------------------------------------
class HitOneBlockShort(_Patched):
    name = "broken-vllm-hit-one-block-short"

    def patch(self, manager: Any) -> None:
        coordinator = manager.coordinator
        original = coordinator.find_longest_cache_hit
        block_size = self._single_type_manager(manager).block_size

        def find_longest_cache_hit(block_hashes, max_cache_hit_length):
            blocks, length, uncached = original(block_hashes, max_cache_hit_length)
            if not blocks[0]:
                return blocks, length, uncached
            # bug: off by one block
            return tuple(group[:-1] for group in blocks), length - block_size, uncached

        coordinator.find_longest_cache_hit = find_longest_cache_hit


# -- 4. the lookup bound is off by one block ------------------------------------------------
class HitPastBound(_Patched):
    name = "broken-vllm-hit-past-bound"

    def patch(self, manager: Any) -> None:
        coordinator = manager.coordinator
        original = coordinator.find_longest_cache_hit
        block_size = self._single_type_manager(manager).block_size

        def find_longest_cache_hit(block_hashes, max_cache_hit_length):
            # bug: the bound lets one more block through (e.g. a whole prompt is "hit")
            return original(block_hashes, max_cache_hit_length + block_size)

        coordinator.find_longest_cache_hit = find_longest_cache_hit


# -- 5. touch leaves free hits in the free queue (a referenced block can be evicted) ---------
class TouchLeavesHitsFree(_Patched):
    name = "broken-vllm-touch-leaves-hits-free"

    def patch(self, manager: Any) -> None:
        pool = manager.block_pool

        def touch(blocks) -> None:
            for block in blocks:
                if not block.is_null:
                    block.ref_cnt += 1  # bug: a ref-count-0 hit stays in the free queue

        pool.touch = touch


# -- 6. caches blocks although the caller asked to delay caching ----------------------------
class IgnoresDelayCache(VllmEngine):
    name = "broken-vllm-ignores-delay-cache"

    def allocate(self, request_id, num_new_tokens, num_new_computed_tokens,
                 num_lookahead_tokens=0, delay_cache_blocks=False):
        return super().allocate(request_id, num_new_tokens, num_new_computed_tokens,
                                num_lookahead_tokens, delay_cache_blocks=False)  # bug


# -- 7. hashed blocks are prepended like unhashed ones (cached prefixes evicted first) -------
class PrependsHashedBlocks(_Patched):
    name = "broken-vllm-prepends-hashed-blocks"

    def patch(self, manager: Any) -> None:
        pool = manager.block_pool

        def free_blocks(ordered_blocks) -> None:
            released = []
            for block in ordered_blocks:
                if block.is_null:
                    continue
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    released.append(block)
            pool.free_block_queue.prepend_n(released)  # bug: cached blocks go first too

        pool.free_blocks = free_blocks


# -- 8. an engine that hangs, and one that raises -------------------------------------------
class HangsOnEvict(VllmEngine):
    """Never returns from evict: the suite must report an engine error and go on."""

    name = "broken-vllm-hangs-on-evict"

    def evict(self, block_ids) -> None:
        time.sleep(3600)


class RaisesOnReset(_Patched):
    name = "broken-vllm-raises-on-reset"

    def patch(self, manager: Any) -> None:
        def reset_prefix_cache() -> bool:
            raise RuntimeError("reset is not implemented")

        manager.reset_prefix_cache = reset_prefix_cache


#: Engine class name -> the rule the suite must report as failing (or erroring); the same
#: mapping as the reference-based meta-tests' ``broken_engines.EXPECTED``.
EXPECTED = {
    "ForwardFree": "KV-POOL-007",
    "ForgetsEvictableHits": "KV-LIFE-003",
    "HitOneBlockShort": "KV-FULL-001",
    "HitPastBound": "KV-LIFE-001",
    "TouchLeavesHitsFree": "KV-POOL-008",
    "IgnoresDelayCache": "KV-LIFE-008",
    "PrependsHashedBlocks": "KV-POOL-006",
    "HangsOnEvict": "KV-POOL-013",
    "RaisesOnReset": "KV-POOL-014",
}

#: Name -> class, for scripts that take an engine by name.
ENGINES: dict[str, type[VllmEngine]] = {name: globals()[name] for name in EXPECTED}
