"""KV-cache blocks as the block pool sees them."""

from __future__ import annotations

import attrs

#: A cache key: (block hash, KV-cache group id) -- KV-HASH-005.
CacheKey = tuple[bytes, int]


@attrs.define(eq=False, slots=True)
class KVCacheBlock:
    """Metadata of one physical block.

    ``ref_cnt`` counts the request block tables holding the block
    (KV-POOL-011); ``cache_key`` is set while the block is cached.
    Blocks compare by identity: two blocks are the same block only if they
    are the same object.
    """

    block_id: int
    ref_cnt: int = 0
    cache_key: CacheKey | None = None
    is_null: bool = False
    #: A partial tail entry (KV-HLC-006): never read by a whole-block lookup, but it makes
    #: the block a cached block for the free queue's order, until it is cached whole or reused.
    partial_key: CacheKey | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}{', null' if self.is_null else ''})"
