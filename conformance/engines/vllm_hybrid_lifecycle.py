"""vLLM's real ``KVCacheManager`` over hybrid configurations, behind the hybrid lifecycle protocol.

The single-group adapter (:class:`~.vllm.VllmEngine`) with a hybrid configuration:
one vLLM KV-cache group per kvoracle group (specs translated by
:func:`~.vllm_hybrid.vllm_spec`); requests, hash translation, scheduling
bookkeeping and frees are the single-group adapter's. Configured off, as there:
the prefix-cache retention interval (``None``, dense), MTP lookahead, the
admission watermark and gates, KV events and stats.

Observation: the tables of requests holding at least one entry (vLLM's
``req_to_blocks`` is a defaultdict that also lists requests it only looked at),
and the cache map without partial tail entries, which kvoracle does not specify
(KV-HLC-006; their effect on the free queue is specified and compared).
"""

from __future__ import annotations

from typing import Any

from kvoracle.reference.hybrid import HybridConfig

from ..adapter import KeyRef, Observation
from .vllm import VllmEngine
from .vllm_hybrid import _layer_name, _load, vllm_spec


class VllmHybridLifecycle(VllmEngine):
    """Adapter over vLLM 0.33's ``KVCacheManager`` with several KV-cache groups."""

    def __init__(self) -> None:
        super().__init__()
        self.vllm = _load()  # the single-group modules plus the hybrid spec classes
        #: kvoracle hash -> its position in a request's hash chain (prefix length / h - 1).
        self.hash_index: dict[bytes, int] = {}

    def configure(self, config: HybridConfig) -> None:  # type: ignore[override]
        v = self.vllm
        v.utils.init_none_hash(v.sha256)
        groups = [v.KVCacheGroupSpec([_layer_name(g)], vllm_spec(v, kv_spec))
                  for g, kv_spec in enumerate(config.kv_cache_specs)]
        kv_cache_config = v.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                                          kv_cache_groups=groups, prefix_cache_retention_interval=None)
        self.manager = v.KVCacheManager(
            kv_cache_config, max_model_len=config.max_model_len,
            scheduler_block_size=config.scheduler_block_size, hash_block_size=config.hash_block_size,
            enable_caching=config.enable_caching, use_eagle=config.use_eagle, num_hash_lookahead_tokens=0,
            num_prefill_lookahead=0, log_stats=False, enable_kv_cache_events=False, watermark=0.0)
        self._hasher = v.utils.get_request_block_hasher(config.hash_block_size, v.sha256)
        self.config = config  # type: ignore[assignment]
        self.requests, self.last_hit, self.translation, self.kv_hashes = {}, {}, {}, {}
        self.hash_index = {}

    def _translate(self, request_id: str) -> None:
        known = len(self.kv_hashes[request_id])
        super()._translate(request_id)
        for index, kv_hash in enumerate(self.kv_hashes[request_id][known:], start=known):
            self.hash_index.setdefault(kv_hash, index)

    def observe(self) -> Observation:
        observation = super().observe()
        tables = {rid: groups for rid, groups in observation.block_tables.items() if any(groups)}
        return Observation(num_free_blocks=observation.num_free_blocks, usage=observation.usage,
                           block_tables=tables, free_queue=observation.free_queue,
                           ref_counts=observation.ref_counts, cached=observation.cached)

    def _cache_map(self, pool: Any) -> dict[KeyRef, tuple[int, ...]]:
        """Whole-block entries only: a key whose prefix ends inside one of its group's
        blocks is a partial tail entry (KV-HLC-006)."""
        assert self.config is not None
        sizes = [s.block_size for s in self.config.kv_cache_specs]  # type: ignore[attr-defined]
        h = self.config.hash_block_size
        return {(kv_hash, group): ids for (kv_hash, group), ids in super()._cache_map(pool).items()
                if kv_hash not in self.hash_index or (self.hash_index[kv_hash] + 1) * h % sizes[group] == 0}

