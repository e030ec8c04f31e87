"""The block pool of spec chapter 2 (KV-POOL) with its state in tensors.

An independent implementation of the block-pool rules: no Python object per
block, no Python loop per block. Every batched operation -- allocate ``n``, free a
list in order, touch a list, cache a list, evict a set -- is a handful of
vectorized torch operations whose count does not depend on the batch size.

State, all on one device (``N`` = ``num_blocks``):

``_ref_cnt``   int32 ``[N]``: reference counts, read through :meth:`ref_counts`. Block 0,
               the null block, counts 0 to observers but holds ``_NULL_PIN`` (2**30)
               here, restored after every batch: it never reaches 0, so it is never
               released, never leaves a queue, and batches need no "is it null" mask.
``block_key``  int64 ``[N]``: the block's cache key as a 64-bit id (0 = not cached).
``block_seq``  int64 ``[N]``: when the block was cached (orders blocks under one key).
``_slots``     int32 ``[3N]``: the free queue as an array of *order stamps*. A free
               block sits at index ``_pos[b]``; the queue is ``_slots[_head:_tail]`` with
               ``-1`` holes left by blocks a touch took out, front first.
``_pos``       int32 ``[N]``: each free block's stamp, ``-1`` for a block not in the queue.
``_scratch``   int32 ``[N]``: per-batch marks for finding each id's first or last
               occurrence (:meth:`_occurrence_mask`); values from earlier batches are
               smaller than the current batch's, so it is never cleared between batches.

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
issued, so a lookup never confuses two prefixes.

The key -> blocks lookup is an index of (key id, block, caching stamp) entries
in two parts, both sorted by (key id, caching order) and searched with
``searchsorted``: a large *base*, and a small *delta* of the entries cached
since the base was last rebuilt (every delta entry is newer than every base
entry). Caching a batch of k sorts the batch and merges it into the delta
(O(k log k + D) for a delta of D entries); once the delta holds more than about
sqrt(C * k) entries it is merged into the base (O(C) for C entries: positions from
``searchsorted`` and a prefix sum, no full sort), which balances the two costs.
Dropping a key (allocation, eviction, reset) does not touch the index: an entry
is *live* while its block still holds its key and caching stamp, and a lookup
skips dead entries under the key it searches, a round per dead entry in a row.
Dead entries are purged at the next merge into the base, which a lookup forces
once they may be half the index.

Gathers and scatters use ``gather`` / ``scatter_`` / ``scatter_add_`` with a source
tensor (constants come from cached buffers) and ``masked_select``, rather than
``t[ids]`` indexing or ``index_fill_`` / ``index_copy_``: on a CPU, advanced indexing
of a few thousand ids may be split across threads, and on a busy machine waiting for
the threads costs milliseconds where the work takes microseconds; and at 4,096 ids
the scatters are two to three times faster than ``index_fill_`` / ``index_copy_``.
Where a batch is usually taken whole (every freed block released, every released
block hashed), a count decides first and the ``masked_select`` is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import default_device

#: A cache key in kvoracle's terms: (hash bytes, group id).
KeyRef = tuple[bytes, int]

_GROUP_MIX = 0x9E3779B97F4A7C15
_INT64_MIN = -(1 << 63)
_INT32_MAX = (1 << 31) - 1
#: The null block's stored count: far from 0 whatever one batch adds or subtracts.
_NULL_PIN = 1 << 30


def _signed64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


class TorchBlockPool:
    """Every physical block, the free queue and the cache map, in tensors on ``device``.

    The methods take and return 1-D int64 tensors of block ids on the pool's device
    (any integer sequence is accepted as input).
    """

    #: The delta is merged into the base once it holds more than this many entries and more
    #: than sqrt(base entries * entries of the batch just cached).
    MERGE_MIN = 256
    #: A lookup purges dead entries once they may exceed half the index plus this slack.
    DEAD_SLACK = 64

    def __init__(self, num_blocks: int, enable_caching: bool,
                 device: torch.device | str | None = None) -> None:
        if num_blocks < 2:
            raise ValueError("KV-CFG-001: num_blocks must be >= 2")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.device = torch.device(device) if device is not None else default_device()
        dev = self.device
        n = num_blocks
        self._ref_cnt = torch.zeros(n, dtype=torch.int32, device=dev)
        self.block_key = torch.zeros(n, dtype=torch.int64, device=dev)
        self.block_seq = torch.zeros(n, dtype=torch.int64, device=dev)
        self._cap = 3 * n
        self._slots = torch.full((self._cap,), -1, dtype=torch.int32, device=dev)
        self._pos = torch.full((n,), -1, dtype=torch.int32, device=dev)
        # Scratch for finding first/last occurrences of ids in a batch without a sort.
        self._scratch = torch.full((n,), -1, dtype=torch.int32, device=dev)
        self._stamp_base = 0
        self._arange = torch.arange(64, dtype=torch.int32, device=dev)
        self._constants: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self._pin_null()
        self._head = self._tail = n
        self._holes = 0
        self._seq = 1
        # KV-POOL-001/003: block 0 is the null block; the queue starts as 1 .. n-1.
        self._push_back(torch.arange(1, n, dtype=torch.int64, device=dev))
        # Key ids: full key <-> 64-bit id, both ways (collisions resolved by probing).
        self._key_of_id: dict[int, KeyRef] = {}
        self._id_of_key: dict[KeyRef, int] = {}
        self._clear_index()

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

    def _constant(self, k: int, value: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """``k`` copies of ``value``, from a cached buffer grown on demand (never written)."""
        buffer = self._constants.get((value, dtype))
        if buffer is None or buffer.numel() < k:
            size = max(k, 64, 2 * (buffer.numel() if buffer is not None else 0))
            buffer = torch.full((size,), value, dtype=dtype, device=self.device)
            self._constants[(value, dtype)] = buffer
        return buffer[:k]

    def _pin_null(self) -> None:
        """Put the null block's stored count back after a batch counted it (KV-POOL-002)."""
        self._ref_cnt[:1].fill_(_NULL_PIN)

    def _occurrence_mask(self, ids: torch.Tensor, last: bool) -> torch.Tensor:
        """True at the first (or last) occurrence of each id in ``ids``: O(len), no sort.

        Each position gets a stamp, larger for later positions (``last``) or earlier ones;
        the scratch keeps each id's largest stamp, and a position holds its id's mark iff
        its stamp is the largest. Stamps grow from batch to batch, so marks left by earlier
        batches lose to any current one and the scratch is never cleared (only when the
        stamps would overflow int32).
        """
        n = ids.numel()
        if self._stamp_base > _INT32_MAX - n:
            self._scratch.fill_(-1)
            self._stamp_base = 0
        order = self._order(n)
        stamps = order + self._stamp_base if last else \
            torch.rsub(order, self._stamp_base + n - 1)
        self._stamp_base += n
        self._scratch.scatter_reduce_(0, ids, stamps, "amax")
        return self._scratch.gather(0, ids) == stamps

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
        """Every block's reference count (the null block's is 0)."""
        counts = self._ref_cnt.clone()
        counts[:1] = 0
        return counts

    @property
    def ref_cnt(self) -> torch.Tensor:
        """:meth:`ref_counts` (a copy: the pool's own tensor holds the null block pinned)."""
        return self.ref_counts()

    def num_free_among(self, block_ids: torch.Tensor | Sequence[int]) -> int:
        """How many of the listed blocks have no reference (the null block is never free)."""
        ids = self._ids(block_ids)
        return int((self._ref_cnt.gather(0, ids) == 0).sum()) if ids.numel() else 0

    # -- the free queue ------------------------------------------------------------------
    def _recenter(self) -> None:
        """Compact the queue's holes away and centre it, leaving >= N stamps free at each end."""
        live = self.free_queue()  # entries outside [_head, _tail) are never read: no clearing
        start = (self._cap - live.numel()) // 2
        self._head, self._tail, self._holes = start, start + live.numel(), 0
        self._slots[start:self._tail] = live.to(torch.int32)
        self._pos.scatter_(0, live, torch.arange(start, self._tail, dtype=torch.int32,
                                                 device=self.device))

    def _push_front(self, ids: torch.Tensor) -> None:
        k = ids.numel()
        if k == 0:
            return
        if self._head < k:
            self._recenter()
        start = self._head - k
        self._slots[start:self._head].copy_(ids)
        self._pos.scatter_(0, ids, torch.arange(start, self._head, dtype=torch.int32,
                                                device=self.device))
        self._head = start

    def _push_back(self, ids: torch.Tensor) -> None:
        k = ids.numel()
        if k == 0:
            return
        if self._tail + k > self._cap:
            self._recenter()
        end = self._tail + k
        self._slots[self._tail:end].copy_(ids)
        self._pos.scatter_(0, ids, torch.arange(self._tail, end, dtype=torch.int32,
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
        self._pos.scatter_(0, taken, self._constant(n, -1))
        self._head = end
        return taken

    def _remove(self, ids: torch.Tensor) -> None:
        """Take free blocks (distinct) out of the queue wherever they are (a touch)."""
        unset = self._constant(ids.numel(), -1)
        self._slots.scatter_(0, self._pos.gather(0, ids).to(torch.int64), unset)
        self._pos.scatter_(0, ids, unset)
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
        self._ref_cnt.scatter_(0, ids, self._constant(n, 1))
        return ids

    def touch(self, block_ids: torch.Tensor | Sequence[int]) -> None:
        """KV-POOL-008: count one more reference; a free block leaves the queue (order kept)."""
        ids = self._ids(block_ids)
        n = ids.numel()
        if n == 0:
            return
        # A free block leaves at its last listing. The null block, pinned, is never free
        # (KV-POOL-002): it stays out of every queue.
        leaving = (self._ref_cnt.gather(0, ids) == 0) & self._occurrence_mask(ids, last=True)
        self._ref_cnt.scatter_add_(0, ids, self._constant(n, 1))
        self._pin_null()
        num_leaving = int(leaving.sum())
        if num_leaving:
            self._remove(ids if num_leaving == n else torch.masked_select(ids, leaving))

    def free(self, block_ids: torch.Tensor | Sequence[int]) -> None:
        """KV-POOL-006: release one reference per listed block, in the order given.

        The blocks whose count reaches 0 return to the queue in the order they reach it
        (a block listed twice reaches it at its last occurrence): unhashed ones (all of
        them with caching off) to the front, hashed ones to the back.
        """
        ids = self._ids(block_ids)
        n = ids.numel()
        if n == 0:
            return
        self._ref_cnt.scatter_add_(0, ids, self._constant(n, -1))
        counts = self._ref_cnt.gather(0, ids)  # the null block, pinned, is never released
        self._pin_null()
        if int(counts.min()) < 0:
            self._ref_cnt.scatter_add_(0, ids, self._constant(n, 1))  # leave the pool as it was
            self._pin_null()
            raise ValueError("KV-POOL-011: only referenced blocks can be freed")
        releasing = (counts == 0) & self._occurrence_mask(ids, last=True)
        num_released = int(releasing.sum())
        if num_released == 0:
            return
        released = ids if num_released == n else torch.masked_select(ids, releasing)
        if not self.enable_caching:
            self._push_front(released)
            return
        hashed = self.block_key.gather(0, released) != 0
        num_hashed = int(hashed.sum())
        if num_hashed < num_released:
            self._push_front(released if num_hashed == 0
                             else torch.masked_select(released, ~hashed))
        if num_hashed:
            self._push_back(released if num_hashed == num_released
                            else torch.masked_select(released, hashed))

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
        if bool(((ids == 0) | (self.block_key.gather(0, ids) != 0) | (keys == 0)).any()) or \
                not bool(self._occurrence_mask(ids, last=False).all()):
            raise ValueError("KV-POOL-002/KV-POOL-015: only non-null uncached blocks, each "
                             "once, are cached")
        stamps = torch.arange(self._seq, self._seq + ids.numel(), device=self.device)
        self.block_key.scatter_(0, ids, keys)
        self.block_seq.scatter_(0, ids, stamps)
        self._seq += ids.numel()
        order = torch.argsort(keys, stable=True)  # (a batch's stamps grow with its order)
        batch = (keys.index_select(0, order), ids.index_select(0, order),
                 stamps.index_select(0, order))
        self._delta = self._merged(self._delta, batch)
        if self._delta[0].numel() > max(self.MERGE_MIN,
                                        math.isqrt(self._base[0].numel() * ids.numel())):
            self._merge()

    def _drop_keys(self, ids: torch.Tensor) -> None:
        if bool(self.block_key.gather(0, ids).any()):
            self.block_key.scatter_(0, ids, self._constant(ids.numel(), 0, torch.int64))
            self._dead += ids.numel()  # (at most: the index entries of these blocks die)

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
        self._clear_index()
        return True

    # -- lookup --------------------------------------------------------------------------
    def _clear_index(self) -> None:
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        #: Entries (key ids, blocks, caching stamps), sorted by key id then stamp.
        self._base: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (empty, empty, empty)
        #: The entries cached since the last merge into the base, sorted the same way.
        self._delta: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (empty, empty, empty)
        #: An upper bound on the dead entries in the index.
        self._dead = 0

    def _live(self, blocks: torch.Tensor, keys: torch.Tensor, stamps: torch.Tensor
              ) -> torch.Tensor:
        """Which entries still hold: their block has their key, cached at their stamp."""
        return (self.block_key.gather(0, blocks) == keys) & \
            (self.block_seq.gather(0, blocks) == stamps)

    def _merged(self, older: tuple[torch.Tensor, ...], newer: tuple[torch.Tensor, ...]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Two sorted entry lists as one, every entry of ``newer`` after ``older``'s entries
        of the same key (it was cached later): O(len), no sort."""
        if newer[0].numel() == 0:
            return older  # type: ignore[return-value]
        if older[0].numel() == 0:
            return newer  # type: ignore[return-value]
        c, k = older[0].numel(), newer[0].numel()
        # Entry j of ``newer`` goes before ``older``'s entry ins[j]; ``older``'s entry i moves
        # up by the number of ``newer`` entries placed before it.
        ins = torch.searchsorted(older[0], newer[0], right=True)
        new_at = ins + torch.arange(k, device=self.device)
        old_at = torch.arange(c, device=self.device) + torch.cumsum(
            torch.bincount(ins, minlength=c + 1), 0)[:c]
        merged = []
        for old, new in zip(older, newer):
            out = torch.empty(c + k, dtype=torch.int64, device=self.device)
            out.scatter_(0, old_at, old)
            out.scatter_(0, new_at, new)
            merged.append(out)
        return tuple(merged)  # type: ignore[return-value]

    def _merge(self) -> None:
        """Purge dead entries and merge the delta into the base: O(C), no full sort."""
        base, delta = (tuple(torch.masked_select(t, self._live(blocks, keys, stamps))
                             for t in (keys, blocks, stamps))
                       for keys, blocks, stamps in (self._base, self._delta))
        merged = self._merged(base, delta)
        self._clear_index()
        self._base = merged

    def _find(self, index: tuple[torch.Tensor, torch.Tensor, torch.Tensor], keys: torch.Tensor
              ) -> torch.Tensor:
        """Per key, the block of its first live entry in ``index`` (sorted), or -1."""
        index_keys, index_blocks, index_stamps = index
        found = torch.full_like(keys, -1)
        n = index_keys.numel()
        if n == 0:
            return found
        at = torch.searchsorted(index_keys, keys)
        searching = torch.ones_like(keys, dtype=torch.bool)
        while True:  # one round per dead entry in a row under a searched key
            here = at.clamp(max=n - 1)
            same = searching & (at < n) & (index_keys.gather(0, here) == keys)
            if not bool(same.any()):
                return found
            blocks = index_blocks.gather(0, here)
            live = same & self._live(blocks, keys, index_stamps.gather(0, here))
            found = torch.where(live, blocks, found)
            searching = same & ~live
            at = at + searching.to(at.dtype)

    def lookup(self, key_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """KV-POOL-009: per key, the earliest-cached block still under it, or -1."""
        keys = self._ids(key_ids)
        if keys.numel() == 0:
            return torch.full_like(keys, -1)
        if self._dead > (self._base[0].numel() + self._delta[0].numel()) // 2 + self.DEAD_SLACK:
            self._merge()  # mostly dead entries: purge them before they cost rounds
        found = self._find(self._base, keys)
        if self._delta[0].numel():  # delta entries are newer: they answer what the base cannot
            missing = found < 0
            if bool(missing.any()):
                found = torch.where(missing, self._find(self._delta, keys), found)
        return found

    def cached_map(self) -> dict[KeyRef, tuple[int, ...]]:
        """Cache key -> blocks under it, in caching order (for observation)."""
        self._merge()
        index_keys, index_blocks, _ = self._base
        out: dict[KeyRef, list[int]] = {}
        for key_id, block_id in zip(index_keys.tolist(), index_blocks.tolist()):
            out.setdefault(self._key_of_id[key_id], []).append(block_id)
        return {key: tuple(blocks) for key, blocks in out.items()}

    # -- accounting ----------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of tensor state: per block, and the key index's 24 bytes per entry (one
        per cached block, plus dead ones until the next merge). The key-id dictionaries
        and the cached constants (sized by the batch, not the pool) are not counted."""
        tensors = (self._ref_cnt, self.block_key, self.block_seq, self._slots, self._pos,
                   self._scratch, *self._base, *self._delta)
        return sum(t.numel() * t.element_size() for t in tensors)
