"""vLLM's real ``KVCacheManager`` (vLLM 0.14 and later) behind kvoracle's adapter protocol.

The adapter drives vLLM's manager the way vLLM's scheduler does: a waiting (or
preempted) request looks its prefix-cache hit up with ``get_computed_blocks``,
adopts it in ``allocate_slots``, becomes RUNNING and counts the hit as computed;
the scheduler's later bookkeeping (computed tokens advancing, output tokens
appended, preemption resetting the computed tokens) is done on the vLLM
``Request`` itself.

Releases: every release from 0.14 on, by feature detection (:mod:`.vllm_api`), not by
version: a keyword a release lacks is left out where that release has kvoracle's value
built in, a bounded lookup goes to the coordinator where ``get_computed_blocks`` takes no
bound, and a capability (cascade common-prefix blocks, skipped-token counts) is claimed
from what the release has. Intended differences of a release are listed, with reasons,
in ``vllm.toml``.

Scope: one KV-cache group of full attention (a :class:`ManagerConfig`) or several groups of
any kind kvoracle specifies (a :class:`HybridConfig`), one vLLM group per kvoracle group.
Features kvoracle does not specify yet are configured off:

* prefix-cache retention interval: ``KVCacheConfig.prefix_cache_retention_interval``
  is left at ``None`` (dense checkpointing);
* fine-grained partial hits are on exactly where vLLM turns them on (an align-mode Mamba
  group coarser than the hash block, every other group of the hash block, KV-MAMBA-019);
  the adapter then offers ``take_copies()``, the scheduler's end of a step
  (``take_kv_cache_block_copies``, the held pages freed at once as without deferred frees),
  and reports a Mamba group's keys inside its blocks in the cache map (KV-MAMBA-021);
* MTP lookahead hashes / multi-module MTP: ``num_hash_lookahead_tokens=0`` and
  ``num_prefill_lookahead=0``;
* admission watermark: ``watermark=0.0``; admission gates
  (``full_sequence_must_fit``, ``reserved_blocks``) are left at their defaults;
* KV cache events, metrics and prefix-cache stats: off
  (``enable_kv_cache_events=False``, ``log_stats=False``, no metrics collector);
* KV connectors (external computed tokens), encoder inputs, DCP/PCP: unused.

vLLM is imported when the adapter is built, never when this module is imported,
so ``kvoracle.conformance`` imports without vLLM. Install it with
``scripts/install_vllm.sh``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvoracle.reference import HybridConfig, groups_config
from kvoracle.reference.kv_cache_spec import MambaSpec
from kvoracle.spec.hashing import extend_block_hashes
from kvoracle.spec.hybrid import scheduler_block_size

from ..adapter import UNKNOWN_HASH, Capabilities, EngineConfig, KeyRef, Lookup, Observation
from ..harness.expectations import version_in_range
from . import EngineLoadError
from .vllm_api import SUPPORTED_RELEASES, call, takes

INSTALL_HINT = ("install vLLM (0.14 or later; CPU torch) into a virtual environment with "
                "scripts/install_vllm.sh (VLLM_VERSION=... for another release), then run "
                "kvoracle from that environment")

_VLLM: SimpleNamespace | None = None


def installed_vllm(engine: str) -> str:
    """Import vllm and return its version, or refuse with an :class:`EngineLoadError` naming
    ``engine`` (the adapter being built) when it is missing or older than the adapters know."""
    try:
        import vllm
    except ImportError as error:
        raise EngineLoadError(f"engine {engine}: cannot import vllm ({error}); {INSTALL_HINT}") from error
    version = str(getattr(vllm, "__version__", "unknown"))
    if not version_in_range(version, SUPPORTED_RELEASES):
        raise EngineLoadError(
            f"engine {engine}: installed vllm is {version}; the adapters drive the v1 KV-cache "
            f"manager of vLLM {SUPPORTED_RELEASES.lstrip('>=')} and later; {INSTALL_HINT}")
    return version


def _load_vllm() -> SimpleNamespace:
    """Import the parts of vLLM the adapter needs, once; refuse unsupported versions."""
    global _VLLM
    if _VLLM is not None:
        return _VLLM
    version = installed_vllm("'vllm'")
    try:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request, RequestStatus
    except ImportError as error:
        raise EngineLoadError(f"engine 'vllm': vllm {version} is incomplete ({error}); "
                              f"{INSTALL_HINT}") from error
    # reset_prefix_cache logs every refusal and success; kvoracle resets the cache often.
    logging.getLogger("vllm.v1.core.block_pool").setLevel(logging.ERROR)
    _VLLM = SimpleNamespace(
        version=version, torch=torch, SamplingParams=SamplingParams, sha256=sha256,
        utils=kv_cache_utils, KVCacheManager=KVCacheManager, KVCacheCoordinator=KVCacheCoordinator,
        SingleTypeKVCacheManager=SingleTypeKVCacheManager, BlockPool=BlockPool,
        FullAttentionSpec=FullAttentionSpec, KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec, Request=Request, RequestStatus=RequestStatus)
    return _VLLM


class VllmEngine:
    """Adapter over ``vllm.v1.core.kv_cache_manager.KVCacheManager`` (vLLM 0.33.x).

    ``self.manager`` is the vLLM manager, ``self.requests`` the live vLLM
    ``Request`` objects (waiting, running or preempted; finished ones are dropped).
    """

    name = "vllm"

    def __init__(self) -> None:
        self.vllm = _load_vllm()
        self.config: EngineConfig | None = None
        self.manager: Any = None
        self.requests: dict[str, Any] = {}
        self.last_hit: dict[str, Any] = {}
        #: Engine block hash -> kvoracle hash of the same prefix (KeyRef translation).
        self.translation: dict[bytes, bytes] = {}
        #: Request id -> kvoracle hashes of its full blocks (kept in step with the engine's).
        self.kv_hashes: dict[str, tuple[bytes, ...]] = {}
        #: kvoracle hash -> its position in a request's hash chain (prefix length / h - 1).
        self.hash_index: dict[bytes, int] = {}
        self._hasher: Any = None

    def version(self) -> str:
        return self.vllm.version

    def capabilities(self) -> Capabilities:
        # Everything exact. Releases whose coordinator still counts common-prefix blocks have
        # cascade attention (KV-LIFE-011); later ones answer zero for every group (KV-LIFE-010).
        v = self.vllm
        cascade = hasattr(v.KVCacheCoordinator, "get_num_common_prefix_blocks")
        return Capabilities(common_prefix="cascade" if cascade else "zero", free_order=free_order(v),
                            mamba_free_lag=mamba_free_lag(), kv_cache_groups=True,
                            hash_block_views=True,
                            skipped_tokens=hasattr(v.SingleTypeKVCacheManager, "get_num_skipped_tokens"),
                            mamba_align=mamba_align(),
                            mamba_partial_hits=mamba_align() and hasattr(v.KVCacheManager,
                                                                          "take_kv_cache_block_copies"))

    # -- configuration -------------------------------------------------------------------
    def configure(self, config: EngineConfig | HybridConfig) -> None:
        """A fresh vLLM manager with one vLLM KV-cache group per kvoracle group: a
        :class:`ManagerConfig` is one full-attention group, a :class:`HybridConfig` any mix."""
        from .vllm_hybrid import _layer_name, _load, vllm_spec  # it builds on this module

        v = _load()  # this module's vLLM parts plus the hybrid spec classes
        groups_of = groups_config(config)
        # The seed of the hash chain; with SHA-256 vLLM derives it from a fixed default
        # seed (or PYTHONHASHSEED), so it is the same on every call.
        v.utils.init_none_hash(v.sha256)
        groups = [v.KVCacheGroupSpec([_layer_name(g)], vllm_spec(v, kv_spec, groups_of.enable_caching))
                  for g, kv_spec in enumerate(groups_of.kv_cache_specs)]
        self.manager = new_manager(v, groups, groups_of.num_blocks,
                                   max_model_len=groups_of.max_model_len,
                                   scheduler_block_size=groups_of.scheduler_block_size,
                                   hash_block_size=groups_of.hash_block_size,
                                   enable_caching=groups_of.enable_caching,
                                   use_eagle=groups_of.use_eagle)
        self._hasher = v.utils.get_request_block_hasher(groups_of.hash_block_size, v.sha256)
        self.config = config
        self.requests = {}
        self.last_hit = {}
        self.translation = {}
        self.kv_hashes = {}
        self.hash_index = {}

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Sequence[int],
                    cache_salt: str | None = None) -> None:
        assert self.config is not None
        v = self.vllm
        request = new_request(v, request_id, prompt, self.config.max_model_len, self._hasher,
                              cache_salt=cache_salt)
        self.requests[request_id] = request
        self.kv_hashes[request_id] = ()
        self._translate(request_id)

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        self.requests[request_id].append_output_token_ids(list(tokens))
        self._translate(request_id)

    def _translate(self, request_id: str) -> None:
        """Pair the engine's new block hashes with kvoracle's hashes of the same prefixes."""
        assert self.config is not None
        request = self.requests[request_id]
        known = self.kv_hashes[request_id]
        ours = extend_block_hashes(known, tuple(request.all_token_ids),
                                   self.config.hash_block_size, request.cache_salt)
        self.kv_hashes[request_id] = ours
        for engine_hash, kv_hash in zip(request.block_hashes[len(known):], ours[len(known):]):
            self.translation.setdefault(bytes(engine_hash), kv_hash)
        for index, kv_hash in enumerate(ours[len(known):], start=len(known)):
            self.hash_index.setdefault(kv_hash, index)

    # -- scheduling ----------------------------------------------------------------------
    def lookup(self, request_id: str, max_cache_hit_length: int | None = None) -> Lookup:
        blocks, num_tokens, _shared_prefix_boundary = computed_blocks(
            self.manager, self.requests[request_id], max_cache_hit_length)
        self.last_hit[request_id] = blocks
        return Lookup(_ids(blocks.get_block_ids()), num_tokens)

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                 num_encoder_tokens: int = 0) -> tuple[tuple[int, ...], ...] | None:
        request = self.requests[request_id]
        hit = self.last_hit.pop(request_id, None)
        # The scheduler hands a waiting request its lookup result; a zero hit is the
        # manager's empty blocks, which allocate_slots treats exactly like None.
        result = self.manager.allocate_slots(
            request, num_new_tokens, num_new_computed_tokens,
            hit if num_new_computed_tokens else None,
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

    # -- maintenance and queries ---------------------------------------------------------
    def evict(self, block_ids: Sequence[int]) -> None:
        self.manager.evict_blocks(set(block_ids))

    def reset_prefix_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        return tuple(self.manager.get_num_common_prefix_blocks(request_id))

    def new_step(self) -> None:
        """``new_step_starts``: the scheduler's call at the start of each step (KV-MAMBA-009)."""
        self.manager.new_step_starts()

    def take_copies(self) -> tuple[tuple[int, int], ...]:
        """``take_kv_cache_block_copies``, and what the scheduler does with the pages it hands back
        (``Scheduler._free_cow_retained_blocks`` without deferred frees): frees them at once."""
        copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:
            self.manager.block_pool.free_blocks(retained)
        return tuple((int(c.src_block_id), int(c.dst_block_id)) for c in copies)

    def pending_copies(self) -> tuple[tuple[int, int], ...]:
        """The copies the allocations queued and the scheduler has not taken yet, without taking
        them (each single-type manager's ``_pending_cow_copies``, in the order
        ``take_kv_cache_block_copies`` drains them): what a paged store's runner copies before the
        step's forward (KV-MAMBA-026). Not an operation of the protocol."""
        return tuple((int(source.block_id), int(copy.block_id))
                     for manager in self.manager.coordinator.single_type_managers
                     for source, copy in getattr(manager, "_pending_cow_copies", ()))

    def skipped_tokens(self, num_computed_tokens: int) -> tuple[int, ...]:
        """``get_num_skipped_tokens`` of each group's single-type manager, in group order."""
        return tuple(int(m.get_num_skipped_tokens(num_computed_tokens))
                     for m in self.manager.coordinator.single_type_managers)

    # -- observation ---------------------------------------------------------------------
    def observe(self) -> Observation:
        manager = self.manager
        pool = manager.block_pool
        coordinator = manager.coordinator
        # req_to_blocks is a defaultdict: a sliding-window group lists a request it only looked
        # at, with an empty table. Requests holding no entry in any group are not reported.
        tracked = {rid for m in coordinator.single_type_managers for rid in m.req_to_blocks}
        tables = {rid: _ids(coordinator.get_blocks(rid)) for rid in tracked}
        return Observation(
            num_free_blocks=pool.get_num_free_blocks(),
            usage=manager.usage,
            block_tables={rid: groups for rid, groups in tables.items() if any(groups)},
            free_queue=tuple(block.block_id
                             for block in pool.free_block_queue.get_all_free_blocks()),
            ref_counts=tuple(block.ref_cnt for block in pool.blocks),
            cached=self._cache_map(pool),
            request_hashes={rid: tuple(r.block_hashes) for rid, r in self.requests.items()},
        )

    def _cache_map(self, pool: Any) -> dict[KeyRef, tuple[int, ...]]:
        """The pool's hash -> blocks map in kvoracle's keys, blocks in caching order.

        Whole-block entries, and a Mamba group's every entry: elsewhere a key whose prefix ends
        inside one of its group's blocks is a partial tail entry (KV-HLC-006), which kvoracle
        does not specify (their effect on the free queue is specified and compared); a Mamba
        group's entry inside a block is a partial-hit state (KV-MAMBA-021), which it does. With
        one group, hashed at its block size, there are none.
        """
        assert self.config is not None
        groups = groups_config(self.config)
        utils = self.vllm.utils
        sizes = [s.block_size for s in groups.kv_cache_specs]
        mamba_groups = {g for g, s in enumerate(groups.kv_cache_specs) if isinstance(s, MambaSpec)}
        h = groups.hash_block_size
        cached: dict[KeyRef, tuple[int, ...]] = {}
        # BlockHashToBlockMap keeps one block, or a dict of blocks in insertion order.
        for key, blocks in pool.cached_block_hash_to_block._cache.items():
            engine_hash = bytes(utils.get_block_hash(key))
            kv_hash = self.translation.get(engine_hash, UNKNOWN_HASH + engine_hash)
            group = utils.get_group_id(key)
            if kv_hash in self.hash_index and (self.hash_index[kv_hash] + 1) * h % sizes[group] \
                    and group not in mamba_groups:
                continue  # a partial tail entry
            ids = (blocks.block_id,) if isinstance(blocks, utils.KVCacheBlock) \
                else tuple(blocks)
            cached[(kv_hash, group)] = ids
        return cached


