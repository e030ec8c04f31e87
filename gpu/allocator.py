"""The block pool of spec chapter 2 (KV-POOL) with its state in tensors.

An independent implementation of the block-pool rules: no Python object per
block, no Python loop per block. Every batched operation -- allocate ``n``, free a
list in order, touch a list, cache a list, evict a set -- is a handful of
vectorized torch operations whose count does not depend on the batch size.

State, all on one device (``N`` = ``num_blocks``):

``ref_cnt``    int32 ``[N]``: reference counts; block 0 (the null block) stays 0.
``block_key``  int64 ``[N]``: the block's cache key as a 64-bit id (0 = not cached).
``block_seq``  int64 ``[N]``: when the block was cached (orders blocks under one key).
``_slots``     int32 ``[3N]``: the free queue as an array of *order stamps*. A free
               block sits at index ``_pos[b]``; the queue is ``_slots[_head:_tail]`` with
               ``-1`` holes left by blocks a touch took out, front first.
``_pos``       int32 ``[N]``: each free block's stamp, ``-1`` for a block not in the queue.

Why stamps in an array rather than a linked list or a sorted structure: the
queue only ever grows at its two ends (freed unhashed blocks go to the front,
hashed ones to the back, KV-POOL-006) and shrinks at the front (allocation,
KV-POOL-004) or anywhere (touch, KV-POOL-008). So a block's position never has
to move while it is free: prepending writes stamps ``_head - k .. _head - 1``,
appending ``_tail .. _tail + k - 1``, a touch writes a hole, and allocating ``n``
reads the first ``n`` non-holes from ``_head``. Holes are skipped once and
compacted away when the array runs out of room at an end (``_recenter``,
amortized O(1) per block), so no operation pays for the whole queue.

Cache keys are kvoracle's (hash bytes, group id) pairs. Tensors hold them as
64-bit ids (:meth:`key_id`): the first 8 bytes of the hash mixed with the group.
Two different keys with the same 64 bits are a collision, resolved explicitly
by probing to the next free id; the pool keeps the full key of every id it
issued, so a lookup never confuses two prefixes. The key -> blocks lookup is
a sorted view of the cached blocks by (key id, caching order), searched with
``searchsorted``; it is rebuilt lazily on the first lookup after the cache
changed (O(C log C) for C cached blocks).

Gathers and scatters use ``index_select`` / ``index_fill_`` / ``index_copy_`` /
``masked_select`` rather than ``t[ids]`` indexing: on a CPU, advanced indexing of a
few thousand ids may be split across threads, and on a busy machine waiting for the
threads costs milliseconds where the work takes microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import default_device

#: A cache key in kvoracle's terms: (hash bytes, group id).
KeyRef = tuple[bytes, int]

_GROUP_MIX = 0x9E3779B97F4A7C15
_INT64_MIN = -(1 << 63)


def _signed64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


class TorchBlockPool:
    """Every physical block, the free queue and the cache map, in tensors on ``device``.

    The methods take and return 1-D int64 tensors of block ids on the pool's device
    (any integer sequence is accepted as input).
    """

    def __init__(self, num_blocks: int, enable_caching: bool,
                 device: torch.device | str | None = None) -> None:
        if num_blocks < 2:
            raise ValueError("KV-CFG-001: num_blocks must be >= 2")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.device = torch.device(device) if device is not None else default_device()
        dev = self.device
        n = num_blocks
        self.ref_cnt = torch.zeros(n, dtype=torch.int32, device=dev)
        self.block_key = torch.zeros(n, dtype=torch.int64, device=dev)
        self.block_seq = torch.zeros(n, dtype=torch.int64, device=dev)
        self._cap = 3 * n
        self._slots = torch.full((self._cap,), -1, dtype=torch.int32, device=dev)
        self._pos = torch.full((n,), -1, dtype=torch.int32, device=dev)
        # Scratch for finding first/last occurrences of ids in a batch without a sort.
        self._scratch = torch.full((n,), -1, dtype=torch.int32, device=dev)
        self._arange = torch.arange(64, dtype=torch.int32, device=dev)
        self._head = self._tail = n
        self._holes = 0
        self._seq = 1
        # KV-POOL-001/003: block 0 is the null block; the queue starts as 1 .. n-1.
        self._push_back(torch.arange(1, n, dtype=torch.int64, device=dev))
        # Key ids: full key <-> 64-bit id, both ways (collisions resolved by probing).
        self._key_of_id: dict[int, KeyRef] = {}
        self._id_of_key: dict[KeyRef, int] = {}
        self._index_dirty = True
        self._index_keys = torch.empty(0, dtype=torch.int64, device=dev)
        self._index_blocks = torch.empty(0, dtype=torch.int64, device=dev)

    # -- helpers -------------------------------------------------------------------------
    def _ids(self, block_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Block ids as a 1-D int64 tensor on the pool's device."""
        if isinstance(block_ids, torch.Tensor):
            return block_ids.to(device=self.device, dtype=torch.int64).reshape(-1)
        return torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)

    def _order(self, k: int) -> torch.Tensor:
        """``arange(k)`` as int32, from a cached tensor grown on demand."""
        if self._arange.numel() < k:
            self._arange = torch.arange(max(k, 2 * self._arange.numel()), dtype=torch.int32,
                                        device=self.device)
        return self._arange[:k]

    def _occurrence_mask(self, ids: torch.Tensor, last: bool) -> torch.Tensor:
        """True at the first (or last) occurrence of each id in ``ids``: O(len), no sort."""
        order = self._order(ids.numel())
        scratch = self._scratch
        if last:
            scratch.scatter_reduce_(0, ids, order, "amax")
        else:
            scratch.index_fill_(0, ids, ids.numel())
            scratch.scatter_reduce_(0, ids, order, "amin")
        mask = scratch.index_select(0, ids) == order
        scratch.index_fill_(0, ids, -1)
        return mask

    # -- observation ---------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        """KV-POOL-012: the length of the free queue (kept on the host: no device sync)."""
        return self._tail - self._head - self._holes

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks() / (self.num_blocks - 1)

    def free_queue(self) -> torch.Tensor:
        """The free queue as block ids, front first."""
        segment = self._slots[self._head:self._tail]
        return torch.masked_select(segment, segment >= 0).to(torch.int64)

    def ref_counts(self) -> torch.Tensor:
        return self.ref_cnt.clone()

    # -- the free queue ------------------------------------------------------------------
    def _recenter(self) -> None:
        """Compact the queue's holes away and centre it, leaving >= N stamps free at each end."""
        live = self.free_queue()  # entries outside [_head, _tail) are never read: no clearing
        start = (self._cap - live.numel()) // 2
        self._head, self._tail, self._holes = start, start + live.numel(), 0
        self._slots[start:self._tail] = live.to(torch.int32)
        self._pos.index_copy_(0, live, torch.arange(start, self._tail, dtype=torch.int32,
                                                     device=self.device))

    def _push_front(self, ids: torch.Tensor) -> None:
        k = ids.numel()
        if k == 0:
            return
        if self._head < k:
            self._recenter()
        start = self._head - k
        self._slots[start:self._head] = ids.to(torch.int32)
        self._pos.index_copy_(0, ids, torch.arange(start, self._head, dtype=torch.int32,
                                                   device=self.device))
        self._head = start

    def _push_back(self, ids: torch.Tensor) -> None:
        k = ids.numel()
        if k == 0:
            return
        if self._tail + k > self._cap:
            self._recenter()
        end = self._tail + k
        self._slots[self._tail:end] = ids.to(torch.int32)
        self._pos.index_copy_(0, ids, torch.arange(self._tail, end, dtype=torch.int32,
                                                   device=self.device))
        self._tail = end

    def _pop_front(self, n: int) -> torch.Tensor:
        if n <= 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if self._holes == 0:  # the common case: the first n stamps are the first n blocks
            end = self._head + n
            taken = self._slots[self._head:end].to(torch.int64)
        else:
            # Read a window from the front, doubling it until it holds n blocks; every
            # hole read is skipped for good.
            width = n + min(self._holes, n)
            while True:
                segment = self._slots[self._head:min(self._head + width, self._tail)]
                present = (segment >= 0).nonzero().squeeze(1)
                if present.numel() >= n:
                    break
                width *= 2
            cut = int(present[n - 1]) + 1
            taken = segment[:cut]
            taken = torch.masked_select(taken, taken >= 0).to(torch.int64)
            self._holes -= cut - n
            end = self._head + cut
        self._pos.index_fill_(0, taken, -1)
        self._head = end
        return taken

    def _remove(self, ids: torch.Tensor) -> None:
        """Take free blocks (distinct) out of the queue wherever they are (a touch)."""
        self._slots.index_fill_(0, self._pos.index_select(0, ids).to(torch.int64), -1)
        self._pos.index_fill_(0, ids, -1)
        self._holes += ids.numel()
        if self._holes > self.num_blocks:  # mostly holes: compact before they cost reads
            self._recenter()

    # -- the operations of chapter 2 -----------------------------------------------------
    def allocate(self, n: int) -> torch.Tensor:
        """KV-POOL-004/005: pop the first ``n`` free blocks, evict their keys, count 1."""
        if not 0 <= n <= self.num_free_blocks():
            raise ValueError(f"KV-POOL-004: cannot allocate {n} blocks with "
                             f"{self.num_free_blocks()} free")
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        ids = self._pop_front(n)
        if self.enable_caching:
            self._drop_keys(ids)
        self.ref_cnt.index_fill_(0, ids, 1)
        return ids

    def touch(self, block_ids: torch.Tensor | Sequence[int]) -> None:
        """KV-POOL-008: count one more reference; a free block leaves the queue (order kept)."""
        ids = self._ids(block_ids)
        if ids.numel() == 0:
            return
        real = ids != 0  # KV-POOL-002: the null block is counted +0 and never leaves a queue
        leaving = torch.masked_select(ids, (self.ref_cnt.index_select(0, ids) == 0) & real
                                      & self._occurrence_mask(ids, last=True))
        self.ref_cnt.index_add_(0, ids, real.to(torch.int32))
        if leaving.numel():
            self._remove(leaving)

    def free(self, block_ids: torch.Tensor | Sequence[int]) -> None:
        """KV-POOL-006: release one reference per listed block, in the order given.

        The blocks whose count reaches 0 return to the queue in the order they reach it
        (a block listed twice reaches it at its last occurrence): unhashed ones (all of
        them with caching off) to the front, hashed ones to the back.
        """
        ids = self._ids(block_ids)
        if ids.numel() == 0:
            return
        real = ids != 0  # KV-POOL-002: the null block is counted -0 and never released
        minus = -real.to(torch.int32)
        self.ref_cnt.index_add_(0, ids, minus)
        counts = self.ref_cnt.index_select(0, ids)
        if bool((counts < 0).any()):
            self.ref_cnt.index_add_(0, ids, -minus)  # leave the pool as it was
            raise ValueError("KV-POOL-011: only referenced blocks can be freed")
        released = torch.masked_select(ids, (counts == 0) & real
                                       & self._occurrence_mask(ids, last=True))
        if not self.enable_caching:
            self._push_front(released)
            return
        hashed = self.block_key.index_select(0, released) != 0
        self._push_front(torch.masked_select(released, ~hashed))
        self._push_back(torch.masked_select(released, hashed))

    # -- caching -------------------------------------------------------------------------
    def key_id(self, key: KeyRef) -> int:
        """The 64-bit id of a cache key; ids of different keys never coincide."""
        known = self._id_of_key.get(key)
        if known is not None:
            return known
        block_hash, group = key
        candidate = _signed64(int.from_bytes(bytes(block_hash[:8]).ljust(8, b"\0"), "little")
                              ^ (group * _GROUP_MIX))
        # 0 means "not cached"; a taken id is a 64-bit collision: probe to the next id.
        while candidate == 0 or candidate in self._key_of_id:
            candidate = _signed64(candidate + 1)
        self._key_of_id[candidate] = key
        self._id_of_key[key] = candidate
        return candidate

    def key_of(self, key_id: int) -> KeyRef:
        return self._key_of_id[key_id]

    def cache(self, block_ids: torch.Tensor | Sequence[int],
              key_ids: torch.Tensor | Sequence[int]) -> None:
        """Cache each block under its key, in order (KV-POOL-009: appended, never replaced)."""
        ids = self._ids(block_ids)
        keys = self._ids(key_ids)
        if ids.numel() == 0:
            return
        if not self.enable_caching:
            raise ValueError("KV-LIFE-012: nothing is cached with prefix caching off")
        if bool(((ids == 0) | (self.block_key.index_select(0, ids) != 0) | (keys == 0)).any()) or \
                not bool(self._occurrence_mask(ids, last=False).all()):
            raise ValueError("KV-POOL-002/KV-POOL-015: only non-null uncached blocks, each "
                             "once, are cached")
        self.block_key.index_copy_(0, ids, keys)
        self.block_seq.index_copy_(0, ids, torch.arange(self._seq, self._seq + ids.numel(),
                                                        device=self.device))
        self._seq += ids.numel()
        self._index_dirty = True

    def _drop_keys(self, ids: torch.Tensor) -> None:
        keyed = self.block_key.index_select(0, ids) != 0
        if bool(keyed.any()):
            self.block_key.index_fill_(0, torch.masked_select(ids, keyed), 0)
            self._index_dirty = True

    def evict(self, block_ids: torch.Tensor | Sequence[int]) -> None:
        """KV-POOL-013: drop the listed blocks' keys; counts and the queue are untouched."""
        ids = self._ids(block_ids)
        if ids.numel() == 0:
            return
        if bool(((ids < 0) | (ids >= self.num_blocks)).any()):
            raise ValueError(f"KV-POOL-013: block ids must be in 0..{self.num_blocks - 1}")
        self._drop_keys(ids)

    def reset_prefix_cache(self) -> bool:
        """KV-POOL-014: forget every key, only when every non-null block is free."""
        if self.num_free_blocks() != self.num_blocks - 1:
            return False
        self.block_key.zero_()
        self._index_dirty = True
        return True

    # -- lookup --------------------------------------------------------------------------
    def _index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached blocks sorted by (key id, caching order), and their key ids."""
        if self._index_dirty:
            cached = (self.block_key != 0).nonzero().squeeze(1)
            by_seq = cached.index_select(0, torch.argsort(self.block_seq.index_select(0, cached)))
            blocks = by_seq.index_select(0, torch.argsort(self.block_key.index_select(0, by_seq),
                                                          stable=True))
            self._index_blocks, self._index_keys = blocks, self.block_key.index_select(0, blocks)
            self._index_dirty = False
        return self._index_keys, self._index_blocks

    def lookup(self, key_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """KV-POOL-009: per key, the earliest-cached block still under it, or -1."""
        keys = self._ids(key_ids)
        index_keys, index_blocks = self._index()
        if index_keys.numel() == 0 or keys.numel() == 0:
            return torch.full_like(keys, -1)
        at = torch.searchsorted(index_keys, keys).clamp_(max=index_keys.numel() - 1)
        return torch.where(index_keys.index_select(0, at) == keys,
                           index_blocks.index_select(0, at), -1)

    def cached_map(self) -> dict[KeyRef, tuple[int, ...]]:
        """Cache key -> blocks under it, in caching order (for observation)."""
        index_keys, index_blocks = self._index()
        out: dict[KeyRef, list[int]] = {}
        for key_id, block_id in zip(index_keys.tolist(), index_blocks.tolist()):
            out.setdefault(self._key_of_id[key_id], []).append(block_id)
        return {key: tuple(blocks) for key, blocks in out.items()}

    # -- accounting ----------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of per-block tensor state (the key-id dictionaries are not counted)."""
        tensors = (self.ref_cnt, self.block_key, self.block_seq, self._slots, self._pos,
                   self._scratch)  # (the arange cache is sized by the batch, not the pool)
        return sum(t.numel() * t.element_size() for t in tensors)
