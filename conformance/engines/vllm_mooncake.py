"""vLLM's Mooncake store coordinator (vLLM 0.26 and later) behind the external-store adapter.

Wraps ``MooncakeStoreCoordinator(kv_cache_groups, scheduler_block_size,
hash_block_size, use_eagle=..., retention_interval=None,
enable_partial_hash_hits=...)`` and ``ExternalCachedBlockPool(hash_block_size,
exists)`` from ``vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store``
(they import without the ``mooncake`` package). For the differential check the
adapter also builds vLLM's own ``HybridKVCacheCoordinator`` over a block pool
holding exactly the store's keys (``local_hit``).

Configured off: prefix-cache retention interval (``None``: dense), DCP/PCP,
``num_prompt_tokens`` replay boundaries in ``store_mask``. Mamba groups use the
``"align"`` cache mode. Releases are told apart by what they offer: the suite needs the
coordinator's ``lookup_mask`` and a ``store_mask`` that starts at a token, which the
store coordinator of vLLM 0.22 to 0.25 lacks (the suite is then reported unsupported);
partial hash hits are offered where the coordinator takes ``enable_partial_hash_hits``.
vLLM is imported when the adapter is built, never when
this module is imported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvoracle.spec import hybrid as hybrid_spec

from . import EngineLoadError
from .vllm import INSTALL_HINT, installed_vllm
from .vllm_api import call, takes

_VLLM: SimpleNamespace | None = None


def _load_vllm() -> SimpleNamespace:
    """Import the parts of vLLM the adapter needs, once; refuse unsupported versions."""
    global _VLLM
    if _VLLM is not None:
        return _VLLM
    version = installed_vllm("'vllm' (external store)")
    try:
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import coordinator
        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
        from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
    except ImportError as error:
        raise EngineLoadError(f"engine 'vllm' (external store): vllm {version} is incomplete ({error}); "
                              f"{INSTALL_HINT}") from error
    store = coordinator.MooncakeStoreCoordinator
    lacking = [name for name, present in (
        ("lookup_mask", hasattr(store, "lookup_mask")),
        ("store_mask(start_token=...)", takes(getattr(store, "store_mask", None), "start_token")))
        if not present]
    if lacking:
        raise EngineLoadError(f"engine 'vllm' (external store): vllm {version}'s MooncakeStoreCoordinator "
                              f"has no {', '.join(lacking)}, which the external-store suite drives")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    _VLLM = SimpleNamespace(
        version=version, torch=torch, MooncakeStoreCoordinator=coordinator.MooncakeStoreCoordinator,
        ExternalCachedBlockPool=coordinator.ExternalCachedBlockPool,
        HybridKVCacheCoordinator=HybridKVCacheCoordinator, BlockHash=BlockHash,
        make_block_hash_with_group_id=make_block_hash_with_group_id,
        ChunkedLocalAttentionSpec=ChunkedLocalAttentionSpec, FullAttentionSpec=FullAttentionSpec,
        KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec, MambaSpec=MambaSpec,
        SlidingWindowSpec=SlidingWindowSpec)
    return _VLLM


def _vllm_spec(v: SimpleNamespace, kind: str, size: int, param: int) -> Any:
    attention = {"num_kv_heads": 1, "head_size": 1, "dtype": v.torch.float32}
    if kind == hybrid_spec.SLIDING_WINDOW:
        return call(v.version, v.SlidingWindowSpec, block_size=size, sliding_window=param, **attention)
    if kind == hybrid_spec.CHUNKED_LOCAL:
        return call(v.version, v.ChunkedLocalAttentionSpec, block_size=size, attention_chunk_size=param,
                    **attention)
    if kind == hybrid_spec.MAMBA:
        return call(v.version, v.MambaSpec, block_size=size, shapes=((1,),), dtypes=(v.torch.float32,),
                    mamba_cache_mode="align")
    return call(v.version, v.FullAttentionSpec, block_size=size, **attention)


def _masks(masks: Sequence[Sequence[bool] | None], lengths: Sequence[int]) -> tuple[tuple[bool, ...], ...]:
    """vLLM's masks with its ``None`` ("every chunk") sentinel spelled out."""
    return tuple((True,) * n if mask is None else tuple(bool(m) for m in mask)
                 for mask, n in zip(masks, lengths))


