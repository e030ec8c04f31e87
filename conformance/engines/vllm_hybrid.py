"""vLLM's real ``KVCacheManager`` (0.14 and later) behind the hybrid lookup suite's adapter.

``kvoracle check --suite hybrid --engine vllm`` drives this adapter
(:class:`kvoracle.conformance.hybrid_lookup.HybridLookupAdapter`): each
configuration builds a fresh vLLM ``KVCacheManager`` over one KV-cache group
per kvoracle spec, seeding fills vLLM's own ``BlockPool`` with the operations
kvoracle's reference performs (``HybridCoordinator.seed_cache``), and a lookup
is vLLM's ``KVCacheManager.get_computed_blocks``, so the hit length and the
per-group block ids are vLLM's answer. Block hashes are vLLM's too: every
prompt becomes a vLLM ``Request`` hashed by ``get_request_block_hasher``.

How the kvoracle specs become vLLM's (``vllm.v1.kv_cache_interface``):

* full attention, sliding window and chunked local attention map to the vLLM
  class of the same name; ``dtype_bytes`` picks a torch dtype of that width;
* Mamba maps to ``MambaSpec`` with one state tensor per kvoracle shape and
  ``mamba_cache_mode="align"``: vLLM's ``MambaManager`` refuses prefix caching
  in any other mode, and in "align" mode its lookup is kvoracle's KV-MAMBA-001
  (the rightmost cached block whose end is aligned, behind null blocks; with
  partial hits on KV-MAMBA-020's, the last cached hash boundary), with
  the EAGLE drop ignored and no EAGLE margin (KV-MAMBA-002);
* other kinds (MLA, sink, cross attention) are not translated: the hybrid
  suite does not generate them, and ``configure`` raises ``ValueError``.

Configuration kept off or fixed, because kvoracle does not specify it:

* prefix-cache retention: ``prefix_cache_retention_interval=None`` (dense);
* fine-grained partial hash hits: ``KVCacheManager`` has no switch for them
  (``HybridKVCacheCoordinator`` is built with ``allow_partial_hash_hits=True``);
  vLLM turns them on by itself where an align-mode Mamba group's block is larger
  than the hash block and every other group can follow
  (``partial_hash_hits_enabled``), the models the suite generates for an engine
  claiming ``mamba_partial_hits`` (KV-MAMBA-019). The adapter leaves that decision
  to vLLM and the lookups show it; ``seed_partial_entry`` leaves a partial entry
  with ``BlockPool.cache_partial_block``, the call vLLM's ``MambaManager`` keys a
  producer's tail with (KV-MAMBA-021), on a page taken from the pool and freed;
* EAGLE: ``use_eagle`` from the config, with no group flagged ``is_eagle_group``,
  so vLLM flags every group (its fallback), as kvoracle's spec does;
* KV-cache events, metrics, prompt logprobs, connectors, DCP/PCP: unused.

One vLLM constraint shapes the hashes: with a single KV-cache group vLLM uses
its ``UnitaryKVCacheCoordinator``, which requires ``hash_block_size`` to equal
the group's block size (vLLM's engine resolves it so). For a one-group
configuration the adapter therefore hashes at the group's block size. Whether a
block is cached depends only on the prefix it ends, so the cached blocks, the
hit and the block ids are the same as with finer hashes; only the reference's
``num_hashed_tokens`` (the EAGLE margin's cap) could differ, and the unitary
coordinator applies no EAGLE margin -- the suite never builds a one-group
EAGLE configuration.

The adapter also offers the suite's optional operations and claims their
capabilities (``seed_partial_entry`` above, where the release has partial hits):
``uncached_common_prefix_tokens()``, the coordinator's third result for the last lookup
(KV-HYB-008), recovered from the ``shared_prefix_boundary`` that ``get_computed_blocks``
returns (the hit plus that result, or 0 when it is 0); and
``lookup_per_group()``, the hybrid coordinator's ``find_longest_cache_hit_per_group``
(KV-HYB-011), which vLLM has only with two or more KV-cache groups (the unitary
coordinator has none, and the suite asks for it only there).

vLLM is imported when the adapter is built, never when this module is
imported. Install it with ``scripts/install_vllm.sh``.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvoracle.reference.hybrid import HybridConfig
from kvoracle.reference.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from ..adapter import Lookup
from ..harness.capabilities import Capabilities
from ..hybrid_lookup import PerGroupLookup
from . import EngineLoadError
from .vllm import INSTALL_HINT, _load_vllm, computed_blocks, free_order, mamba_align, new_manager, new_request
from .vllm_api import call, takes

_HYBRID: SimpleNamespace | None = None


def _load() -> SimpleNamespace:
    """vLLM's modules for the lockstep adapter plus the spec classes a hybrid model needs."""
    global _HYBRID
    if _HYBRID is not None:
        return _HYBRID
    base = _load_vllm()  # imports vLLM once and refuses other release lines
    try:
        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec as VllmChunkedLocal,
        )
        from vllm.v1.kv_cache_interface import CrossAttentionSpec as VllmCrossAttention
        from vllm.v1.kv_cache_interface import MambaSpec as VllmMamba
        from vllm.v1.kv_cache_interface import SlidingWindowSpec as VllmSlidingWindow
    except ImportError as error:
        raise EngineLoadError(f"engine 'vllm': vllm {base.version} is incomplete ({error}); "
                              f"{INSTALL_HINT}") from error
    _HYBRID = SimpleNamespace(**vars(base), SlidingWindowSpec=VllmSlidingWindow,
                              ChunkedLocalAttentionSpec=VllmChunkedLocal, MambaSpec=VllmMamba,
                              CrossAttentionSpec=VllmCrossAttention,
                              HybridKVCacheCoordinator=HybridKVCacheCoordinator)
    return _HYBRID