def new_manager(v: SimpleNamespace, groups: list[Any], num_blocks: int, *,
                scheduler_block_size: int, **kwargs: Any) -> Any:
    """A vLLM ``KVCacheManager`` over ``groups`` (vLLM ``KVCacheGroupSpec``) in any release.

    The features kvoracle does not specify are off; releases without their switch have them
    off built in. Releases without ``scheduler_block_size`` align hits to the LCM of the
    groups' block sizes, which is kvoracle's scheduler block size too (KV-HYB-001).
    """
    config = call(v.version, v.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=[],
                  kv_cache_groups=groups, prefix_cache_retention_interval=None,
                  built_in={"prefix_cache_retention_interval": None})
    lcm = scheduler_block_size_of(groups)
    return call(v.version, v.KVCacheManager, config, scheduler_block_size=scheduler_block_size,
                num_hash_lookahead_tokens=0, num_prefill_lookahead=0, log_stats=False,
                enable_kv_cache_events=False, watermark=0.0, **kwargs,
                built_in={"scheduler_block_size": lcm, "num_hash_lookahead_tokens": 0,
                          "num_prefill_lookahead": 0, "watermark": 0.0})


def free_order(v: SimpleNamespace) -> str:
    """How the release's ``BlockPool.free_blocks`` returns blocks to the free queue.

    vLLM 0.24 began reusing unhashed blocks first (KV-POOL-006); the releases before append
    every freed block (KV-POOL-016). 0.23 has the queue's ``prepend_n`` already, but its
    ``free_blocks`` appends unless a caller passes ``prepend=True``, which freeing a request
    does not.
    """
    queue_prepends = hasattr(v.utils.FreeKVCacheBlockQueue, "prepend_n")
    caller_decides = takes(v.BlockPool.free_blocks, "prepend")
    return "unhashed_first" if queue_prepends and not caller_decides else "append"


