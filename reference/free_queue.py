"""The free block queue: free blocks in eviction order (KV-POOL-003, -004, -006, -008)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from .block import KVCacheBlock


class FreeBlockQueue:
    """Free blocks, front first. Every operation is O(1) per block.

    An insertion-ordered dict keyed by block id gives O(1) removal from the
    middle (a touched hit), popping from the front and appending; prepending
    moves each block to the front, last one first.
    """

    __slots__ = ("_blocks",)

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._blocks: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in blocks
        )

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self._blocks.values())

    def block_ids(self) -> tuple[int, ...]:
        """The queue as block ids, front first."""
        return tuple(self._blocks)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first ``n`` blocks."""
        if n > len(self._blocks):
            raise ValueError(f"cannot pop {n} blocks from a queue of {len(self._blocks)}")
        pop = self._blocks.popitem
        return [pop(last=False)[1] for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Take ``block`` out of the queue wherever it is."""
        del self._blocks[block.block_id]

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Put ``blocks`` at the back, in order."""
        for block in blocks:
            self._blocks[block.block_id] = block

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the front, keeping their order."""
        for block in reversed(blocks):
            self._blocks[block.block_id] = block
            self._blocks.move_to_end(block.block_id, last=False)
