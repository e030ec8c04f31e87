"""Coordinators: the layer between the manager and its single-type managers.

With one KV-cache group the coordinator is *unitary*: it forwards to the one
full-attention manager. With prefix caching off it is the *no-prefix-cache*
coordinator: lookups always miss and nothing is cached (KV-LIFE-002, -012).
"""

from __future__ import annotations

from collections.abc import Sequence

from .block import KVCacheBlock
from .block_pool import BlockPool
from .config import ManagerConfig
from .full_attention import FullAttentionManager
from .request import Request


class UnitaryCoordinator:
    """One full-attention group, prefix caching on."""

    def __init__(self, config: ManagerConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_blocks, enable_caching=config.enable_caching)
        self.manager = FullAttentionManager(config.block_size, self.pool, group_id=0)
        self.managers = (self.manager,)

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        blocks, length = self.manager.find_longest_cache_hit(
            block_hashes, max_length, self.config.use_eagle)
        return (blocks,), length

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                               new_computed_blocks: tuple[Sequence[KVCacheBlock], ...]) -> int:
        return sum(m.num_blocks_to_allocate(request_id, num_tokens, hits)
                   for m, hits in zip(self.managers, new_computed_blocks))

    def add_computed_blocks(self, request_id: str,
                            new_computed_blocks: tuple[Sequence[KVCacheBlock], ...]) -> None:
        # Every group's hits are touched before any group allocates (KV-LIFE-006).
        for manager, hits in zip(self.managers, new_computed_blocks):
            manager.add_computed_blocks(request_id, hits)

    def allocate_new_blocks(self, request_id: str, num_tokens: int
                            ) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.managers)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        for manager in self.managers:
            manager.cache_blocks(request, num_tokens)

    def free(self, request_id: str) -> None:
        for manager in self.managers:
            manager.free(request_id)

    def is_tracked(self, request_id: str) -> bool:
        """Whether the request's hits were already adopted (a running request)."""
        return any(request_id in m.num_cached_block for m in self.managers)

    def block_tables(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.req_to_blocks.get(request_id, []) for m in self.managers)

    def requests(self) -> set[str]:
        return {rid for m in self.managers for rid in m.req_to_blocks}


class NoPrefixCacheCoordinator(UnitaryCoordinator):
    """Prefix caching off: every lookup misses and nothing is ever cached."""

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        return tuple([] for _ in self.managers), 0  # KV-LIFE-002

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        return None  # KV-LIFE-012


def make_coordinator(config: ManagerConfig) -> UnitaryCoordinator:
    if config.enable_caching:
        return UnitaryCoordinator(config)
    return NoPrefixCacheCoordinator(config)