def mamba_free_lag() -> bool:
    """Whether the release's Mamba manager frees skipped blocks num_speculative_blocks tokens
    late (KV-HLC-009): vLLM 0.17 to 0.25 subtract them in ``MambaManager.remove_skipped_blocks``
    (its comment: assume every draft is rejected); 0.26 frees at the processed tokens. Read in
    the method's own code, which is where the release says it."""
    from vllm.v1.core import single_type_kv_cache_manager as managers

    method = getattr(getattr(managers, "MambaManager", None), "remove_skipped_blocks", None)
    if method is None or method is managers.SingleTypeKVCacheManager.remove_skipped_blocks:
        return False
    try:
        code = inspect.getsource(method)
    except (OSError, TypeError):  # no source installed: the release's default, kvoracle's rule
        return False
    return "- self.num_speculative_blocks" in code


def mamba_align() -> bool:
    """Whether the release runs chapter 8's align mode: prefill checkpoints with an export
    alignment (``MambaSpec.prefill_checkpoint_alignment``) and the scheduler's
    ``new_step_starts``, which vLLM 0.32 brought together. Earlier releases have an align mode
    without them (0.15 to 0.31, checkpoint blocks from 0.29): kvoracle does not specify those,
    so their align-mode rules are not applicable rather than judged against 0.33's."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import MambaSpec

    return takes(MambaSpec, "prefill_checkpoint_alignment") and hasattr(KVCacheManager, "new_step_starts")


def scheduler_block_size_of(groups: Sequence[Any]) -> int:
    """The LCM of the block sizes of vLLM's KV-cache groups."""
    return scheduler_block_size(tuple(int(g.kv_cache_spec.block_size) for g in groups))


