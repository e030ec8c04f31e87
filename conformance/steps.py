"""Steps: the closed set of things a conformance run does to an engine.

A run is a list of steps. The Hypothesis machines generate them, the manager
suite's driver applies them to the reference and to the engine under test, and a
counterexample is written back out as the same list (each step's ``repr`` is
the Python expression that rebuilds it), so a replay needs nothing else.

Each step names its *primary rule*: the rule an engine error (an exception or
a hang) during that step is reported against.
"""

from __future__ import annotations

import attrs

from kvoracle.reference import HybridConfig, ManagerConfig
from kvoracle.reference.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as lifecycle_spec

#: One KV-cache group, flat: (kind, block size, window or chunk size or a Mamba group's
#: speculative blocks, 0 if none).
GroupDesc = tuple[str, int, int]


@attrs.frozen
class Configure:
    """Build fresh engines for ``config``: one full-attention group (the unitary coordinator)."""

    config: ManagerConfig
    primary_rule = "KV-POOL-003"


@attrs.frozen
class ConfigureGroups:
    """Build fresh engines for a model of one or more KV-cache groups of any kinds (the hybrid
    coordinator, or the unitary one over a single group). Every request has
    ``num_encoder_tokens`` encoder tokens (a cross-attention group's).

    A Mamba group follows prefix caching: "none" mode with it off (KV-HLC-008), "align" mode
    with it on (chapter 8), where ``mamba_checkpoint_blocks`` and
    ``mamba_checkpoint_alignment`` (0: the backend cannot export one) are its prefill
    checkpoint settings (KV-MAMBA-006)."""

    primary_rule = "KV-HLC-001"

    groups: tuple[GroupDesc, ...]
    hash_block_size: int
    num_blocks: int
    max_model_len: int
    use_eagle: bool = False
    enable_caching: bool = True
    num_encoder_tokens: int = 0
    mamba_checkpoint_blocks: int = 0
    mamba_checkpoint_alignment: int = 0

    def config(self) -> HybridConfig:
        return HybridConfig(tuple(kv_spec_of(g, self.enable_caching, self.mamba_checkpoint_blocks,
                                             self.mamba_checkpoint_alignment) for g in self.groups),
                            self.num_blocks, self.max_model_len, self.hash_block_size, self.use_eagle,
                            self.enable_caching)

    @property
    def align_groups(self) -> tuple[int, ...]:
        """The Mamba groups in "align" mode (all of them with prefix caching on)."""
        return tuple(g for g, (kind, _, _) in enumerate(self.groups)
                     if kind == hybrid_spec.MAMBA and self.enable_caching)


def kv_spec_of(group: GroupDesc, enable_caching: bool = False, checkpoint_blocks: int = 0,
               checkpoint_alignment: int = 0) -> KVCacheSpec:
    """The reference's layer spec for one flat group description, in a model with prefix caching
    on or off (which decides a Mamba group's mode, KV-MAMBA-003)."""
    kind, size, param = group
    if kind == hybrid_spec.SLIDING_WINDOW:
        return SlidingWindowSpec(size, sliding_window=param)
    if kind == hybrid_spec.CHUNKED_LOCAL:
        return ChunkedLocalAttentionSpec(size, attention_chunk_size=param)
    if kind == lifecycle_spec.CROSS_ATTENTION:
        return CrossAttentionSpec(size)
    if kind == hybrid_spec.MAMBA:
        if enable_caching:
            return MambaSpec(size, mamba_cache_mode="align", num_speculative_blocks=param,
                             num_prefill_checkpoint_blocks=checkpoint_blocks,
                             prefill_checkpoint_alignment=checkpoint_alignment or None)
        return MambaSpec(size, mamba_cache_mode="none", num_speculative_blocks=param)
    return FullAttentionSpec(size)


@attrs.frozen
class AddRequest:
    """A new request arrives, waiting, with ``prompt`` tokens."""

    request_id: str
    prompt: tuple[int, ...]
    cache_salt: str | None = None
    primary_rule = "KV-HASH-002"


@attrs.frozen
class Schedule:
    """The scheduler gives the request ``num_new_tokens`` tokens this step.

    A waiting (or preempted) request first looks up its prefix-cache hit and
    adopts it. ``num_draft_tokens`` speculative tokens are allocated with the new
    tokens but never committed; ``num_lookahead_tokens`` get slots only. After a
    successful allocation the request's computed tokens advance by
    ``num_new_tokens``, capped at what the request has (a waiting request is
    given at most its uncomputed tokens).
    """

    request_id: str
    num_new_tokens: int
    num_draft_tokens: int = 0
    num_lookahead_tokens: int = 0
    delay_cache_blocks: bool = False
    primary_rule = "KV-LIFE-003"


@attrs.frozen
class EmptyAllocation:
    """Call allocate_slots with no new tokens and no hit: it must be rejected."""

    request_id: str
    primary_rule = "KV-LIFE-013"


@attrs.frozen
class Probe:
    """Look a request's hit up at two bounds without allocating (KV-FULL-005)."""

    request_id: str
    max_cache_hit_length: int
    primary_rule = "KV-FULL-001"


@attrs.frozen
class AppendTokens:
    """Decoding appended ``tokens`` to a request whose tokens are all computed."""

    request_id: str
    tokens: tuple[int, ...]
    primary_rule = "KV-HASH-003"


@attrs.frozen
class Free:
    """The request finished (``preempted=False``) or was preempted."""

    request_id: str
    preempted: bool = False
    primary_rule = "KV-LIFE-009"


@attrs.frozen
class Evict:
    """The connector asks to evict these blocks from the prefix cache."""

    block_ids: tuple[int, ...]
    primary_rule = "KV-POOL-013"


@attrs.frozen
class ResetPrefixCache:
    primary_rule = "KV-POOL-014"


@attrs.frozen
class Observe:
    """Only look: compare observations and check invariants."""

    primary_rule = "KV-POOL-012"


@attrs.frozen
class NewStep:
    """The scheduler starts a step (``KVCacheManager.new_step_starts``): states cached in the
    step before may be hits now (KV-MAMBA-009). Generated for align-mode Mamba groups only."""

    primary_rule = "KV-MAMBA-009"


@attrs.frozen
class TakeCopies:
    """The scheduler ends a step: it takes the copies the allocations queued
    (``KVCacheManager.take_kv_cache_block_copies``) and releases the pages that held them
    (KV-MAMBA-023 .. KV-MAMBA-025). Generated for partial-hit models only, before each
    :class:`NewStep`."""

    primary_rule = "KV-MAMBA-025"


@attrs.frozen
class CommonPrefix:
    request_id: str
    primary_rule = "KV-LIFE-010"


Step = Configure | ConfigureGroups | AddRequest | Schedule | EmptyAllocation | Probe | AppendTokens | Free | \
    Evict | ResetPrefixCache | CommonPrefix | Observe | NewStep | TakeCopies
