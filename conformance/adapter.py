"""The engine adapter protocol: how an engine plugs into kvoracle.

An adapter wraps one engine behind engine-neutral *operations* (configure, add a
request, look up its prefix-cache hit, allocate slots, advance computed tokens,
append output tokens, free, evict, reset) and one *observation* of the
engine's state after each operation. It also declares its
:class:`Capabilities`: what it claims to implement exactly. A rule the engine
cannot be judged on is reported "not applicable", never "pass".

Block ids are the engine's own. Cache keys are reported as
:data:`KeyRef` -- (kvoracle prefix hash, group id) -- so that engines with
different hash functions can be compared: an adapter translates its engine's
hash of a prefix into kvoracle's hash of the same prefix
(:func:`kvoracle.spec.hashing.extend_block_hashes`). Engine hashes that do not
correspond to any prefix the adapter has seen are reported as
``UNKNOWN_HASH + engine bytes``.

Optional operations (:class:`OptionalEngineAdapter`) are offered only by an adapter that
claims their capability; the rules needing it are "not applicable" to any other:

* ``skipped_tokens``: ``skipped_tokens(num_computed_tokens)``, each group's count of leading
  tokens that no future token's window reaches once that many are computed (vLLM's
  ``get_num_skipped_tokens`` of each single-type manager). The manager suite asks it in
  models of several groups at each allocation's computed-token count and judges the
  sliding-window (KV-SWA-006) and chunked-local (KV-CHUNK-002) entries.
* ``mamba_align``: ``new_step()``, the scheduler's call at the start of each step
  (``KVCacheManager.new_step_starts``). The manager suite generates Mamba groups with prefix
  caching on (vLLM's "align" mode, chapter 8) only for an adapter claiming it, and calls
  ``new_step()`` between steps (KV-MAMBA-009: a state cached in a step is a hit only after it).
* ``mamba_partial_hits``: ``take_copies()``, what the scheduler does at the end of each step with
  ``KVCacheManager.take_kv_cache_block_copies``: the copies the allocations queued, as (source,
  copy) block ids in order, with the reference that held both pages of each released (without
  deferred frees). The manager suite generates align-mode Mamba groups coarser than the hash block
  (vLLM's fine-grained partial hits, KV-MAMBA-019 .. KV-MAMBA-025) only for an adapter claiming it,
  and takes the copies before each ``new_step()``. In a paged store (``PagedStoreWrapper``) the claim
  stands only where the adapter also has ``pending_copies()`` -- the queued copies, not taken -- which
  the store's runner makes before each step's forward (KV-MAMBA-026).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from kvoracle.reference import HybridConfig, ManagerConfig

from .harness import returns
from .harness.capabilities import Capabilities

#: A cache key in kvoracle's terms: (kvoracle hash of the prefix, KV-cache group id).
KeyRef = tuple[bytes, int]
#: Prefix marking an engine hash that maps to no known prefix.
UNKNOWN_HASH = b"unknown:"

#: The configuration every adapter accepts (validated on construction).
EngineConfig = ManagerConfig

@attrs.frozen
class Lookup:
    """A prefix-cache hit: per-group hit block ids and the hit length in tokens."""

    block_ids: tuple[tuple[int, ...], ...]
    num_tokens: int


@attrs.frozen
class Observation:
    """What kvoracle can see of an engine's state. ``None`` = not exposed."""

    num_free_blocks: int
    usage: float
    block_tables: Mapping[str, tuple[tuple[int, ...], ...]]
    free_queue: tuple[int, ...] | None = None
    ref_counts: tuple[int, ...] | None = None
    #: Cache key -> block ids cached under it, in caching order.
    cached: Mapping[KeyRef, tuple[int, ...]] | None = None
    #: Request id -> the engine's block hashes (opaque values; compared for equality only).
    request_hashes: Mapping[str, tuple[object, ...]] | None = None
    #: (rule id, ok, message) per KV-DATA check of the current store state (``kv_data``).
    data_checks: tuple[tuple[str, bool, str], ...] | None = None