def _layer_name(group_id: int) -> str:
    return f"model.layers.{group_id}.attn"


def _dtype(v: SimpleNamespace, num_bytes: int) -> Any:
    torch = v.torch
    dtypes = {1: torch.int8, 2: torch.float16, 4: torch.float32, 8: torch.float64}
    if num_bytes not in dtypes:
        raise ValueError(f"no torch dtype of {num_bytes} bytes for a vLLM spec")
    return dtypes[num_bytes]


def vllm_spec(v: SimpleNamespace, kv_spec: KVCacheSpec, caching: bool = True) -> Any:
    """vLLM's ``kv_cache_interface`` spec for one kvoracle spec (``v`` from :func:`_load`), in a
    manager with prefix caching on or off (``caching``)."""
    common = {"block_size": kv_spec.block_size, "num_kv_heads": kv_spec.num_kv_heads,
              "head_size": kv_spec.head_size, "dtype": _dtype(v, kv_spec.dtype_bytes),
              "page_size_padded": kv_spec.page_size_padded}
    if type(kv_spec) is FullAttentionSpec and not kv_spec.use_mla:
        return call(v.version, v.FullAttentionSpec, **common, sliding_window=kv_spec.sliding_window,
                    attention_chunk_size=kv_spec.attention_chunk_size)
    if type(kv_spec) is SlidingWindowSpec:
        return call(v.version, v.SlidingWindowSpec, **common, sliding_window=kv_spec.sliding_window,
                    extra_retained_tokens=kv_spec.extra_retained_tokens,
                    built_in={"extra_retained_tokens": 0})
    if type(kv_spec) is ChunkedLocalAttentionSpec:
        return call(v.version, v.ChunkedLocalAttentionSpec, **common,
                    attention_chunk_size=kv_spec.attention_chunk_size)
    if type(kv_spec) is CrossAttentionSpec:
        return call(v.version, v.CrossAttentionSpec, **common)
    if type(kv_spec) is MambaSpec:
        # Releases before the cache modes (0.14) keep Mamba states at block ends with prefix
        # caching on, which is "align" mode, and the last state only with it off, which is
        # "none"; they have no prefill checkpoint blocks.
        return call(
            v.version, v.MambaSpec, block_size=kv_spec.block_size, shapes=kv_spec.shapes,
            dtypes=tuple(_dtype(v, n) for n in kv_spec.state_dtype_bytes),
            page_size_padded=kv_spec.page_size_padded, mamba_cache_mode=kv_spec.mamba_cache_mode,
            num_speculative_blocks=kv_spec.num_speculative_blocks,
            num_prefill_checkpoint_blocks=kv_spec.num_prefill_checkpoint_blocks,
            prefill_checkpoint_alignment=kv_spec.prefill_checkpoint_alignment,
            built_in={"mamba_cache_mode": "align" if caching else "none", "num_prefill_checkpoint_blocks": 0,
                      "prefill_checkpoint_alignment": None})
    raise ValueError(f"the vLLM hybrid adapters do not translate {type(kv_spec).__name__}"
                     f"{' (MLA)' if getattr(kv_spec, 'use_mla', False) else ''}")