def new_request(v: SimpleNamespace, request_id: str, prompt: Sequence[int], max_tokens: int,
                block_hasher: Any, cache_salt: str | None = None) -> Any:
    """A vLLM ``Request`` for ``prompt``, hashed by ``block_hasher``, in any release."""
    return call(v.version, v.Request, request_id, list(prompt),
                sampling_params=v.SamplingParams(max_tokens=max_tokens), pooling_params=None,
                cache_salt=cache_salt, block_hasher=block_hasher)


def computed_blocks(manager: Any, request: Any, max_cache_hit_length: int | None
                    ) -> tuple[Any, int, int | None]:
    """``get_computed_blocks`` of any release: (blocks, hit tokens, shared-prefix boundary).

    The boundary is ``None`` in releases whose manager does not report it (before 0.26).
    A release whose ``get_computed_blocks`` takes no bound caps the hit at the prompt
    length less one itself; a smaller bound is then asked of the coordinator, as that
    ``get_computed_blocks`` would (same checks, same blocks object).
    """
    if max_cache_hit_length is None:
        result = manager.get_computed_blocks(request)
    elif takes(manager.get_computed_blocks, "max_cache_hit_length"):
        result = manager.get_computed_blocks(request, max_cache_hit_length)
    elif not manager.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
        result = (manager.empty_kv_cache_blocks, 0)
    else:
        blocks, num_tokens, *uncached = manager.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length)
        # The boundary the manager derives from the coordinator's uncached tokens, if any.
        boundary = [num_tokens + uncached[0] if uncached[0] else 0] if uncached else []
        result = (manager.create_kv_cache_blocks(blocks), num_tokens, *boundary)
    blocks, num_tokens, *rest = result
    return blocks, int(num_tokens), (int(rest[0]) if rest else None)


def _ids(groups: Sequence[Sequence[Any]]) -> tuple[tuple[int, ...], ...]:
    """Block ids per group, from ids or from blocks."""
    return tuple(tuple(b if isinstance(b, int) else b.block_id for b in group)
                 for group in groups)