#: What each operation of the protocol must return (checked on every call).
RETURNS = {
    "lookup": returns.attributes(Lookup, block_ids=returns.block_id_groups, num_tokens=returns.integer),
    "allocate": returns.optional(returns.block_id_groups),
    "reset_prefix_cache": returns.boolean,
    "common_prefix_blocks": returns.sequence_of(returns.integer),
    "skipped_tokens": returns.sequence_of(returns.integer),
    "take_copies": returns.sequence_of(returns.sequence_of(returns.integer, length=2)),
    "observe": returns.attributes(
        Observation, num_free_blocks=returns.integer, usage=returns.instance_of((int, float)),
        block_tables=returns.mapping_of(returns.instance_of(str), returns.block_id_groups),
        free_queue=returns.optional(returns.sequence_of(returns.integer)),
        ref_counts=returns.optional(returns.sequence_of(returns.integer)),
        cached=returns.optional(returns.mapping_of(returns.sequence_of(returns.anything, length=2),
                                                   returns.sequence_of(returns.integer))),
        request_hashes=returns.optional(returns.mapping_of(returns.instance_of(str),
                                                           returns.sequence_of(returns.anything))),
        data_checks=returns.optional(returns.sequence_of(returns.sequence_of(returns.anything, length=3)))),
}


@runtime_checkable
class EngineAdapter(Protocol):
    """The operations and observations kvoracle drives an engine through."""

    #: Short engine name used in reports.
    name: str

    def version(self) -> str: ...

    def capabilities(self) -> Capabilities: ...

    def configure(self, config: EngineConfig | HybridConfig) -> None:
        """Build a fresh engine (an empty pool) for ``config``: one full-attention group (a
        ``ManagerConfig``), or, for an engine claiming ``kv_cache_groups``, a ``HybridConfig``
        of one or more groups of any kinds (one engine group per kvoracle group, in order)."""

    def add_request(self, request_id: str, prompt: Sequence[int],
                    cache_salt: str | None = None) -> None: ...

    def lookup(self, request_id: str, max_cache_hit_length: int | None = None) -> Lookup:
        """``get_computed_blocks``; the adapter remembers the hit for :meth:`allocate`."""

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                 num_encoder_tokens: int = 0) -> tuple[tuple[int, ...], ...] | None:
        """``allocate_slots``; a non-zero hit adopts the blocks of the last lookup.
        ``num_encoder_tokens`` sizes a cross-attention group (KV-CROSS-001); it is passed
        only with a ``HybridConfig`` (an adapter claiming no ``kv_cache_groups`` needs no such
        parameter).

        Returns the newly allocated block ids per group, or ``None`` when the pool
        is short.
        """

    def advance(self, request_id: str, num_tokens: int) -> None:
        """The scheduler ran ``num_tokens`` more tokens: num_computed_tokens += it."""

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        """Decode produced ``tokens``; they are appended to the request."""

    def free(self, request_id: str, preempted: bool = False) -> None:
        """Free the request; a preempted request waits again with 0 computed tokens."""

    def evict(self, block_ids: Sequence[int]) -> None: ...

    def reset_prefix_cache(self) -> bool: ...

    def common_prefix_blocks(self, request_id: str) -> tuple[int, ...]: ...

    def observe(self) -> Observation: ...


@runtime_checkable
class OptionalEngineAdapter(Protocol):
    """The optional operations of an engine adapter, each offered only by an adapter that
    claims its capability (``capabilities()``)."""

    def capabilities(self) -> Capabilities: ...

    def skipped_tokens(self, num_computed_tokens: int) -> tuple[int, ...]:
        """``skipped_tokens``: per KV-cache group, in order, the tokens skipped after
        ``num_computed_tokens`` computed tokens (``get_num_skipped_tokens``; 0 for a group that
        skips none). Asked only of models configured with a ``HybridConfig``."""

    def new_step(self) -> None:
        """``mamba_align``: a new scheduler step starts (``new_step_starts``)."""

    def take_copies(self) -> tuple[tuple[int, int], ...]:
        """``mamba_partial_hits``: the queued copies as (source, copy) block ids, in order; both
        pages of each lose the reference that held them (KV-MAMBA-025)."""