class VllmHybridLookup:
    """Hybrid prefix-cache lookups of vLLM 0.33.x's ``KVCacheManager``.

    ``self.manager`` is the vLLM manager of the current configuration.
    """

    name = "vllm"

    def __init__(self) -> None:
        self.vllm = _load()
        self.config: HybridConfig | None = None
        self.manager: Any = None
        #: The block size vLLM hashes at (see the module docstring for one group).
        self.hash_block_size = 0
        self._hasher: Any = None
        self._ids = itertools.count()
        #: The coordinator's third result for the last lookup (KV-HYB-008).
        self.uncached = 0

    def version(self) -> str:
        return self.vllm.version

    def capabilities(self) -> Capabilities:
        # Releases before 0.26 report no uncached common prefix (their lookups return two
        # results) and releases before 0.28 have no per-group lookup.
        v = self.vllm
        declared = str(inspect.signature(v.KVCacheManager.get_computed_blocks).return_annotation)
        # Partial hits: a coordinator that decides them and a pool that keys an entry inside a block.
        partial = (hasattr(v.HybridKVCacheCoordinator, "enable_partial_hash_hits")
                   and hasattr(v.BlockPool, "cache_partial_block"))
        return Capabilities(uncached_prefix_tokens=declared.count("int") >= 2, free_order=free_order(v),
                            per_group_lookup=hasattr(v.HybridKVCacheCoordinator,
                                                     "find_longest_cache_hit_per_group"),
                            kv_cache_groups=True, mamba_align=mamba_align(),
                            mamba_partial_hits=partial and mamba_align())

    # -- configuration -------------------------------------------------------------------
    def configure(self, config: HybridConfig) -> None:
        v = self.vllm
        if not getattr(config, "enable_caching", True):
            raise ValueError("the hybrid lookup adapter needs prefix caching (enable_caching=True)")
        # The seed of vLLM's hash chain: fixed for SHA-256, so equal on every call.
        v.utils.init_none_hash(v.sha256)
        groups = [v.KVCacheGroupSpec([_layer_name(g)], vllm_spec(v, kv_spec))
                  for g, kv_spec in enumerate(config.kv_cache_specs)]
        single = len(groups) == 1
        self.hash_block_size = config.kv_cache_specs[0].block_size if single else config.hash_block_size
        self.manager = new_manager(v, groups, config.num_blocks, max_model_len=config.max_model_len,
                                   scheduler_block_size=config.scheduler_block_size,
                                   hash_block_size=self.hash_block_size, enable_caching=True,
                                   use_eagle=config.use_eagle)
        self._hasher = v.utils.get_request_block_hasher(self.hash_block_size, v.sha256)
        self.config = config

    # -- operations ----------------------------------------------------------------------
    def request(self, prompt_tokens: Sequence[int]) -> Any:
        """A fresh vLLM request for the prompt, its block hashes computed by vLLM."""
        assert self.config is not None
        return new_request(self.vllm, f"hybrid-{next(self._ids)}", prompt_tokens,
                           self.config.max_model_len, self._hasher)

    def seed_cache(self, prompt_tokens: Sequence[int], group_id: int, mask: Sequence[bool]) -> None:
        assert self.config is not None
        size = self.config.kv_cache_specs[group_id].block_size
        request = self.request(prompt_tokens)
        num_view_blocks = len(request.block_hashes) * self.hash_block_size // size
        if len(mask) > num_view_blocks:
            raise ValueError(f"mask covers {len(mask)} blocks but the prompt hashes only "
                             f"{num_view_blocks} of group {group_id}")
        length = max((j + 1 for j, keep in enumerate(mask) if keep), default=0)
        if length == 0:
            return
        pool = self.manager.block_pool
        blocks = pool.get_new_blocks(length)
        keep = [bool(k) for k in mask[:length]]
        if takes(pool.cache_full_blocks, "block_mask"):
            pool.cache_full_blocks(request=request, blocks=blocks, num_cached_blocks=0,
                                   num_full_blocks=length, block_size=size, kv_cache_group_id=group_id,
                                   block_mask=keep)
        else:  # before 0.22: cache them all, then uncache the masked-out ones
            pool.cache_full_blocks(request=request, blocks=blocks, num_cached_blocks=0,
                                   num_full_blocks=length, block_size=size, kv_cache_group_id=group_id)
            for block, cached in zip(blocks, keep):
                if not cached:
                    pool._maybe_evict_cached_block(block)
        pool.free_blocks(reversed(blocks))  # a finished request: table tail first

    def seed_partial_entry(self, prompt_tokens: Sequence[int], group_id: int, num_tokens: int) -> None:
        assert self.config is not None
        pool = self.manager.block_pool
        page = pool.get_new_blocks(1)[0]
        pool.cache_partial_block(request=self.request(prompt_tokens), block=page, num_tokens=num_tokens,
                                 kv_cache_group_id=group_id, block_size=self.config.kv_cache_specs[group_id].block_size)
        pool.free_blocks([page])

    def lookup(self, prompt_tokens: Sequence[int], max_cache_hit_length: int | None = None) -> Lookup:
        blocks, num_tokens, shared_prefix_boundary = computed_blocks(
            self.manager, self.request(prompt_tokens), max_cache_hit_length)
        # The manager reports hit + uncached as the boundary when uncached > 0, else 0.
        self.uncached = shared_prefix_boundary - num_tokens if shared_prefix_boundary else 0
        return Lookup(tuple(tuple(ids) for ids in blocks.get_block_ids()), num_tokens)

    def uncached_common_prefix_tokens(self) -> int:
        return self.uncached

    def lookup_per_group(self, prompt_tokens: Sequence[int],
                         max_cache_hit_length: int | None = None) -> PerGroupLookup:
        coordinator = self.manager.coordinator
        if not hasattr(coordinator, "find_longest_cache_hit_per_group"):
            raise ValueError(f"vLLM's {type(coordinator).__name__} has no per-group lookup (one KV-cache group)")
        bound = len(prompt_tokens) - 1 if max_cache_hit_length is None else max_cache_hit_length
        blocks, hits = coordinator.find_longest_cache_hit_per_group(self.request(prompt_tokens).block_hashes, bound)
        return PerGroupLookup(tuple(tuple(block.block_id for block in group) for group in blocks),
                              tuple(hits))
