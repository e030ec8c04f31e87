"""The torch-backed engine: kvoracle's tensor block pool and manager behind the adapter protocol.

* :class:`TorchEngine` -- kvoracle's tensor block pool and manager
  (:mod:`kvoracle.gpu`) behind the adapter protocol. It claims everything the
  reference claims: exact block ids, LRU order, every observation.
* :class:`GpuEngine` (``kvoracle check --engine gpu``) -- the torch engine in a
  paged KV store (:mod:`.paged_store`), whose data is judged too (KV-DATA).

The paged-store wrappers of other engines live in :mod:`.paged_store`; their names
are importable from here as well, as they were before that module was split off.
The device is :func:`kvoracle.gpu.default_device` (``KVORACLE_DEVICE`` overrides it).
Importing this module needs torch; it takes ``torch`` from :mod:`kvoracle.gpu`, which
imports it without the warning a CPU build without numpy prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoracle import __version__
from kvoracle.gpu import TorchKVCacheManager, default_device, torch

from ..adapter import Capabilities, EngineConfig, Lookup, Observation
from .paged_store import (  # noqa: F401  (re-exported: engine specs name them here)
    PagedReferenceEngine,
    PagedStoreWrapper,
    PagedVllmEngine,
)


class TorchEngine:
    """Adapter over :class:`kvoracle.gpu.TorchKVCacheManager` (no KV store).

    ``self.manager`` is the manager, ``self.manager.pool`` the tensor pool; subclass
    and replace :meth:`make_manager` to build variants.
    """

    name = "torch"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        self.config: EngineConfig | None = None
        self.manager: TorchKVCacheManager | None = None
        self.running: set[str] = set()
        self.last_hit: dict[str, torch.Tensor] = {}

    def version(self) -> str:
        return f"{__version__} (torch {torch.__version__}, {self.device})"

    def capabilities(self) -> Capabilities:
        return Capabilities(common_prefix="zero")

    def make_manager(self, config: EngineConfig) -> TorchKVCacheManager:
        return TorchKVCacheManager(
            config.num_blocks, config.block_size, config.max_model_len,
            hash_block_size=config.hash_block_size, enable_caching=config.enable_caching,
            use_eagle=config.use_eagle, device=self.device)

    def configure(self, config: EngineConfig) -> None:
        self.config = config
        self.manager = self.make_manager(config)
        self.running = set()
        self.last_hit = {}

    def add_request(self, request_id: str, prompt: Sequence[int],
                    cache_salt: str | None = None) -> None:
        assert self.manager is not None
        self.manager.add_request(request_id, prompt, cache_salt)

    def lookup(self, request_id: str, max_cache_hit_length: int | None = None) -> Lookup:
        assert self.manager is not None
        blocks, num_tokens = self.manager.get_computed_blocks(request_id, max_cache_hit_length)
        self.last_hit[request_id] = blocks
        return Lookup((tuple(blocks.tolist()),), num_tokens)

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False
                 ) -> tuple[tuple[int, ...], ...] | None:
        assert self.manager is not None
        hit = self.last_hit.pop(request_id, None) if num_new_computed_tokens else None
        new = self.manager.allocate_slots(request_id, num_new_tokens, num_new_computed_tokens,
                                          hit, num_lookahead_tokens, delay_cache_blocks)
        if new is None:
            return None
        if request_id not in self.running:  # the first allocation adopts the hit
            self.running.add(request_id)
            self.manager.requests[request_id].num_computed_tokens += num_new_computed_tokens
        return (tuple(new.tolist()),)

    def advance(self, request_id: str, num_tokens: int) -> None:
        assert self.manager is not None
        self.manager.requests[request_id].num_computed_tokens += num_tokens

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        assert self.manager is not None
        self.manager.append_tokens(request_id, tokens)

    def free(self, request_id: str, preempted: bool = False) -> None:
        assert self.manager is not None
        self.manager.free(request_id)
        self.running.discard(request_id)
        self.last_hit.pop(request_id, None)
        if preempted:
            self.manager.requests[request_id].num_computed_tokens = 0
        else:
            self.manager.forget(request_id)

    def evict(self, block_ids: Sequence[int]) -> None:
        assert self.manager is not None
        self.manager.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        assert self.manager is not None
        return self.manager.reset_prefix_cache()

    def common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        return (0,)  # KV-LIFE-010: cascade attention is gone

    def paged_block_tables(self, request_id: str) -> tuple[torch.Tensor, ...] | None:
        """The request's block table per group, as tensors (for :class:`PagedStoreWrapper`)."""
        assert self.manager is not None
        table = self.manager.tables.get(request_id)
        return None if table is None else (table,)

    def observe(self) -> Observation:
        manager = self.manager
        assert manager is not None
        pool = manager.pool
        return Observation(
            num_free_blocks=pool.num_free_blocks(),
            usage=pool.usage(),
            block_tables={rid: (tuple(table.tolist()),) for rid, table in manager.tables.items()},
            free_queue=tuple(pool.free_queue().tolist()),
            ref_counts=tuple(pool.ref_cnt.tolist()),
            cached=pool.cached_map(),
            request_hashes={rid: r.hashes for rid, r in manager.requests.items()},
        )


class GpuEngine(PagedStoreWrapper):
    """``kvoracle check --engine gpu``: the torch engine in its paged KV store, one device."""

    name = "gpu"

    def __init__(self, device: torch.device | str | None = None) -> None:
        device = torch.device(device) if device is not None else default_device()
        super().__init__(TorchEngine(device), device)
