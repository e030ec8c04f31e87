"""SGLang's ``UnifiedRadixCache`` with its FULL and MAMBA components (a hybrid model's attention and
recurrent layers) behind the prefix-tree suite's protocol, state component included.

:class:`SGLangUnifiedMamba` builds, per configuration, SGLang 0.5.23's ``UnifiedRadixCache`` with
``tree_components=(FULL, MAMBA)`` over its real token allocator (as ``sglang-unified`` does) and a
real ``HybridReqToTokenPool`` whose Mamba pool has ``TreeSetup.states`` state slots, on the CPU.
The pool's tensors are one layer of the smallest Mamba2 state SGLang builds (float32, a few
hundred bytes per slot); nothing writes to them. SGLang's Mamba component asks for page size 1
unless the pool has its extra (ping-pong) buffer, which changes what the scheduler donates, never
what the tree does with a donated state: the adapter turns the extra buffer on for page sizes above 1.
The component reads SGLang's global server arguments (the Mamba chunk size, the per-path state
cap): the adapter sets them as SGLang's own unit-test kit does (``ServerArgs(model_path="dummy")``),
with a chunk size of one page.

The protocol's slots are the full-attention pool's; a page's ``PageView.state`` is whether the
radix node it ends holds a MAMBA value (SGLang keeps one state per node, at its end). The adapter calls:

- ``insert``: as the unified cache's scheduler checkpoints a running request
  (``MambaComponent.prepare_for_caching_req`` without the extra buffer): a state slot from
  ``MambaComponent._alloc_mamba_slot`` goes in ``InsertParams.mamba_value``, and
  ``cleanup_after_caching_req`` frees it again when the insertion answers ``mamba_exist`` (the node
  kept its own). The driver leaves a state slot free before each insertion, so the allocation never
  evicts; requests hold no state slot between steps (a running request's own state and its copy of
  the hit's state, ``cow_mamba``, are not modelled);
- ``evict_states(n)``: ``evict(EvictParams(mamba_num=n))``, answering ``mamba_num_evicted``;
- ``observe``: the tree as ``sglang-unified`` reads it, with each node's MAMBA value (its state slot,
  ``PageView.state_slot``); the Mamba allocator's ``available_size`` as the free state slots;
  ``mamba_evictable_size`` and ``mamba_protected_size`` as the cache's account.

For a paged KV store around it (KV-DATA-007, ``paged-sglang-unified-mamba``), the adapter names the
state slots SGLang hands over: ``match`` asks for the copy-on-write of the hit's state, as the
scheduler does for a hybrid model (``MatchPrefixParams.cow_mamba``), for a request that holds a state
slot already, so that ``finalize_match_result_in_cache`` allocates nothing and only names the slot to
copy from (``req.kv.mamba_cow_src_index``, :meth:`state_slot`); ``insert`` hands the slot
``_alloc_mamba_slot`` gave to :attr:`state_writer` before the cache takes it, where SGLang's
``prepare_for_caching_req`` copies the request's state into it.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from ..prefix_tree_protocol import TreeSetup, TreeView
from .sglang_unified import SGLangUnifiedRadixCache, SGLangUnifiedRustCore


class SGLangUnifiedMamba(SGLangUnifiedRadixCache):
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + MAMBA, Python tree core), its token allocator and
    its Mamba state pool."""

    name = "sglang-unified-mamba"
    #: It takes a state component (``TreeSetup.states`` > 0 always: the Mamba pool needs a slot).
    state_component = True

    def __init__(self) -> None:
        super().__init__()
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
        from sglang.srt.environ import envs
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        self.mamba = ComponentType.MAMBA
        self.pool_class: type = HybridReqToTokenPool
        self.server_args: tuple[type, Any] = (ServerArgs, set_global_server_args_for_scheduler)
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("float32"):
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1, num_heads=1,
                                            head_dim=2, state_size=1, conv_kernel=2)
            self.mamba_params = Mamba2CacheParams(shape=shape, layers=[0])
        self.pool: Any = None
        self.states = 0
        #: The store's runner (KV-DATA-007): called with the state slot an insertion gives the cache.
        self.state_writer: Any = None
        #: handle -> the state slot its last match's copy-on-write reads (``None``: no state to copy).
        self.resume_slots: dict[int, int | None] = {}

    # -- building ----------------------------------------------------------------------------------
    def configure(self, setup: TreeSetup) -> None:
        if setup.states < 1:
            raise ValueError(f"states: SGLang's Mamba component needs at least one state slot, got {setup.states}")
        self.states = setup.states
        server_args, install = self.server_args
        args = server_args(model_path="dummy", page_size=setup.page_size)
        args._mamba_cache_chunk_size = setup.page_size
        install(args)
        self.pool = self.pool_class(size=1, mamba_size=setup.states, mamba_spec_state_size=1,
                                    max_context_len=64 * setup.page_size, device="cpu",
                                    enable_memory_saver=False, cache_params=self.mamba_params, mamba_layer_ids=[0],
                                    enable_mamba_extra_buffer=setup.page_size > 1, speculative_num_draft_tokens=0)
        super().configure(setup)
        self.resume_slots = {}

    def cache_params(self, allocator: Any, page_size: int) -> Any:
        return self.api.CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                        token_to_kv_pool_allocator=allocator, page_size=page_size,
                                        eviction_policy=self.eviction_policy, tree_components=(self.full, self.mamba),
                                        enable_mamba_extra_buffer=page_size > 1,
                                        tree_core_backend=self.tree_core_backend)

    @property
    def component(self) -> Any:
        """The cache's MAMBA component."""
        return self.cache.components[self.mamba]

    # -- the protocol ------------------------------------------------------------------------------
    def match_params(self, handle: int, namespace: int, tokens: Sequence[int]) -> Any:
        params = super().match_params(handle, namespace, tokens)
        # A request that already holds a state slot of its own (``holds_mamba``): the copy-on-write
        # then only names the hit's slot, and the state slots the suite counts stay the cache's.
        self.cow_request = types.SimpleNamespace(session=None, kv=types.SimpleNamespace(holds_mamba=True))
        params.cow_mamba, params.req = True, self.cow_request
        return params

    def match(self, handle: int, namespace: int, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        answer = super().match(handle, namespace, tokens)
        source = getattr(self.cow_request.kv, "mamba_cow_src_index", None)
        self.resume_slots[handle] = None if source is None else int(source.view(-1)[0])
        return answer

    def state_slot(self, handle: int) -> int | None:
        """The state slot the last match under ``handle`` copies its request's state from."""
        return self.resume_slots.get(handle)

    def insert_params(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> Any:
        params = super().insert_params(handle, namespace, tokens, slots)
        params.mamba_value = self.component._alloc_mamba_slot()
        if self.state_writer is not None:
            self.state_writer(int(params.mamba_value.view(-1)[0]))
        self.state_params = params
        return params

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        held = super().insert(handle, namespace, tokens, slots)
        request = types.SimpleNamespace(kv=types.SimpleNamespace())
        self.component.cleanup_after_caching_req(request, is_finished=False, insert_result=self.insert_result,
                                                 insert_params=self.state_params)
        return held

    def evict_states(self, num_states: int) -> int:
        return int(self.cache.evict(self.api.EvictParams(mamba_num=num_states)).mamba_num_evicted)

    def node_state(self, node: Any) -> bool:
        return node.component(self.mamba).value is not None

    def node_state_slot(self, node: Any) -> int | None:
        value = node.component(self.mamba).value
        return None if value is None else int(value.view(-1)[0])

    def state_slot_of_node(self, node_id: int) -> int | None:
        value = self.cache.tree_core.get_component_device_value(node_id, self.mamba)
        return None if value is None else int(value.view(-1)[0])

    def observe(self) -> TreeView:
        return TreeView(self.pages(), int(self.cache.evictable_size()), int(self.cache.protected_size()),
                        int(self.allocator.available_size()),
                        state_free=int(self.pool.mamba_allocator.available_size()),
                        state_evictable=int(self.cache.mamba_evictable_size()),
                        state_protected=int(self.cache.mamba_protected_size()))


class SGLangUnifiedMambaRust(SGLangUnifiedMamba, SGLangUnifiedRustCore):
    """The same cache over SGLang's bundled Rust tree core, which runs the MAMBA component on the CPU
    too; the tree is read as ``sglang-unified-rust`` reads it, with ``pretty_print``'s
    ``Mamba=<yes|no>`` as whether a node holds a state."""

    name = "sglang-unified-mamba-rust"
    tree_core_backend = "rust"