class VllmMooncakeStore:
    """vLLM 0.33's ``MooncakeStoreCoordinator`` behind the external-store adapter."""

    name = "vllm-mooncake"

    def __init__(self) -> None:
        self.v = _load_vllm()
        #: Releases before 0.33 have no fine-grained partial hash hits in the store coordinator.
        self.supports_partial_hash_hits = takes(self.v.MooncakeStoreCoordinator, "enable_partial_hash_hits")
        self.setup: Any = None
        self.coordinator: Any = None
        self.groups: list[Any] = []

    def version(self) -> str:
        return self.v.version

    def configure(self, setup: Any) -> None:
        v = self.v
        self.setup = setup
        self.groups = [v.KVCacheGroupSpec([f"model.layers.{i}.attn"], _vllm_spec(v, kind, size, param),
                                          is_eagle_group=bool(setup.eagle_groups[i]))
                       for i, (kind, size, param) in enumerate(setup.groups)]
        self.coordinator = call(v.version, v.MooncakeStoreCoordinator, self.groups, setup.scheduler_block_size,
                                setup.hash_block_size, use_eagle=setup.use_eagle, retention_interval=None,
                                enable_partial_hash_hits=setup.partial,
                                built_in={"enable_partial_hash_hits": False})

    def _hashes(self, block_hashes: Sequence[bytes]) -> list[Any]:
        return [self.v.BlockHash(h) for h in block_hashes]

    def lookup(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[tuple[int, bytes]]
               ) -> tuple[tuple[tuple[bool, ...], ...], int]:
        pool = self.v.ExternalCachedBlockPool(self.setup.hash_block_size, set(exists))
        masks, hit = self.coordinator.find_longest_cache_hit(self._hashes(block_hashes), max_length, pool)
        return tuple(tuple(bool(m) for m in mask) for mask in masks), int(hit)

    def load_mask(self, block_hashes: Sequence[bytes], token_len: int) -> tuple[tuple[bool, ...], ...]:
        return tuple(tuple(bool(m) for m in mask)
                     for mask in self.coordinator.load_mask(self._hashes(block_hashes), token_len))

    def store_mask(self, aligned_len: int, start_token: int = 0) -> tuple[tuple[bool, ...], ...]:
        lengths = [aligned_len // size - min(aligned_len // size, -(-start_token // size))
                   for _, size, _ in self.setup.groups]
        return _masks(self.coordinator.store_mask(aligned_len, start_token), lengths)

    def lookup_mask(self, aligned_len: int) -> tuple[tuple[bool, ...], ...] | None:
        lengths = [aligned_len // size for _, size, _ in self.setup.groups]
        return _masks(self.coordinator.lookup_mask(aligned_len), lengths)

    def local_hit(self, block_hashes: Sequence[bytes], max_length: int,
                  exists: frozenset[tuple[int, bytes]]) -> int | None:
        """vLLM's ``HybridKVCacheCoordinator`` over a pool caching exactly ``exists``; ``None``
        where the release has none for the model (before 0.29 it refuses a model of one spec
        group, KV-HYB-002: there is no local hit to compare the store's with)."""
        v, setup = self.v, self.setup
        config = v.KVCacheConfig(num_blocks=len(exists) + 2, kv_cache_tensors=[], kv_cache_groups=self.groups)
        try:
            local = call(v.version, v.HybridKVCacheCoordinator, config, max_model_len=1 << 20,
                         max_in_flight_tokens=1 << 20, use_eagle=setup.use_eagle, enable_caching=True,
                         enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1,
                         scheduler_block_size=setup.scheduler_block_size, hash_block_size=setup.hash_block_size,
                         allow_partial_hash_hits=setup.partial, built_in={"allow_partial_hash_hits": False})
        except AssertionError as refusal:
            if "at least two attention groups" in str(refusal):
                return None
            raise
        pool = local.block_pool
        for group_id, block_hash in sorted(exists):
            block = pool.get_new_blocks(1)[0]
            key = v.make_block_hash_with_group_id(v.BlockHash(block_hash), group_id)
            block.set_block_hash(key)
            pool.cached_block_hash_to_block.insert(key, block)
        return int(local.find_longest_cache_hit(self._hashes(block_hashes), max_length)[1])
