"""vLLM's real ``KVCacheManager`` over hybrid configurations, behind the hybrid lifecycle protocol.

The manager is built from kvoracle's :class:`~kvoracle.reference.hybrid.HybridConfig`
with vLLM's own spec classes, one KV-cache group per kvoracle group, and driven
the way vLLM's scheduler drives it (see :mod:`.vllm`). Configured off, as in the
single-group adapter: the prefix-cache retention interval (``None``, dense), MTP
lookahead, the admission watermark and gates, KV events and stats.

Observation: block tables per group (requests holding at least one entry), ref
counts, the free queue and the cache map in kvoracle's keys. Partial tail entries
(KV-HLC-006) are left out of the cache map: kvoracle does not specify them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoracle.reference.hybrid import HybridConfig
from kvoracle.spec.hashing import extend_block_hashes

from ..adapter import UNKNOWN_HASH, KeyRef, Lookup, Observation
from . import EngineLoadError
from .vllm import _ids, _load_vllm


def _vllm_spec(kv_spec: Any) -> Any:
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    common = {"block_size": kv_spec.block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    if kv_spec.kind == "full":
        return kvi.FullAttentionSpec(**common)
    if kv_spec.kind == "sliding_window":
        return kvi.SlidingWindowSpec(**common, sliding_window=kv_spec.sliding_window)
    if kv_spec.kind == "chunked_local":
        return kvi.ChunkedLocalAttentionSpec(**common, attention_chunk_size=kv_spec.attention_chunk_size)
    if kv_spec.kind == "cross_attention":
        return kvi.CrossAttentionSpec(**common)
    raise EngineLoadError(f"engine 'vllm' (hybrid lifecycle): no vLLM spec for kind {kv_spec.kind!r}")


class VllmHybridLifecycle:
    """Adapter over vLLM 0.33's ``KVCacheManager`` with several KV-cache groups."""

    name = "vllm"

    def __init__(self) -> None:
        self.vllm = _load_vllm()
        self.config: HybridConfig | None = None
        self.manager: Any = None
        self.requests: dict[str, Any] = {}
        self.last_hit: dict[str, Any] = {}
        self.translation: dict[bytes, bytes] = {}
        #: Engine block hash -> its position in the request's hash chain (prefix length / h - 1).
        self.hash_index: dict[bytes, int] = {}
        self.kv_hashes: dict[str, tuple[bytes, ...]] = {}
        self._hasher: Any = None

    def version(self) -> str:
        return self.vllm.version

    def configure(self, config: HybridConfig) -> None:
        v = self.vllm
        v.utils.init_none_hash(v.sha256)
        groups = [v.KVCacheGroupSpec([f"model.layers.{i}.attn"], _vllm_spec(s))
                  for i, s in enumerate(config.kv_cache_specs)]
        kv_cache_config = v.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                                          kv_cache_groups=groups)
        self.manager = v.KVCacheManager(
            kv_cache_config, max_model_len=config.max_model_len,
            scheduler_block_size=config.scheduler_block_size, hash_block_size=config.hash_block_size,
            enable_caching=config.enable_caching, use_eagle=config.use_eagle, num_hash_lookahead_tokens=0,
            num_prefill_lookahead=0, log_stats=False, enable_kv_cache_events=False, watermark=0.0)
        self._hasher = v.utils.get_request_block_hasher(config.hash_block_size, v.sha256)
        self.config = config
        self.requests, self.last_hit, self.translation, self.kv_hashes = {}, {}, {}, {}
        self.hash_index = {}

    def add_request(self, request_id: str, prompt: Sequence[int]) -> None:
        assert self.config is not None
        v = self.vllm
        self.requests[request_id] = v.Request(
            request_id, list(prompt), sampling_params=v.SamplingParams(max_tokens=self.config.max_model_len),
            pooling_params=None, block_hasher=self._hasher)
        self.kv_hashes[request_id] = ()
        self._translate(request_id)

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        self.requests[request_id].append_output_token_ids(list(tokens))
        self._translate(request_id)

    def _translate(self, request_id: str) -> None:
        assert self.config is not None
        request = self.requests[request_id]
        known = self.kv_hashes[request_id]
        ours = extend_block_hashes(known, tuple(request.all_token_ids), self.config.hash_block_size, None)
        self.kv_hashes[request_id] = ours
        for index, (engine_hash, kv_hash) in enumerate(zip(request.block_hashes[len(known):],
                                                           ours[len(known):]), start=len(known)):
            self.translation.setdefault(bytes(engine_hash), kv_hash)
            self.hash_index.setdefault(bytes(engine_hash), index)

    def lookup(self, request_id: str) -> Lookup:
        blocks, num_tokens, _ = self.manager.get_computed_blocks(self.requests[request_id])
        self.last_hit[request_id] = blocks
        return Lookup(_ids(blocks.get_block_ids()), num_tokens)

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                 num_encoder_tokens: int = 0) -> tuple[tuple[int, ...], ...] | None:
        request = self.requests[request_id]
        hit = self.last_hit.pop(request_id, None)
        result = self.manager.allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, hit if num_new_computed_tokens else None,
            num_lookahead_tokens=num_lookahead_tokens, delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=num_encoder_tokens)
        if result is None:
            return None
        status = self.vllm.RequestStatus
        if request.status != status.RUNNING:
            request.status = status.RUNNING
            request.num_computed_tokens += num_new_computed_tokens
        return _ids(result.get_block_ids())

    def advance(self, request_id: str, num_tokens: int) -> None:
        self.requests[request_id].num_computed_tokens += num_tokens

    def free(self, request_id: str, preempted: bool = False) -> None:
        request = self.requests[request_id]
        self.manager.free(request)
        self.last_hit.pop(request_id, None)
        status = self.vllm.RequestStatus
        if preempted:
            request.status = status.PREEMPTED
            request.num_computed_tokens = 0
            request.num_preemptions += 1
        else:
            request.status = status.FINISHED_STOPPED
            del self.requests[request_id]
            del self.kv_hashes[request_id]

    def observe(self) -> Observation:
        manager = self.manager
        pool = manager.block_pool
        coordinator = manager.coordinator
        holding = {rid for m in coordinator.single_type_managers for rid, t in m.req_to_blocks.items() if t}
        return Observation(
            num_free_blocks=pool.get_num_free_blocks(), usage=manager.usage,
            block_tables={rid: _ids(coordinator.get_blocks(rid)) for rid in holding},
            free_queue=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
            ref_counts=tuple(b.ref_cnt for b in pool.blocks), cached=self._cache_map(pool))

    def _cache_map(self, pool: Any) -> dict[KeyRef, tuple[int, ...]]:
        """Whole-block entries only: an entry whose block holds a partial boundary (its
        token count is not a whole number of the group's blocks) is KV-HLC-006's."""
        assert self.config is not None
        utils = self.vllm.utils
        sizes = [s.block_size for s in self.config.kv_cache_specs]
        cached: dict[KeyRef, tuple[int, ...]] = {}
        for key, blocks in pool.cached_block_hash_to_block._cache.items():
            group = utils.get_group_id(key)
            engine_hash = bytes(utils.get_block_hash(key))
            kv_hash = self.translation.get(engine_hash, UNKNOWN_HASH + engine_hash)
            index = self.hash_index.get(engine_hash)
            if index is not None and (index + 1) * self.config.hash_block_size % sizes[group]:
                continue  # a boundary inside a block: a partial entry (KV-HLC-006)
            ids = (blocks.block_id,) if isinstance(blocks, utils.KVCacheBlock) else tuple(blocks)
            cached[(kv_hash, group)] = ids
        return cached
