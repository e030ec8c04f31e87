"""The embedded default engine: kvoracle's own reference manager behind the adapter."""

from __future__ import annotations

from collections.abc import Sequence

from kvoracle import __version__
from kvoracle.reference import KVCacheBlocks, KVCacheManager, Request, RequestStatus
from kvoracle.spec.contracts import suspended

from ..adapter import Capabilities, EngineConfig, Lookup, Observation


class ReferenceEngine:
    """Adapter over :class:`kvoracle.reference.KVCacheManager`.

    Subclass it to build variants (the meta-tests' broken engines do): the
    manager is ``self.manager``, requests are ``self.requests``.
    """

    name = "reference"

    def __init__(self, common_prefix: str = "zero", free_order: str = "unhashed_first",
                 mamba_free_lag: bool = False) -> None:
        #: Which get_num_common_prefix_blocks behaviour to show: "zero" (KV-LIFE-010)
        #: or "cascade" (KV-LIFE-011).
        self.common_prefix = common_prefix
        #: How freed blocks return to the free queue: "unhashed_first" (KV-POOL-006) or
        #: "append" (KV-POOL-016).
        self.free_order = free_order
        #: Whether Mamba groups free their skipped blocks late (KV-HLC-009) or not (KV-HLC-008).
        self.mamba_free_lag = mamba_free_lag
        self.config: EngineConfig | None = None
        self.manager: KVCacheManager | None = None
        self.requests: dict[str, Request] = {}
        self.last_hit: dict[str, KVCacheBlocks] = {}

    def version(self) -> str:
        return __version__

    def capabilities(self) -> Capabilities:
        return Capabilities(common_prefix=self.common_prefix, free_order=self.free_order,
                            mamba_free_lag=self.mamba_free_lag, kv_cache_groups=True,
                            hash_block_views=True, skipped_tokens=True, mamba_align=True,
                            mamba_partial_hits=True)

    def make_manager(self, config: EngineConfig) -> KVCacheManager:
        return KVCacheManager(config)

    def configure(self, config: EngineConfig) -> None:
        self.config = config
        self.manager = self.make_manager(config)
        self.manager.pool.unhashed_first = self.free_order == "unhashed_first"
        for group in getattr(self.manager, "groups", ()):
            group.mamba_free_lag = self.mamba_free_lag
        self.requests = {}
        self.last_hit = {}

    def add_request(self, request_id: str, prompt: Sequence[int],
                    cache_salt: str | None = None) -> None:
        assert self.config is not None
        self.requests[request_id] = Request(request_id, tuple(prompt),
                                            self.config.hash_block_size, cache_salt=cache_salt)

    def lookup(self, request_id: str, max_cache_hit_length: int | None = None) -> Lookup:
        assert self.manager is not None
        blocks, num_tokens = self.manager.get_computed_blocks(
            self.requests[request_id], max_cache_hit_length)
        self.last_hit[request_id] = blocks
        return Lookup(blocks.get_block_ids(), num_tokens)

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                 num_encoder_tokens: int = 0) -> tuple[tuple[int, ...], ...] | None:
        assert self.manager is not None
        request = self.requests[request_id]
        hit = self.last_hit.pop(request_id, None) if num_new_computed_tokens else None
        result = self.manager.allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, hit,
            num_lookahead_tokens=num_lookahead_tokens, delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=num_encoder_tokens)
        if result is None:
            return None
        if request.status is not RequestStatus.RUNNING:
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens += num_new_computed_tokens
        return result.get_block_ids()

    def advance(self, request_id: str, num_tokens: int) -> None:
        self.requests[request_id].num_computed_tokens += num_tokens

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        self.requests[request_id].append_output_token_ids(list(tokens))

    def free(self, request_id: str, preempted: bool = False) -> None:
        assert self.manager is not None
        request = self.requests[request_id]
        self.manager.free(request)
        if preempted:
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
        else:
            request.status = RequestStatus.FINISHED
            del self.requests[request_id]

    def evict(self, block_ids: Sequence[int]) -> None:
        assert self.manager is not None
        self.manager.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        assert self.manager is not None
        return self.manager.reset_prefix_cache()

    def common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        assert self.manager is not None
        if self.common_prefix == "cascade":
            return tuple(self.manager.get_num_common_prefix_blocks_cascade(request_id))
        return tuple(self.manager.get_num_common_prefix_blocks(request_id))

    def new_step(self) -> None:
        """The scheduler starts a step (KV-MAMBA-009)."""
        assert self.manager is not None
        self.manager.new_step_starts()

    def take_copies(self) -> tuple[tuple[int, int], ...]:
        """The scheduler takes the queued copies and releases their pages (KV-MAMBA-025)."""
        assert self.manager is not None
        return tuple(self.manager.take_kv_cache_block_copies())

    def pending_copies(self) -> tuple[tuple[int, int], ...]:
        """The copies queued and not taken yet, as (source, copy) block ids in order, without taking
        them: what a paged store's runner copies before the step's forward (KV-MAMBA-026). Not an
        operation of the protocol; the store asks it only of partial-hit models."""
        assert self.manager is not None
        return tuple((source.block_id, copy.block_id) for group in self.manager.groups
                     for source, copy in group.pending_copies)

    def skipped_tokens(self, num_computed_tokens: int) -> tuple[int, ...]:
        """Each group's skipped tokens after ``num_computed_tokens`` (KV-SWA-006, KV-CHUNK-002)."""
        assert self.manager is not None
        return tuple(group.skipped_tokens(num_computed_tokens) for group in self.manager.groups)

    def observe(self) -> Observation:
        manager = self.manager
        assert manager is not None
        pool = manager.pool
        # Reading changes nothing, and every change was followed by the class invariants' check:
        # checking them again around each of these reads (the manager's once per request) cost
        # about a seventh of the manager runs profiled (docs/results.md, fifteenth part).
        with suspended():
            return Observation(
                num_free_blocks=pool.num_free_blocks(),
                usage=pool.usage(),
                block_tables={rid: manager.get_block_ids(rid) for rid in manager.requests()},
                free_queue=pool.free_queue.block_ids(),
                ref_counts=pool.ref_counts(),
                cached={key: tuple(blocks) for key, blocks in pool.cached.items()},
                request_hashes={rid: tuple(r.block_hashes) for rid, r in self.requests.items()},
            )
