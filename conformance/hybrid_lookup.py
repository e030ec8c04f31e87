"""The hybrid lookup suite: an engine's hybrid cache-hit answer against the spec.

A hybrid model looks a prompt up in several KV-cache groups at once (spec
chapter ``hybrid``). This suite drives an engine behind the small
:class:`HybridLookupAdapter` protocol -- configure, seed the cache, look up --
and kvoracle's reference (:class:`kvoracle.reference.hybrid.HybridCoordinator`)
in lockstep with the same operations. Seeding allocates from the pool, so in a
small pool it evicts earlier seeds; the reference evicts the same blocks, and
the cached flags it then reads are the ones the spec's loop is given.

Per lookup the suite checks, in this order (the first failing rule names the
counterexample, so the specific rules come before the catch-all):

* the answer of each group not of full attention against its kind's hit rule. A group's
  entries are the answer of its last lookup; when no lookup of its kind -- at any bound up to the
  larger of the lookup's bound and the hashed tokens, with any drop the group may be
  given (:func:`kvoracle.spec.hybrid.group_hit_length`,
  :func:`~kvoracle.spec.hybrid.num_null_hit_blocks`) -- answers them, the group's finder
  broke its kind's rule. An answer with exactly one of these signatures names that rule:
  KV-HYB-002 (an answer of the kind over the blocks one group of a shared spec group has
  cached), and for a sliding window KV-SWA-001 (the whole answer of the loop with
  window + 1), KV-SWA-003 (a window of 1 answered with null blocks only), KV-SWA-004 (with
  EAGLE: an EAGLE answer with its dropped block still on, one real entry too many),
  KV-SWA-005 (a length off the alignment; with EAGLE, whose drop moves the run's end, an answer
  of a finder that ignores the alignment). Any other -- or one with several signatures -- is the kind's
  own rule: KV-CHUNK-001 (chunked local), KV-MAMBA-001 (Mamba), KV-SWA-002 (sliding
  window). An answer of the kind at another bound is the loop's to judge;
* KV-HYB-002: the groups of one spec group, each answering its kind, answer alike (as
  many entries, nulls in the same places);
* KV-MAMBA-002 first where the whole answer is exactly that of a loop giving a Mamba group
  the EAGLE look-ahead (vLLM #43559: the hit outgrows what full attention holds);
* KV-HYB-006: every full-attention group has exactly cdiv(hit, block_size) entries;
* KV-MAMBA-002 / KV-HYB-004: no other group's entries reach beyond the hit;
* the hit length against the spec's fixed point (:func:`kvoracle.spec.hybrid.fixed_point`).
  A wrong hit whose whole answer -- the hit and every non-full group's entries -- exactly
  one other loop gives names that loop's rule: KV-SWA-001 (a scan needing
  cdiv(window, block_size) blocks), KV-HYB-005 (one full-attention and one other spec
  group, and the loop runs past its first pass, :func:`kvoracle.spec.hybrid.single_pass`),
  KV-HYB-015 (with EAGLE, a loop dropping on every pass, vLLM #32802); then KV-HYB-004 (not
  aligned or beyond the bound), KV-HYB-007 (any other, with EAGLE) and KV-HYB-003 (any other);
* null entries where the attention type puts them: a second EAGLE drop is KV-HYB-007, any
  other KV-HYB-013 (:func:`kvoracle.spec.hybrid.num_null_hit_blocks`);
* KV-FULL-002: the non-null entries are the reference's block ids (engines that
  allocate in the reference's order, as vLLM does).

Two observations are optional, each behind a capability (an adapter that does not claim it
is reported "not applicable" on the rule, with the capability it lacks):

* ``uncached_prefix_tokens``: after a lookup that passed the checks above, the adapter's
  ``uncached_common_prefix_tokens()`` -- the coordinator's third result -- against the spec's
  (KV-HYB-008): the third result of :func:`~kvoracle.spec.hybrid.fixed_point`, or 0 for a model
  with one KV-cache group (KV-HYB-014). A wrong count that exactly one other loop gives with the
  same answer names that loop's rule, as a wrong hit does (KV-SWA-001, KV-HYB-005);
* ``per_group_lookup``: after such a lookup, in a model of two or more KV-cache groups (vLLM's
  unitary coordinator has no per-group lookup), ``lookup_per_group()`` at the same bound
  against :func:`~kvoracle.spec.hybrid.per_group_hits`. A non-full group's entries that no
  lookup of its kind gives are charged as in the hybrid lookup (the kind's rule, or a named
  signature); groups of one spec group that answer unlike each other, KV-HYB-002; any other
  wrong length, entry count or null entries, KV-HYB-011; then KV-FULL-002 on the block ids.

A kind's rule is charged only where the group's own entries show it. A finder that
answers what it would at another bound (too short a hit, say) is seen only through the
hit, and charged to the loop's rules above; so is a lookup that reads a key in one group
of a spec group only, where no group's entries show it (a loop over one member's cached
blocks is one of many that could give a wrong hit: a small hit says too little to tell).

Models with vLLM's fine-grained partial hits (KV-MAMBA-019: an align-mode Mamba group of 2 or 4
hash blocks, every other group at the hash block) are generated where the engine claims
``mamba_partial_hits``; seeding then also leaves partial entries, pages keyed at a hash boundary
inside a Mamba block (``seed_partial_entry``, KV-MAMBA-021's tail). Such a model's hits are
aligned to the hash block, and its Mamba group is looked up as the reference's lookup does it,
per hash unit (:func:`kvoracle.spec.mamba.partial_hit_length`); its entries are pages,
cdiv(L, B) of them for a hit of L tokens. On top of the checks above:

* a Mamba group's entries that no such lookup gives are KV-MAMBA-020 (not KV-MAMBA-001);
* a wrong hit, uncached count or per-group answer that is exactly that of a lookup whose Mamba
  groups read only their pages' positional keys, and not that of a lookup with partial hits off
  (aligned to the scheduler block size), is KV-MAMBA-020; one that is exactly the latter's and not
  the former's is KV-MAMBA-019. As with the other named loops, an answer both give could be either
  bug and falls to the general rule (KV-HYB-003, KV-HYB-008, KV-HYB-011), which names both. A
  hybrid hit seldom tells them apart -- with the Mamba keys inside a block ignored a hit ends on a
  Mamba block, which is the scheduler block -- so the two show apart where a group answers on its
  own: in the per-group lookup and the uncached count. For a wrong hit with both signatures the
  lookup's third result (``uncached_prefix_tokens``) is read with it, as part of its whole answer:
  a signature whose loop counts otherwise is dropped.

The spec's loop is also compared with :func:`~kvoracle.spec.hybrid.declarative_hit`:
where they differ the named divergence (KV-SWA-010, KV-HYB-009, or KV-SWA-003 for
window 1) is what the engine was checked against, and is counted as exercised.

Run it with ``kvoracle check --suite hybrid [--engine reference|vllm|module:Class]``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvoracle import __version__
from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator
from kvoracle.reference.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvoracle.spec import hybrid as spec
from kvoracle.spec import mamba as mamba_spec
from kvoracle.spec import sliding_window
from kvoracle.spec.hashing import extend_block_hashes
from kvoracle.spec.lifecycle import cdiv

from .adapter import Lookup
from .harness import picture as draw
from .harness import returns
from .harness.capabilities import Capabilities
from .harness.driver import Driver
from .harness.machine import SuiteMachine
from .harness.suites import SuiteDef, register_suite

#: Four in five blocks cached: holes that leave runs long enough to hit.
MOSTLY_TRUE = st.integers(0, 4).map(bool)
#: The null block's id in every engine's answer.
NULL_BLOCK_ID = 0
MAX_MODEL_LEN = 4096


@runtime_checkable
class HybridLookupAdapter(Protocol):
    """An engine's hybrid prefix-cache lookup, behind engine-neutral operations."""

    name: str

    def version(self) -> str: ...

    def configure(self, config: HybridConfig) -> None:
        """Build a fresh engine (an empty pool) for ``config``."""

    def seed_cache(self, prompt_tokens: Sequence[int], group_id: int, mask: Sequence[bool]) -> None:
        """Allocate blocks 0 .. last masked one of the prompt in ``group_id``, cache the
        masked ones, and free them all, table tail first (a finished request)."""

    def lookup(self, prompt_tokens: Sequence[int], max_cache_hit_length: int | None = None) -> Lookup:
        """The hit: block ids per group (null entries as block id 0) and its length.
        ``None`` bounds it by ``len(prompt_tokens) - 1``, as a new request's lookup is."""


@attrs.frozen
class PerGroupLookup:
    """Each KV-cache group's own hit: its block ids (null entries as block id 0) and length."""

    block_ids: tuple[tuple[int, ...], ...]
    num_tokens: tuple[int, ...]


@runtime_checkable
class OptionalHybridLookup(Protocol):
    """The optional operations of a hybrid lookup adapter, each offered only by an adapter
    that claims its capability (``capabilities()``)."""

    def capabilities(self) -> Capabilities: ...

    def uncached_common_prefix_tokens(self) -> int:
        """``uncached_prefix_tokens``: the third result of the coordinator's last lookup, the
        uncached common prefix tokens (KV-HYB-008)."""

    def lookup_per_group(self, prompt_tokens: Sequence[int],
                         max_cache_hit_length: int | None = None) -> PerGroupLookup:
        """``per_group_lookup``: each spec group looked up alone (KV-HYB-011), the bound as
        for :meth:`HybridLookupAdapter.lookup`. Asked only of models with several KV-cache groups."""

    def seed_partial_entry(self, prompt_tokens: Sequence[int], group_id: int, num_tokens: int) -> None:
        """``mamba_partial_hits``: take one free page in ``group_id``, a Mamba group coarser than
        the hash block in a model with partial hits on, key it at the prefix of ``num_tokens``
        tokens -- a hash boundary inside a Mamba block: a partial entry (KV-MAMBA-021) -- and
        free it (the tail a finished producer leaves, or a moved key's copy once made)."""


class ReferenceHybridLookup:
    """kvoracle's reference hybrid coordinator behind :class:`HybridLookupAdapter`."""

    name = "reference"
    coordinator_class: type[HybridCoordinator] = HybridCoordinator

    def __init__(self, free_order: str = "unhashed_first") -> None:
        self.coordinator: HybridCoordinator | None = None
        self.uncached = 0
        #: How freed blocks return to the free queue (KV-POOL-006 or KV-POOL-016): seeding
        #: frees blocks, so it decides which blocks later seeds take.
        self.free_order = free_order

    def version(self) -> str:
        return __version__

    def capabilities(self) -> Capabilities:
        # Its models are HybridConfigs of several groups, Mamba groups in align mode (caching is on),
        # coarser ones with vLLM's partial hits (KV-MAMBA-019).
        return Capabilities(uncached_prefix_tokens=True, per_group_lookup=True, free_order=self.free_order,
                            kv_cache_groups=True, mamba_align=True, mamba_partial_hits=True)

    def configure(self, config: HybridConfig) -> None:
        self.coordinator = self.coordinator_class(config)
        self.coordinator.pool.unhashed_first = self.free_order == "unhashed_first"

    def hashes(self, prompt_tokens: Sequence[int]) -> tuple[bytes, ...]:
        assert self.coordinator is not None
        return extend_block_hashes((), tuple(prompt_tokens), self.coordinator.config.hash_block_size, None)

    def seed_cache(self, prompt_tokens: Sequence[int], group_id: int, mask: Sequence[bool]) -> None:
        assert self.coordinator is not None
        self.coordinator.seed_cache(self.hashes(prompt_tokens), group_id, list(mask))

    def lookup(self, prompt_tokens: Sequence[int], max_cache_hit_length: int | None = None) -> Lookup:
        assert self.coordinator is not None
        bound = len(prompt_tokens) - 1 if max_cache_hit_length is None else max_cache_hit_length
        blocks, hit, self.uncached = self.coordinator.find_longest_cache_hit(self.hashes(prompt_tokens), bound)
        return Lookup(tuple(tuple(b.block_id for b in group) for group in blocks), hit)

    def uncached_common_prefix_tokens(self) -> int:
        return self.uncached

    def lookup_per_group(self, prompt_tokens: Sequence[int],
                         max_cache_hit_length: int | None = None) -> PerGroupLookup:
        assert self.coordinator is not None
        bound = len(prompt_tokens) - 1 if max_cache_hit_length is None else max_cache_hit_length
        blocks, hits = self.coordinator.find_longest_cache_hit_per_group(self.hashes(prompt_tokens), bound)
        return PerGroupLookup(tuple(tuple(b.block_id for b in group) for group in blocks), tuple(hits))

    def seed_partial_entry(self, prompt_tokens: Sequence[int], group_id: int, num_tokens: int) -> None:
        assert self.coordinator is not None
        self.coordinator.seed_partial_entry(self.hashes(prompt_tokens), group_id, num_tokens)


# -- steps ---------------------------------------------------------------------------------
#: One group, flat: (kind, block size, window or chunk size, 0 if none).
GroupDesc = tuple[str, int, int]


@attrs.frozen
class HybridSetup:
    """Configure both sides; the prompts later steps refer to by index."""

    primary_rule = "KV-HYB-003"

    groups: tuple[GroupDesc, ...]
    hash_block_size: int
    num_blocks: int
    use_eagle: bool
    prompts: tuple[tuple[int, ...], ...]

    def config(self) -> HybridConfig:
        return HybridConfig(tuple(_kv_spec(g) for g in self.groups), self.num_blocks, MAX_MODEL_LEN,
                            self.hash_block_size, self.use_eagle)


@attrs.frozen
class Seed:
    primary_rule = "KV-HYB-003"
    prompt: int
    group: int
    mask: tuple[bool, ...]


@attrs.frozen
class LookUp:
    primary_rule = "KV-HYB-003"
    prompt: int
    max_cache_hit_length: int | None = None


@attrs.frozen
class SeedTail:
    """A partial entry in a fine-grained Mamba group: a page keyed at the prefix of ``num_tokens``
    tokens of the prompt, inside a Mamba block (``seed_partial_entry``), then freed."""

    primary_rule = "KV-MAMBA-020"
    prompt: int
    group: int
    num_tokens: int


def _kv_spec(group: GroupDesc) -> KVCacheSpec:
    kind, size, param = group
    if kind == spec.SLIDING_WINDOW:
        return SlidingWindowSpec(size, sliding_window=param)
    if kind == spec.CHUNKED_LOCAL:
        return ChunkedLocalAttentionSpec(size, attention_chunk_size=param)
    if kind == spec.MAMBA:
        return MambaSpec(size)
    return FullAttentionSpec(size)


# -- generation ----------------------------------------------------------------------------
def _lcm(sizes: Sequence[int]) -> int:
    return math.lcm(*sizes) if sizes else 1


# The strategies are built once per shape and kept. Hypothesis validates a strategy object, and
# works out whether it can be empty or reuse its values, the first time it is drawn from; built
# anew at every draw, that work was about a third of this suite's time against vLLM (py-spy),
# shrinks included; in the setups' prompt, window and pool strategies it was still a fifth (4,756
# setups drawn alone: 25.7 s of CPU built per draw, 17.8 s kept). A kept strategy draws exactly
# what a new equal one would: the draws depend on its shape, its labels (which a lambda's code
# gives, not its identity) and the choices given. Typed, so that a ``True`` argument is not
# taken for ``1``; bounded, for long fuzzing sessions.
kept = functools.lru_cache(maxsize=4096, typed=True)

#: A prompt's tokens: a small alphabet, so that prompts drawn apart still share prefixes.
TOKENS = st.integers(0, 3)


@kept
def _token_lists(min_size: int, max_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(TOKENS, min_size=min_size, max_size=max_size)


@kept
def _prefix_lists(most_blocks: int, alignment: int) -> st.SearchStrategy[list[list[int]]]:
    """One to three shared prefixes, each of 1 .. ``most_blocks`` aligned units and a part."""
    tokens = TOKENS
    # (A flat-mapped function's code is part of the strategy's label: this one's is unchanged.)
    return st.lists(st.integers(1, most_blocks).flatmap(
        lambda k: st.lists(tokens, min_size=k * alignment, max_size=k * alignment + alignment)),
        min_size=1, max_size=3)


@kept
def _windows(block: int, alignment: int, long_fine: bool) -> st.SearchStrategy[int]:
    """A sliding window of a group of ``block`` tokens (see hybrid_setups)."""
    short = st.builds(lambda k, b=block: b * k + 1, st.integers(0, 2))
    long = st.builds(lambda k, b=block: alignment * k + b + 1, st.integers(1, 4))
    return (st.integers(1, 16) | st.builds(lambda k, b=block: b * k + 1, st.integers(0, 4))
            | (long if long_fine else short))


@kept
def _pool_sizes(large: int, most: int) -> st.SearchStrategy[int]:
    """A pool that holds every seed (``large``) three times in four, else a small one."""
    small = st.integers(2, max(3, most + 1))
    return st.sampled_from([large, large, large, 0]).flatmap(lambda n: st.just(n) if n else small)


@kept
def _sampled(*values: object) -> st.SearchStrategy:
    return st.sampled_from(list(values))


@st.composite
def hybrid_setups(draw: st.DrawFn, partial_hits: bool = False, eagle: bool | None = None,
                  window_of_one: bool = False) -> HybridSetup:
    """Valid hybrid configurations (HybridConfig's rules) and prompts that share prefixes.

    Biased towards the states where a coordinator's bugs show: hash block size 1 half the
    time, two or three groups, often every group at the hash block size (the alignment is
    then one block, so the loop can stop on any block and a Mamba group can answer one
    block past the candidate, KV-MAMBA-002), and prompts of several aligned blocks. With
    ``partial_hits`` (an engine claiming ``mamba_partial_hits``), two models in three of several
    groups that have a Mamba group and no chunked local one turn vLLM's fine-grained partial hits on
    (KV-MAMBA-019); a model that cannot turn them on draws exactly what it drew without them.
    ``eagle`` fixes EAGLE on or off instead of drawing it. With ``window_of_one`` (the lookup
    suite), one EAGLE model in four is full attention and a sliding window of 1: the loop's single
    pass then decides the hit, and a second pass would look the verified window up again without
    its drop (KV-HYB-005). Drawn among all the shapes it is about one EAGLE model in 22, which some
    seeds' examples never met. Without the flag the draws are what they were (the external-store
    suite's models).
    """
    hash_size = draw(_sampled(1, 1, 2, 4), label="hash_block_size")
    if eagle is None:
        eagle = draw(st.booleans(), label="use_eagle")
    # Sliding windows twice as often: most named loop behaviours (KV-SWA-001/003/010, KV-HYB-009)
    # need one.
    kinds = [*spec.LOOKUP_KINDS, spec.SLIDING_WINDOW] if not eagle else [
        spec.FULL, spec.SLIDING_WINDOW, spec.SLIDING_WINDOW, spec.MAMBA]
    single_pass_window = eagle and window_of_one and draw(st.integers(0, 3), label="window of one") == 0
    # EAGLE matters only when the loop takes several passes: two groups at least.
    count = 2 if single_pass_window else draw(
        _sampled(*([2, 3, 3, 3, 4] if eagle else [1, 2, 2, 3, 3, 4])), label="num_groups")
    # Every group at the hash block size a third of the time, else mostly small multiples.
    uniform = draw(st.integers(0, 2), label="uniform_block_size") == 0
    drafts = []
    for _ in range(count):
        kind = draw(_sampled(*kinds), label="kind")
        scale = 1 if uniform or kind == spec.MAMBA else draw(_sampled(1, 1, 2, 3, 4), label="scale")
        drafts.append([kind, hash_size * scale, 0])
    if eagle and not uniform and any(d[0] == spec.MAMBA for d in drafts) and draw(
            st.booleans(), label="mamba_at_alignment"):
        # With EAGLE a Mamba group is looked up at the candidate itself, the other groups one
        # block past it (KV-MAMBA-002); the block past the candidate can be a Mamba state only
        # where the alignment is the Mamba block: every group at the hash block size.
        for draft in drafts:
            draft[1] = hash_size
    if count == 2 and (single_pass_window or draw(st.integers(0, 2), label="full_and_other") > 0):
        # Full attention and one other group: the loop's single pass
        # (KV-HYB-005), in which the other group alone decides the hit -- a Mamba group
        # answering past the candidate (KV-MAMBA-002) or a window scan (KV-SWA-001).
        drafts[0][0] = spec.FULL
        drafts[1][0] = spec.SLIDING_WINDOW if single_pass_window else draw(
            _sampled(*[k for k in kinds if k != spec.FULL]), label="other kind")
        if drafts[1][0] == spec.MAMBA:
            drafts[1][1] = hash_size  # KV-MAMBA-003
        if drafts[1][0] in (spec.SLIDING_WINDOW, spec.MAMBA) and draw(st.booleans(), label="finer other"):
            # The other group finer than the alignment: after the single pass its answer is the
            # hit, so a window run or Mamba state ending off an aligned boundary shows in it
            # (KV-SWA-005, KV-MAMBA-001); later passes would hide it behind an aligned group.
            drafts[1][1] = hash_size
            drafts[0][1] = hash_size * draw(_sampled(2, 4), label="coarse full")
        if eagle and drafts[1][0] == spec.SLIDING_WINDOW and (single_pass_window or draw(st.booleans(),
                                                                                   label="window_1")):
            # With EAGLE a window of 1 is where the single pass decides the answer: a pass
            # more would look the verified window up again without its drop (KV-HYB-005).
            drafts[1][2] = 1
    if count >= 3 and draw(st.integers(0, 2), label="two_full_specs") > 0:
        # Two full-attention spec groups (different block sizes) before others that can
        # shrink the hit: only then can a coordinator forget to trim the second (KV-HYB-006).
        drafts[0][:2] = [spec.FULL, hash_size]
        drafts[1][:2] = [spec.FULL, 2 * hash_size]
        for draft in drafts[2:]:
            if draft[0] == spec.FULL:
                draft[0] = draw(_sampled(*[k for k in kinds if k != spec.FULL]), label="shrinking kind")
                draft[1] = hash_size if draft[0] == spec.MAMBA else draft[1]
    windows = [d for d in drafts if d[0] == spec.SLIDING_WINDOW]
    coarse = [d for d in drafts if d[0] in (spec.FULL, spec.SLIDING_WINDOW) and windows and d is not windows[0]]
    kept: list[list] = []
    if not eagle and windows and coarse and draw(st.integers(0, 2), label="fine_window") > 0:
        # A sliding window finer than the alignment, without EAGLE: a run may then end only on
        # an aligned boundary, and a short run is rounded down (KV-SWA-005).
        windows[0][1] = hash_size
        coarse[0][1] = max(coarse[0][1], 2 * hash_size)
        kept = [windows[0], coarse[0]]
    spare = [d for d in drafts if not any(d is k for k in kept)]
    if not eagle and spare and all(d[0] != spec.CHUNKED_LOCAL for d in drafts) and draw(
            st.integers(0, 2), label="chunked_group") == 0:
        spare[-1][0] = spec.CHUNKED_LOCAL  # its null blocks before the chunk start (KV-CHUNK-001)
    mambas = [d for d in drafts if d[0] == spec.MAMBA]
    partial_model = False
    if partial_hits and mambas and len(drafts) > 1 and all(d[0] != spec.CHUNKED_LOCAL for d in drafts) and draw(
            st.integers(0, 2), label="partial hits") > 0:
        # A Mamba block of 2 or 4 hash blocks turns partial hits on where every other group can
        # follow (KV-MAMBA-019); kvoracle specifies them with every other group at the hash block
        # (KV-MAMBA-003), which a chunked local group, at the scheduler block (KV-CHUNK-003), is not.
        partial_model = True
        for draft in drafts:
            draft[1] = hash_size
        mambas[0][1] = hash_size * draw(_sampled(2, 4), label="Mamba block in hash blocks")
        for draft in mambas[1:]:
            draft[1] = hash_size * draw(_sampled(1, 2, 4), label="Mamba block in hash blocks")
    # Chunked local attention must use the scheduler block size (KV-CHUNK-003).
    others = [size for kind, size, _ in drafts if kind != spec.CHUNKED_LOCAL]
    alignment = _lcm([hash_size, *others]) if others else hash_size * draw(_sampled(1, 2))
    for draft in drafts:
        if draft[0] == spec.CHUNKED_LOCAL:
            draft[1] = alignment
            draft[2] = alignment * draw(st.integers(1, 3), label="chunk_blocks")
        elif draft[0] == spec.SLIDING_WINDOW and not draft[2]:
            # Windows 1..16, often one past a multiple of the block size, where
            # cdiv(window, b) != cdiv(window - 1, b) (KV-SWA-001).
            # Small windows as often: a run of a few blocks is what a mostly cached group has.
            # But with EAGLE, a window finer than the alignment is as often longer than an aligned
            # unit and a block: a cached run from the first block too short for the window then
            # hits, rounded to the alignment, and after the EAGLE drop rounded again (KV-SWA-010);
            # a shorter window always finds a run long enough, which ends where no rounding shows.
            # (Not with partial hits on: the hit alignment is then the hash block, every window's.)
            long_fine = eagle and draft[1] < alignment and not partial_model
            draft[2] = draw(_windows(draft[1], alignment, long_fine), label="window")
    groups = tuple(tuple(d) for d in drafts)
    if draw(st.integers(0, 3), label="duplicate_group") == 0:  # equal specs share a spec group (KV-HYB-002)
        groups = (*groups, draw(st.sampled_from(groups)))
    # Prompts: a few prefixes, each extended by random suffixes, so prefixes collide. Hits
    # are multiples of the alignment: prefixes span several aligned blocks, and at least
    # a dozen tokens where the alignment is small.
    prefixes = draw(_prefix_lists(max(4, 12 // alignment), alignment))
    prompts = []
    for _ in range(draw(st.integers(1, 4), label="num_prompts")):
        prefix = draw(st.sampled_from(prefixes))
        suffix = draw(_token_lists(1, 2 * alignment))
        prompts.append(tuple(prefix + suffix))
    most = max(len(p) for p in prompts) // hash_size
    # A pool that holds every seed, or a small one in which seeding evicts earlier seeds.
    large = max(2, 1 + most * len(groups) * len(prompts) * 2)
    num_blocks = draw(_pool_sizes(large, most), label="num_blocks")
    return HybridSetup(groups, hash_size, num_blocks, eagle, tuple(prompts))


@kept
def _masks(length: int) -> st.SearchStrategy[tuple[bool, ...]]:
    dense = st.integers(0, length).map(lambda k: (True,) * k)
    sparse = st.lists(st.booleans(), min_size=0, max_size=length).map(tuple)
    holes = st.tuples(st.integers(0, length), st.sets(st.integers(0, max(length - 1, 0)), max_size=2)).map(
        lambda kh: tuple(i not in kh[1] for i in range(kh[0])))
    mostly = st.lists(MOSTLY_TRUE, min_size=length, max_size=length).map(tuple)
    return dense | sparse | holes | mostly


@kept
def _short_run_after_hole(length: int, need: int) -> st.SearchStrategy[tuple[bool, ...]]:
    """Masks for a window needing ``need`` contiguous blocks: cached up to a block ``end``, but
    for one hole that leaves a run of 1 .. need - 1 blocks after it and enough before it, so that
    a scan right to left meets a run too short to hit, then the hole (which must end the run,
    KV-SWA-002), then a run long enough. Nothing where no such mask fits (a need below 2)."""
    if need < 2 or length < need + 1:
        return st.nothing()
    return st.tuples(st.integers(need + 1, length), st.integers(1, need - 1)).map(
        lambda end_short: tuple(j != end_short[0] - end_short[1] - 1 for j in range(end_short[0])))


@kept
def _segment_end_holes(length: int, per_segment: int) -> st.SearchStrategy[tuple[bool, ...]]:
    """Masks of ``length`` blocks, every block cached but the last of up to two of the aligned
    segments of ``per_segment`` blocks."""
    segments = st.sets(st.integers(0, max(length // per_segment - 1, 0)), min_size=1, max_size=2)
    return segments.map(lambda ends: tuple((j + 1) % per_segment != 0 or (j + 1) // per_segment - 1 not in ends
                                           for j in range(length)))


@kept
def _hash_masks(hash_blocks: int) -> st.SearchStrategy[tuple[bool, ...]]:
    """One mask over a prompt's hash blocks for every group: mostly a cached prefix."""
    dense = st.integers(0, hash_blocks).map(lambda k: (True,) * k)
    return dense | dense | _masks(hash_blocks)


@kept
def _group_masks(length: int, per_segment: int | None, need: int | None) -> st.SearchStrategy[tuple[bool, ...]]:
    """A group's own mask of ``length`` blocks: four in five blocks cached, now and then all.
    ``per_segment``: the blocks of an aligned segment, for a group finer than the alignment;
    ``need``: the contiguous blocks a sliding-window group's hit needs."""
    holes = st.lists(MOSTLY_TRUE, min_size=length, max_size=length).map(tuple)
    whole = st.just((True,) * length)  # a group wholly cached: the others then decide the hit
    masks = holes | holes | whole
    if per_segment is not None:
        # The last block of an aligned segment missing: a window's run or a Mamba state may
        # not end just before it, only at an aligned boundary (KV-SWA-005, KV-MAMBA-001).
        masks |= _segment_end_holes(length, per_segment)
    if need is not None:
        # Random holes leave a run too short to hit after a hole and a long one before it only
        # now and then, and only where the groups looked up before the window hit past the
        # hole: shaped on purpose, half as often as those.
        masks |= _short_run_after_hole(length, need)
    return masks


@kept
def _bounds(tokens: int, alignment: int) -> st.SearchStrategy[int | None]:
    """A lookup's bound: mostly none; or any, a few aligned blocks, or an aligned boundary."""
    near = min(tokens, 3 * alignment)
    aligned = st.integers(0, tokens // alignment).map(lambda k: k * alignment)
    return st.none() | st.none() | st.none() | st.integers(0, tokens) | st.integers(0, near) | aligned


@kept
def _setups(partial_hits: bool, eagle: bool) -> st.SearchStrategy[HybridSetup]:
    """The lookup suite's models: with partial hits or not, EAGLE on or off, windows of one."""
    return hybrid_setups(partial_hits, eagle=eagle, window_of_one=True)


# -- judging -------------------------------------------------------------------------------
class HybridDriver(Driver):
    """Applies steps to the engine and the reference, and judges each lookup."""

    suite_name = "hybrid"
    fault_rule = "KV-HYB-003"

    def prepare(self) -> None:
        self.model = ReferenceHybridLookup(free_order=self.verdicts.capabilities.free_order)
        self.setup: HybridSetup | None = None
        #: Divergences of the spec's loop from the declarative hit seen (rule id -> count).
        self.divergences: dict[str, int] = {}
        #: What the last lookups answered, for the picture: name -> (step number, what was asked,
        #: the reference's answer, the engine's).
        self.answers: dict[str, tuple] = {}
        #: The engine's third result of the step's lookup, once read (:meth:`_lookup_uncached`).
        self.uncached_got: int | None = None

    def _HybridSetup(self, step: HybridSetup) -> None:
        self.setup = step
        config = step.config()
        self.model.configure(config)
        self.new_engine()
        # An engine refusing a model whose groups share specs fails to merge them (KV-HYB-002).
        self.call("configure", config, rule="KV-HYB-002" if config.shares_specs else None)

    def _Seed(self, step: Seed) -> None:
        assert self.setup is not None and self.engine is not None
        prompt = self.setup.prompts[step.prompt]
        self.model.seed_cache(prompt, step.group, step.mask)
        self.call("seed_cache", prompt, step.group, step.mask)

    def _SeedTail(self, step: SeedTail) -> None:
        assert self.setup is not None and self.engine is not None
        prompt = self.setup.prompts[step.prompt]
        self.model.seed_partial_entry(prompt, step.group, step.num_tokens)
        self.call("seed_partial_entry", prompt, step.group, step.num_tokens)

    def _LookUp(self, step: LookUp) -> None:
        assert self.setup is not None and self.engine is not None
        prompt = self.setup.prompts[step.prompt]
        # An EAGLE sliding window finer than the alignment is KV-SWA-010's case: an engine that
        # fails looking it up fails there.
        swa_fine_eagle = self.setup.use_eagle and any(
            kind == spec.SLIDING_WINDOW and size != self.model.coordinator.config.hit_alignment
            for kind, size, _ in self.setup.groups)
        got = self.call("lookup", prompt, step.max_cache_hit_length,
                        rule="KV-SWA-010" if swa_fine_eagle else None)
        want = self.model.lookup(prompt, step.max_cache_hit_length)
        self.answers["lookup"] = (len(self.steps), step, want, got)
        self.uncached_got = None
        spec_in = self._judge(prompt, step, got, want)
        # The optional observations, once the lookup itself passed (KV-HYB-011, KV-HYB-008). The
        # per-group lookups first: they show each group's finder directly, so a finder's own
        # error is charged to its kind's rule there, not to the uncached count it skews (the
        # longest candidate of a loop whose final hit still came out right).
        if self.verdicts.applicable("KV-HYB-011") and len(self.setup.groups) > 1:
            self._judge_per_group(prompt, step, spec_in)
        if self.verdicts.applicable("KV-HYB-008"):
            self._judge_uncached(spec_in, got)

    def _lookup_uncached(self) -> int:
        """``uncached_prefix_tokens``: the engine's uncached common prefix tokens of this step's
        lookup, asked once."""
        if self.uncached_got is None:
            self.uncached_got = self.call("uncached_common_prefix_tokens", rule="KV-HYB-008")
        return self.uncached_got

    def picture(self) -> list[dict] | None:
        """The hit blocks per KV-cache group (null entries as block id 0) and the hit length of
        the last lookup, and of the per-group lookups and the uncached prefix count when the
        failing step asked them: the reference's answers and the engine's."""
        if self.setup is None:
            return None
        groups = [draw.group_label(g, *group) for g, group in enumerate(self.setup.groups)]
        note = f"block id {NULL_BLOCK_ID} is the null block (an entry the hit skips)"
        panels = []
        for name, title in (("lookup", "hit blocks of the lookup"), ("per group", "each group's own lookup")):
            if name not in self.answers or (name == "per group" and self.answers[name][0] != len(self.steps)):
                continue
            number, step, want, got = self.answers[name]
            rows = draw.rows_by_position(groups, want.block_ids, got.block_ids)
            tokens = (list(want.num_tokens), list(got.num_tokens)) if name == "per group" \
                else ([want.num_tokens], [got.num_tokens])
            bound = "" if step.max_cache_hit_length is None else f", bound {step.max_cache_hit_length}"
            when = "this step" if number == len(self.steps) else f"step {number}"
            panels.append(draw.panel(f"{title} of prompt {step.prompt}{bound} at {when}",
                                     [*rows, draw.row("hit tokens", *tokens)], note))
        if self.answers.get("uncached", (None,))[0] == len(self.steps):
            _, _, want, got = self.answers["uncached"]
            panels.append(draw.panel("uncached common prefix tokens of that lookup",
                                     [draw.row("tokens", [want], [got])]))
        return panels or None

    def _judge(self, prompt: Sequence[int], step: LookUp, got: Lookup, want: Lookup) -> _SpecInputs:
        check = self.verdicts.check
        coordinator = self.model.coordinator
        assert coordinator is not None and self.setup is not None
        config = coordinator.config
        bound = len(prompt) - 1 if step.max_cache_hit_length is None else step.max_cache_hit_length
        spec_in = _SpecInputs(coordinator, self.model.hashes(prompt), bound)
        flat, loop = spec_in.flat, spec_in.loop
        hit = got.num_tokens
        check("KV-HYB-003", len(got.block_ids) == len(config.kv_cache_specs),
              lambda: f"the engine answered {len(got.block_ids)} groups, the config has "
                      f"{len(config.kv_cache_specs)}")
        # The kind's own hit rule first: a group's entries are the answer of its last lookup,
        # and one no lookup of its kind gives is that kind's failure (each member's own). A
        # full-attention answer has no null entry (KV-HYB-013, judged below).
        answers_kind = {g: NULL_BLOCK_ID not in got.block_ids[g] if sg.kind == spec.FULL
                        else self._judge_answer(spec_in, index, g, got.block_ids, got)
                        for index, sg in enumerate(coordinator.spec_groups) for g in sg.group_ids}
        for sg in coordinator.spec_groups:  # then KV-HYB-002: members that each answer their kind, but unlike
            first = sg.group_ids[0]
            for g in sg.group_ids[1:]:
                check("KV-HYB-002", not (answers_kind[g] and answers_kind[first])
                      or _layout(got.block_ids[g]) == _layout(got.block_ids[first]),
                      lambda g=g, first=first, sg=sg: f"groups {first} and {g} have one spec ({sg.kind}, "
                      f"block size {sg.kv_cache_spec.block_size}) but answer {list(got.block_ids[first])} "
                      f"and {list(got.block_ids[g])}: the groups of a spec group report the same hit "
                      f"(as many entries, null entries (id {NULL_BLOCK_ID}) in the same places)")
        groups = [(sg, g) for sg in coordinator.spec_groups for g in sg.group_ids]
        # An answer exactly that of a loop giving Mamba the EAGLE look-ahead (its hit grows past
        # what full attention holds) is KV-MAMBA-002's, before the full groups' trim is judged.
        # (Only a hit longer than the spec's: that look-ahead lets the candidate grow.)
        check("KV-MAMBA-002", not (config.use_eagle and any(sg.kind == spec.MAMBA for sg in coordinator.spec_groups)
                                   and hit > loop[0] and not spec_in.reproduces(loop, got)
                                   and any(spec_in.reproduces(m, got) for m in spec_in.mamba_margin_loops)),
              lambda: f"hit {hit} tokens: the answer of a loop that looks the Mamba group up one block past "
                      f"the candidate (it never drops it); the spec's is {loop[0]}")
        for sg, g in groups:  # KV-HYB-006 before KV-HYB-004: a full group's surplus is its rule
            if sg.kind == spec.FULL:
                size = sg.kv_cache_spec.block_size
                check("KV-HYB-006", len(got.block_ids[g]) == cdiv(hit, size),
                      lambda g=g, size=size: f"full-attention group {g} (block size {size}) has "
                      f"{len(got.block_ids[g])} hit blocks for a hit of {hit} tokens; want "
                      f"cdiv({hit}, {size}) = {cdiv(hit, size)}")
        for sg, g in groups:
            if sg.kind != spec.FULL:
                # (A fine-grained Mamba group's last page may hold a hit that ends inside it; every
                # other group's blocks end on the hit's alignment. Past the margin's signature above,
                # a fine-grained group's pages past the hit are its page count's, KV-MAMBA-020: a
                # hit of L tokens is cdiv(L, B) pages, and its last lookup answered the hit.)
                size = sg.kv_cache_spec.block_size
                rule_id = "KV-MAMBA-002" if sg.kind == spec.MAMBA else "KV-HYB-004"
                if coordinator._fine(sg):
                    rule_id = "KV-MAMBA-020"
                check(rule_id, len(got.block_ids[g]) <= cdiv(hit, size),
                      lambda g=g, size=size, sg=sg: f"{sg.kind} group {g} answers "
                      f"{len(got.block_ids[g])} blocks of {size} tokens, beyond the hit of {hit} tokens")
        self._judge_length(got, spec_in, prompt)
        # Null entries exactly where a look-ahead stopped at max_cache_hit_length puts them (the
        # hit itself may agree): that look-ahead's rule, not the null layout's.
        check("KV-HYB-007", not (config.use_eagle and not spec_in.reproduces(loop, got)
                                 and spec_in.reproduces(spec_in.capped_margin, got)),
              lambda: f"the null entries {[list(b) for b in got.block_ids]} are those of an EAGLE "
                      f"look-ahead that stops at the bound {bound} instead of the hashed tokens")
        for sg, g in groups:
            index = coordinator.spec_groups.index(sg)
            kind, size, param, _ = flat[index]
            entries = got.block_ids[g]
            last_bound, drop = loop[4][index]
            nulls = spec.num_null_hit_blocks(kind, len(entries), last_bound, drop, size, param)
            pattern = _null_pattern(entries)
            if flat[index][3] and not drop and kind != spec.MAMBA and pattern != nulls:
                # Wrong nulls in a group the loop had already verified, exactly where a lookup
                # that drops its EAGLE block again (bound one block further) puts them: a
                # second drop, named KV-HYB-007 like a wrong hit with EAGLE.
                again = spec.num_null_hit_blocks(kind, len(entries), min(last_bound + size, spec_in.num_hashed),
                                                 True, size, param)
                check("KV-HYB-007", pattern != again,
                      lambda entries=entries, nulls=nulls, g=g, kind=kind: f"{kind} group {g} answers "
                      f"{list(entries)}: the null entries of an EAGLE drop repeated after the group was "
                      f"verified; want {nulls} null entries first (id {NULL_BLOCK_ID})")
            check("KV-HYB-013", all((b == NULL_BLOCK_ID) == (j < nulls) for j, b in enumerate(entries)),
                  lambda entries=entries, nulls=nulls, g=g, kind=kind: f"{kind} group {g} answers "
                  f"{list(entries)}; want {nulls} null entries (id {NULL_BLOCK_ID}) first and none after")
        check("KV-FULL-002", got.block_ids == want.block_ids,
              lambda: f"hit block ids {[list(b) for b in got.block_ids]}; the reference's are "
                      f"{[list(b) for b in want.block_ids]}")
        return spec_in

    def _judge_uncached(self, spec_in: _SpecInputs, lookup: Lookup) -> None:
        """KV-HYB-008: the coordinator's third result against the spec's loop (0 with one group).

        The lookup itself passed: a wrong count whose whole answer (the lookup and the count)
        exactly one other loop gives names that loop's rule, as a wrong hit does
        (KV-SWA-001, KV-HYB-005); any other is KV-HYB-008.
        """
        got = self._lookup_uncached()
        check = self.verdicts.check
        hit, _, uncached, _, _ = spec_in.loop
        self.answers["uncached"] = (len(self.steps), None, uncached, got)
        if len(spec_in.coordinator.config.kv_cache_specs) == 1:
            check("KV-HYB-008", got == 0, lambda: f"{got} uncached common prefix tokens with one KV-cache "
                                                  "group; the unitary lookup (KV-HYB-014) reports 0")
            return
        others: list[tuple[str, tuple | None, bool, str]] = []
        if any(kind == spec.SLIDING_WINDOW for kind, _, _, _ in spec_in.flat):
            others.append(("KV-SWA-001", spec_in.wide, True, "a sliding-window scan needing cdiv(window, "
                                                             "block_size) blocks"))
        if spec.single_pass(tuple(kind for kind, _, _, _ in spec_in.flat)):
            others.append(("KV-HYB-005", spec_in.no_shortcut, False, "a loop that runs past its first pass with "
                                                                      "one full-attention and one other spec group"))
        if any(spec_in.fine):
            others += [(rule_id, getattr(spec_in, loop), False, what) for rule_id, loop, what in _PARTIAL_SIGNATURES]
        matching = [] if got == uncached else [
            rule_id for rule_id, loop, widen, _ in others
            if loop is not None and loop[2] == got and spec_in.reproduces(loop, lookup, widen)]
        for rule_id, _, _, what in others:
            check(rule_id, matching != [rule_id],
                  lambda what=what: f"{got} uncached common prefix tokens, the spec's {uncached}: the count "
                                    f"of {what}")
        check("KV-HYB-008", got == uncached,
              lambda: f"{got} uncached common prefix tokens; the longest candidate a spec group answered "
                      f"in the spec's loop is {hit + uncached} tokens and the hit {hit}, so {uncached}; "
                      f"spec groups {list(spec_in.flat)}, cached "
                      f"{[_flags(flags) for flags in spec_in.cached]}, bound {spec_in.bound}"
                      + _could_be(matching))

    def _partial_told_apart(self, spec_in: _SpecInputs, matching: list[str]) -> list[str]:
        """A wrong hit with both partial-hit signatures (KV-MAMBA-019, KV-MAMBA-020): where the
        engine reports its uncached common prefix tokens, the lookup's third result is part of its
        whole answer, so a signature whose loop counts otherwise is dropped -- the count shows the
        full-attention group's own candidate, aligned to the hash block (KV-MAMBA-020's loop) or to
        the scheduler block (KV-MAMBA-019's). An answer still both, or an engine without the
        count, is left to the general rules."""
        partial = {rule_id: getattr(spec_in, loop) for rule_id, loop, _ in _PARTIAL_SIGNATURES}
        if sum(rule_id in partial for rule_id in matching) < 2 or not self.verdicts.applicable("KV-HYB-008"):
            return matching
        uncached = self._lookup_uncached()
        return [rule_id for rule_id in matching if rule_id not in partial or partial[rule_id][2] == uncached]

    def _judge_per_group(self, prompt: Sequence[int], step: LookUp, spec_in: _SpecInputs) -> None:
        """KV-HYB-011: each spec group looked up alone, against the spec's per-group hits."""
        check = self.verdicts.check
        got = self.call("lookup_per_group", prompt, step.max_cache_hit_length, rule="KV-HYB-011")
        want = self.model.lookup_per_group(prompt, step.max_cache_hit_length)
        self.answers["per group"] = (len(self.steps), step, want, got)
        coordinator = spec_in.coordinator
        num_groups = len(coordinator.config.kv_cache_specs)
        check("KV-HYB-011", len(got.block_ids) == num_groups and len(got.num_tokens) == num_groups,
              lambda: f"the per-group lookup answered {len(got.block_ids)} groups' blocks and "
                      f"{len(got.num_tokens)} lengths; the config has {num_groups} groups")
        hits = spec.per_group_hits(spec_in.flat, spec_in.cached, spec_in.bound, spec_in.num_hashed,
                                   spec_in.alignment)
        matching = self._judge_per_group_partial(spec_in, got) if any(spec_in.fine) else []
        for index, group in enumerate(coordinator.spec_groups):
            kind, size, param, eagle = spec_in.flat[index]
            bound = spec_in.bound
            if eagle and spec.eagle_margin(kind, size):
                bound = min(bound + spec.eagle_margin(kind, size), spec_in.num_hashed)
            size = spec_in.page_sizes[index]  # a fine-grained group's entries are pages (KV-MAMBA-020)
            n = cdiv(hits[index], size)
            nulls = spec.num_null_hit_blocks(kind, n, bound, eagle, size, param)
            if kind != spec.FULL:  # entries no lookup of the kind gives: the kind's rule, as above
                for g in group.group_ids:
                    self._judge_answer(spec_in, index, g, got.block_ids, want=(n, nulls), context="per-group ")
            for g in group.group_ids if spec_in.fine[index] else ():
                # A fine-grained group's own hit of L tokens is cdiv(L, B) - 1 null pages, then one.
                pages = cdiv(got.num_tokens[g], size)
                entries = got.block_ids[g]
                check("KV-MAMBA-020", len(entries) == pages and _null_pattern(entries) == max(pages - 1, 0),
                      lambda g=g, pages=pages, size=size, entries=entries: f"per-group lookup: fine-grained Mamba "
                      f"group {g} (block size {size}) answers {got.num_tokens[g]} tokens as {list(entries)}; a hit "
                      f"of that many tokens is {pages} entries, the last one a page and the others null (id "
                      f"{NULL_BLOCK_ID})")
            first = group.group_ids[0]
            for g in group.group_ids[1:]:
                check("KV-HYB-002", got.num_tokens[g] == got.num_tokens[first]
                      and _layout(got.block_ids[g]) == _layout(got.block_ids[first]),
                      lambda g=g, first=first: f"per-group lookup: groups {first} and {g} share a spec but "
                      f"answer {got.num_tokens[first]} tokens {list(got.block_ids[first])} and "
                      f"{got.num_tokens[g]} tokens {list(got.block_ids[g])}")
            for g in group.group_ids:
                entries = got.block_ids[g]
                check("KV-HYB-011", got.num_tokens[g] == hits[index] and len(entries) == n
                      and _null_pattern(entries) == nulls,
                      lambda g=g, entries=entries, index=index, kind=kind, size=size, bound=bound, n=n,
                      nulls=nulls, eagle=eagle: f"per-group lookup: {kind} group {g} (block size {size}) answers "
                      f"{got.num_tokens[g]} tokens {list(entries)}; looked up alone at {bound} tokens"
                      f"{' with its EAGLE drop' if eagle else ''} it hits {hits[index]} tokens: {n} entries, "
                      f"{nulls} null (id {NULL_BLOCK_ID}) first; cached {_flags(spec_in.cached[index])}, "
                      f"bound {spec_in.bound}" + _could_be(matching))
        check("KV-FULL-002", got.block_ids == want.block_ids,
              lambda: f"per-group hit block ids {[list(b) for b in got.block_ids]}; the reference's are "
                      f"{[list(b) for b in want.block_ids]}")

    def _judge_per_group_partial(self, spec_in: _SpecInputs, got: PerGroupLookup) -> list[str]:
        """Per-group lookups of a partial-hit model: an answer that is exactly that of each group
        looked up with the keys inside a Mamba block ignored names KV-MAMBA-020, one that is
        exactly that of each group looked up with partial hits off (aligned to the scheduler block
        size) KV-MAMBA-019 -- the alignment shows here, in a full-attention group's own hit. An
        answer that is both is left to KV-HYB-011; the rules it could be are returned for its
        message."""
        check = self.verdicts.check
        firsts = [group.group_ids[0] for group in spec_in.coordinator.spec_groups]
        answered = tuple((got.num_tokens[g], len(got.block_ids[g]), _null_pattern(got.block_ids[g]))
                         for g in firsts)
        wanted = spec_in.per_group_answer()
        matching = [] if answered == wanted else [
            rule_id for rule_id, variant, _ in _PARTIAL_SIGNATURES
            if answered == spec_in.per_group_answer(variant)]
        for rule_id, _, what in _PARTIAL_SIGNATURES:
            check(rule_id, matching != [rule_id],
                  lambda what=what: f"per-group lookup: (hit, entries, leading nulls) per spec group "
                                    f"{list(answered)}, the spec's {list(wanted)}: {what}")
        return matching

    def _judge_answer(self, spec_in: _SpecInputs, index: int, group_id: int, block_ids: Sequence[Sequence[int]],
                      got: Lookup | None = None, want: tuple[int, int] | None = None, context: str = "") -> bool:
        """One non-full spec group's answer against its kind's hit rule.

        The group's entries are the answer of its last lookup, at a bound and drop the loop
        chose. The kind's rule is broken when no lookup of that kind, at any bound up to the
        larger of the lookup's bound and the hashed tokens and with either drop the group may
        be given, answers these entries: then the group's finder, not the loop, is wrong. (A
        finder that errs towards another bound's answer is the loop's rules' to catch.) A
        wrong answer that has exactly one named rule's signature is charged to that rule; one
        with none, or with several (which could each explain it), to the kind's own rule.
        Returns whether the entries are an answer of the kind (checks that pass record it).

        ``block_ids`` are the groups' entries of the answer judged; ``got`` is the whole hybrid
        lookup (its hit), ``None`` for a per-group lookup, whose wanted (entries, leading nulls)
        ``want`` gives instead of the loop's (and whose finder may be asked any bound).
        """
        check = self.verdicts.check
        kind, size, param, eagle = spec_in.flat[index]
        entries = block_ids[group_id]
        shape = (len(entries), _null_pattern(entries))
        wanted = spec_in.answer(spec_in.loop, index) if want is None else want
        any_bound = want is not None

        def answers_kind(group_entries: Sequence[int]) -> bool:
            found = (len(group_entries), _null_pattern(group_entries))
            return found == wanted or found in spec_in.answers(index, (False, eagle), any_bound=any_bound)

        valid = answers_kind(entries)
        n, nulls = shape
        alignment = spec_in.alignment
        #: (rule, whether the answer has the rule's signature, what the signature is)
        named: list[tuple[str, Callable[[], bool], str]] = []
        members = [g for i, g in spec_in.members if i == index]
        if members:
            # Another group of the spec group answers its kind, and this one otherwise: the groups
            # of one spec group disagree, whatever this group's own finder did.
            named.append(("KV-HYB-002", lambda: any(shape in spec_in.answers(index, (False, eagle), g,
                                                                             any_bound=any_bound)
                                                    for g in members)
                          or any(_layout(block_ids[g]) != _layout(entries) and answers_kind(block_ids[g])
                                 for g in members if g != group_id),
                          f"an answer of its kind if a block need only be cached in one group of its spec "
                          f"group {members}, not in all of them, or unlike another group's of the spec group"))
        if kind == spec.SLIDING_WINDOW:
            if got is not None:
                named.append(("KV-SWA-001", lambda: spec_in.reproduces(spec_in.wide, got, widen=True),
                              "the whole answer of the loop whose window scan needs cdiv(window, block_size) "
                              "contiguous blocks"))
            if param == 1 and not eagle:
                named.append(("KV-SWA-003", lambda: bool(n) and nulls == n,
                              "every entry null, as if a window of 1 needed no cached block"))
            if eagle:
                # One real entry more than any lookup returns (at most cdiv(window - 1, b), and 1
                # for a window of 1, KV-SWA-003): the run of need + 1 blocks kept whole. (With a
                # window of 1 the kept run is what a lookup without the drop returns: no signature.)
                most = max(sliding_window.contiguous_blocks_needed(param, size, False), 1)
                named.append(("KV-SWA-004", lambda: nulls is not None and n - nulls == most + 1
                              and (n - 1, nulls) in spec_in.answers(index, (True,), any_bound=any_bound),
                              f"an EAGLE lookup's answer with the block it drops still on ({most + 1} real "
                              f"entries, where a lookup returns at most {most})"))
            if size != alignment:
                # A run ending off the alignment: a length no aligned lookup gives (without EAGLE),
                # or (with EAGLE, whose drop moves the end) an answer of a lookup that ignores it.
                named.append(("KV-SWA-005", lambda: (n * size) % alignment != 0 if not eagle else
                              shape in spec_in.answers(index, (False, True), alignment=size,
                                                       any_bound=any_bound),
                              f"{n * size} tokens, an answer whose run ends off the alignment {alignment}"))
        matching = [] if valid else [rule_id for rule_id, signature, _ in named if signature()]

        def detail() -> str:
            what = {spec.SLIDING_WINDOW: f", window {param}", spec.CHUNKED_LOCAL: f", chunk {param}"}.get(kind, "")
            if spec_in.fine[index]:  # its entries are pages, its keys per hash block
                what = f", looked up per hash block of {size}"
            return (f"{context}{kind} group {group_id} (block size {spec_in.page_sizes[index]}{what}"
                    f"{', EAGLE' if eagle else ''}, "
                    f"alignment {alignment}) answers {list(entries)}, cached {_flags(spec_in.cached[index])}; "
                    f"the spec's {'per-group lookup' if any_bound else 'loop'} wants {wanted} (entries, "
                    "leading nulls)")

        for rule_id, _, signature_text in named:
            check(rule_id, matching != [rule_id], lambda text=signature_text: f"{detail()}: {text}")
        general, what = {
            spec.CHUNKED_LOCAL: ("KV-CHUNK-001", "floor(bound / chunk) * chunk tokens of null blocks, then the "
                                                 "cached blocks from there"),
            spec.MAMBA: ("KV-MAMBA-001", "null blocks, then the last cached block whose end is a multiple of "
                                         "the alignment"),
            spec.SLIDING_WINDOW: ("KV-SWA-002", "null blocks, then the run of cached blocks that ends the "
                                                "greatest accepted length")}[kind]
        if spec_in.fine[index]:
            general, what = ("KV-MAMBA-020", "cdiv(L, block_size) - 1 null blocks, then the page cached under the "
                                             "last cached hash boundary L within the bound (a positional key or "
                                             "a partial entry)")
        check(general, valid, lambda: f"{detail()}: no {kind} lookup answers that -- {what}"
                                      + (f" (it could be {' or '.join(matching)})" if matching else ""))
        return valid

    def _judge_length(self, got: Lookup, spec_in: _SpecInputs, prompt: Sequence[int]) -> None:
        check = self.verdicts.check
        hit = got.num_tokens
        flat, cached, bound, alignment = spec_in.flat, spec_in.cached, spec_in.bound, spec_in.alignment
        expected = spec_in.loop[0]
        detail = (f"prompt of {len(prompt)} tokens, bound {bound}, spec groups {list(flat)}, cached "
                  f"{[_flags(flags) for flags in cached]}")
        has_swa = any(kind == spec.SLIDING_WINDOW for kind, _, _, _ in flat)
        eagle = any(e for _, _, _, e in flat)
        # A wrong hit whose whole answer (the hit and every other group's entries) exactly one
        # other loop gives is that loop's rule; one that several give could be any of them,
        # and falls to the general rules below.
        others: list[tuple[str, Callable[[], list[tuple[tuple, bool]]], Callable[[], str]]] = []
        if has_swa:  # the scan that wrongly needs cdiv(window, b) blocks is the loop with window + 1
            others.append(("KV-SWA-001", lambda: [(spec_in.wide, True)], lambda: "the answer of a "
                           "sliding-window scan needing cdiv(window, block_size) blocks"))
        if spec.single_pass(tuple(kind for kind, _, _, _ in flat)):
            others.append(("KV-HYB-005", lambda: [(spec_in.no_shortcut, False)], lambda: "the answer of a loop "
                           "that runs past its first pass with one full-attention and one other spec group"))
        if eagle:  # the loop of vLLM #32802: every lookup drops its EAGLE block, no margin
            others.append(("KV-HYB-015", lambda: [(spec_in.spiral, False)], lambda: "the answer of a loop "
                           "that drops an EAGLE block on every pass (it spirals down)"))
        if any(spec_in.fine):
            others += [(rule_id, lambda loop=loop: [(getattr(spec_in, loop), False)], lambda what=what: what)
                       for rule_id, loop, what in _PARTIAL_SIGNATURES]
        matching = [] if hit == expected else [
            rule_id for rule_id, loops, _ in others
            if any(spec_in.reproduces(loop, got, widen) for loop, widen in loops())]
        matching = self._partial_told_apart(spec_in, matching)
        if matching in (["KV-HYB-015"], ["KV-SWA-001"]) and spec_in.reproduces(spec_in.capped_margin, got):
            # A look-ahead capped at the bound gives it too: KV-HYB-007's, below. (vLLM 0.22's
            # capped look-ahead matched the wide window's answer with a window of 1.)
            matching = []
        for rule_id, _, what in others:
            check(rule_id, matching != [rule_id],
                  lambda what=what: f"hit {hit} tokens, the spec's {expected}: {what()}; {detail}")
        check("KV-HYB-004", 0 <= hit <= bound and hit % alignment == 0,
              lambda: f"hit {hit} is not an aligned length within the bound {bound}; {detail}")
        if eagle:
            check("KV-HYB-007", hit == expected,
                  lambda: f"hit {hit} tokens with EAGLE; the spec's fixed point is {expected}; {detail}"
                          + _could_be(matching))
        check("KV-HYB-003", hit == expected,
              lambda: f"hit {hit} tokens; the spec's fixed point is {expected}; {detail}" + _could_be(matching))
        # The engine answered the spec's loop. Where that loop is more conservative than the
        # declarative hit, the engine was checked against a named divergence.
        declarative = spec.declarative_hit(flat, cached, bound, alignment)
        swa_misaligned = any(k == spec.SLIDING_WINDOW and e and s != alignment for k, s, _, e in flat)
        eagle_swa = sum(1 for k, _, _, e in flat if e and k != spec.MAMBA) >= 2 and has_swa
        if swa_misaligned:
            check("KV-SWA-010", hit == expected, "")
        if eagle_swa:
            check("KV-HYB-009", hit == expected, "")
        if any(k == spec.SLIDING_WINDOW and p == 1 for k, _, p, _ in flat):
            check("KV-SWA-003", hit == expected, "")
        if expected != declarative:
            ideal = spec.fixed_point(flat, cached, bound, spec_in.num_hashed, alignment, ideal=True)[0]
            names = ["KV-SWA-003"] if ideal != declarative else (
                (["KV-SWA-010"] if swa_misaligned else []) + (["KV-HYB-009"] if eagle_swa else []))
            for name in names or ["unnamed"]:
                self.divergences[name] = self.divergences.get(name, 0) + 1


class _SpecInputs:
    """One lookup as the spec sees it -- each spec group's kind and cached blocks, the bound,
    the hashed tokens and the alignment -- and the loops the checks compare the engine with,
    each computed when a check first needs it."""

    def __init__(self, coordinator: HybridCoordinator, hashes: Sequence[bytes], bound: int) -> None:
        config = coordinator.config
        self.coordinator, self.hashes, self.bound = coordinator, hashes, bound
        #: The scheduler block size, or the hash block with partial hits on (KV-MAMBA-019).
        self.alignment = config.hit_alignment
        # As the reference's lookup sees them: a fine-grained Mamba group (KV-MAMBA-020) is one of
        # the hash block, flagged per hash unit.
        self.flat, self.cached, self.num_hashed = coordinator._lookup_inputs(hashes)
        #: Each spec group's block: what its entries are pages of (a fine-grained group's flat
        #: block is the hash block, and a hit may end inside its last page).
        self.page_sizes = tuple(group.kv_cache_spec.block_size for group in coordinator.spec_groups)
        #: Which spec groups are fine-grained Mamba groups.
        self.fine = tuple(coordinator._fine(group) for group in coordinator.spec_groups)
        #: The groups of spec groups with more than one member (KV-HYB-002).
        self.members = [(index, g) for index, group in enumerate(coordinator.spec_groups)
                        if len(group.group_ids) > 1 for g in group.group_ids]
        self._member_flags: dict[tuple[int, int], tuple[bool, ...]] = {}

    def fixed_point(self, flat: tuple[spec.SpecGroup, ...], cached: tuple[tuple[bool, ...], ...],
                    one_pass: bool = True) -> tuple:
        return spec.fixed_point(flat, cached, self.bound, self.num_hashed, self.alignment, one_pass=one_pass)

    @functools.cached_property
    def loop(self) -> tuple:
        """The spec's loop: what the engine must answer."""
        return self.fixed_point(self.flat, self.cached)

    @functools.cached_property
    def wide(self) -> tuple | None:
        """The loop when a sliding-window hit needs cdiv(window, b) blocks: window + 1 (KV-SWA-001)."""
        if not any(kind == spec.SLIDING_WINDOW for kind, _, _, _ in self.flat):
            return None
        return self.fixed_point(tuple((k, s, p + 1 if k == spec.SLIDING_WINDOW else p, e)
                                      for k, s, p, e in self.flat), self.cached)

    @functools.cached_property
    def no_shortcut(self) -> tuple:
        """The loop run to its fixed point without KV-HYB-005's single pass."""
        return self.fixed_point(self.flat, self.cached, one_pass=False)

    @functools.cached_property
    def capped_margin(self) -> tuple:
        """The loop whose EAGLE look-ahead is capped by the bound, not the hashed tokens."""
        return spec.fixed_point(self.flat, self.cached, self.bound, self.num_hashed, self.alignment,
                                margin_cap="max_length")

    @functools.cached_property
    def mamba_margin_loops(self) -> tuple[tuple, ...]:
        """The loops giving a Mamba group the EAGLE look-ahead, capped by the hashed tokens or
        by the bound (vLLM 0.20 to 0.25 capped it by the bound)."""
        return tuple(spec.fixed_point(self.flat, self.cached, self.bound, self.num_hashed, self.alignment,
                                      margin_cap=cap, mamba_margin=True) for cap in ("hashed", "max_length"))

    @functools.cached_property
    def positional_only(self) -> tuple | None:
        """The loop whose fine-grained Mamba groups read only their pages' positional keys, the
        keys inside a block ignored (KV-MAMBA-020's signature); None without such a group."""
        if not any(self.fine):
            return None
        return self.fixed_point(self.flat, self._positional_flags())

    @functools.cached_property
    def partial_off(self) -> tuple | None:
        """The loop of an engine that leaves partial hits off (KV-MAMBA-019's signature): hits
        aligned to the scheduler block size, each Mamba group looked up at its own block by its
        pages' positional keys; None without a fine-grained group. (Its answers are pages as the
        fine-grained loop's are: :meth:`answer` reads both.)"""
        if not any(self.fine):
            return None
        flat, cached, alignment = self._partial_off_inputs()
        return spec.fixed_point(flat, cached, self.bound, self.num_hashed, alignment)

    def _positional_flags(self) -> tuple[tuple[bool, ...], ...]:
        """The cached flags with a fine-grained group's units kept only where they end a page:
        its pages' positional keys."""
        return tuple(tuple(hit and (f + 1) % (page // size) == 0 for f, hit in enumerate(flags)) if fine else flags
                     for fine, flags, page, (_, size, _, _) in zip(self.fine, self.cached, self.page_sizes, self.flat))

    def _partial_off_inputs(self) -> tuple[tuple[spec.SpecGroup, ...], tuple[tuple[bool, ...], ...], int]:
        """The spec's inputs with partial hits off: every group at its own block, a fine-grained
        group flagged per page by the unit that ends it, the scheduler block size the alignment."""
        config = self.coordinator.config
        flat = tuple(group.flat(config.use_eagle) for group in self.coordinator.spec_groups)
        cached = tuple(flags[page // size - 1::page // size] if fine else flags for fine, flags, page, (_, size, _, _)
                       in zip(self.fine, self.cached, self.page_sizes, self.flat))
        return flat, cached, config.scheduler_block_size

    def per_group_answer(self, variant: str | None = None) -> tuple[tuple[int, int, int | None], ...]:
        """(hit, entries, leading nulls) of each spec group looked up alone at the bound, with its
        EAGLE margin and drop (KV-HYB-011); with ``variant`` ("positional_only" or "partial_off"),
        as that signature's engine answers them."""
        flat, cached, alignment = self.flat, self.cached, self.alignment
        if variant == "positional_only":
            cached = self._positional_flags()
        elif variant == "partial_off":
            flat, cached, alignment = self._partial_off_inputs()
        hits = spec.per_group_hits(flat, cached, self.bound, self.num_hashed, alignment)
        answers = []
        for (kind, size, param, eagle), page, hit in zip(flat, self.page_sizes, hits):
            bound = self.bound
            if eagle and spec.eagle_margin(kind, size):
                bound = min(bound + spec.eagle_margin(kind, size), self.num_hashed)
            n = cdiv(hit, page)
            answers.append((hit, n, spec.num_null_hit_blocks(kind, n, bound, eagle, page, param)))
        return tuple(answers)

    @functools.cached_property
    def spiral(self) -> tuple:
        """The loop dropping an EAGLE block on every lookup, without a margin (KV-HYB-015)."""
        return spec.fixed_point(self.flat, self.cached, self.bound, self.num_hashed, self.alignment,
                                redrop=True)

    def member_flags(self, index: int, group_id: int) -> tuple[bool, ...]:
        """Spec group ``index``'s cached blocks as group ``group_id`` alone has them."""
        if (index, group_id) not in self._member_flags:
            alone = attrs.evolve(self.coordinator.spec_groups[index], group_ids=(group_id,))
            self._member_flags[index, group_id] = self.coordinator._cached_flags(self.hashes, alone)
        return self._member_flags[index, group_id]

    def answer(self, loop: tuple, index: int, widen: bool = False) -> tuple[int, int]:
        """(entries, leading nulls) of spec group ``index``'s last lookup in ``loop`` (``widen``:
        a loop whose windows are one token wider). Entries are pages: a fine-grained group's
        answer of L tokens is cdiv(L, B) of them (KV-MAMBA-020)."""
        kind, _, param, _ = self.flat[index]
        page = self.page_sizes[index]
        last_bound, drop = loop[4][index]
        n = cdiv(loop[1][index], page)
        param += 1 if widen and kind == spec.SLIDING_WINDOW else 0
        return n, spec.num_null_hit_blocks(kind, n, last_bound, drop, page, param)

    def reproduces(self, loop: tuple | None, got: Lookup, widen: bool = False) -> bool:
        """Whether the engine's answer is exactly ``loop``'s: the same hit, and each non-full
        spec group's entries as many, with as many leading nulls, as its last lookup there."""
        if loop is None or got.num_tokens != loop[0]:
            return False
        for index, group in enumerate(self.coordinator.spec_groups):
            entries = got.block_ids[group.group_ids[0]]
            if group.kind != spec.FULL and (len(entries), _null_pattern(entries)) != self.answer(loop, index, widen):
                return False
        return True

    def answers(self, index: int, drops: tuple[bool, ...], member: int | None = None,
                alignment: int | None = None, any_bound: bool = False) -> frozenset[tuple[int, int]]:
        """(entries, leading nulls) of every answer spec group ``index``'s finder gives, at every
        bound up to the larger of the lookup's bound and the hashed tokens, with each drop in
        ``drops``: whatever bound and drop a coordinator passes, its answer is one of these.
        With ``member``, over the blocks that group alone has cached; with ``alignment``, a
        finder that aligns its answer to that instead of the lookup's alignment. With one spec
        group the loop is one lookup at the bound, so only its answer there counts (one at
        another bound is then the finder's error: no other pass could have asked for it) --
        unless ``any_bound`` (a per-group lookup's answer, judged against its own bound)."""
        size = self.flat[index][1]
        if len(self.flat) == 1 and not any_bound:  # one spec group: one lookup, at the loop's bound and drop
            bound, drop = self.loop[4][index]
            return frozenset({self.answer_at(index, bound, drop, member, alignment)})
        return frozenset(self.answer_at(index, bound, drop, member, alignment) for drop in set(drops)
                         for bound in range(0, max(self.bound, self.num_hashed) + 1, size))  # whole blocks

    def answer_at(self, index: int, bound: int, drop: bool, member: int | None = None,
                  alignment: int | None = None) -> tuple[int, int]:
        """(entries, leading nulls) of spec group ``index``'s finder at ``bound`` with ``drop``."""
        kind, size, param, _ = self.flat[index]
        page = self.page_sizes[index]
        flags = self.cached[index] if member is None else self.member_flags(index, member)
        align = self.alignment if alignment is None else alignment
        if self.fine[index] and align == size:  # KV-MAMBA-020's finder: the last cached hash boundary
            length = mamba_spec.partial_hit_length(flags, bound, page, size)
        else:
            length = spec.group_hit_length(kind, flags, bound, size, param, drop, align)
        n = cdiv(length, page)
        return n, spec.num_null_hit_blocks(kind, n, bound, drop, page, param)


def _flags(flags: Sequence[bool]) -> str:
    return "".join("x" if c else "." for c in flags)


def _layout(entries: Sequence[int]) -> tuple[bool, ...]:
    """Which entries of a group's answer are the null block."""
    return tuple(b == NULL_BLOCK_ID for b in entries)


def _null_pattern(entries: Sequence[int]) -> int | None:
    """How many leading entries are the null block, or None if a null entry follows a real one."""
    leading = next((j for j, b in enumerate(entries) if b != NULL_BLOCK_ID), len(entries))
    return leading if NULL_BLOCK_ID not in entries[leading:] else None


#: The named answers of a partial-hit model: (rule, the :class:`_SpecInputs` loop or per-group
#: variant that gives them, what they are).
_PARTIAL_SIGNATURES = (
    ("KV-MAMBA-020", "positional_only", "the answer of a lookup whose Mamba groups read only their pages' "
                                        "positional keys, not the keys inside a block"),
    ("KV-MAMBA-019", "partial_off", "the answer of a lookup with partial hits off: hits aligned to the scheduler "
                                    "block size, Mamba groups looked up at their own blocks"),
)


def _could_be(matching: Sequence[str]) -> str:
    """For a general rule's message: the named rules whose signatures a wrong answer has, where
    there are several (each could explain it, so none is charged)."""
    return f" (the answer of several named bugs: it could be {' or '.join(matching)})" if len(matching) > 1 else ""


#: Divergences of the spec's loop from the declarative hit, over a whole run (for the report).
DIVERGENCES: dict[str, int] = {}


#: The parts of the suites that generate hybrid models (this one and the external store's), each
#: given a run's --max-examples: models with EAGLE on and with it off. A drawn flag left some seeds'
#: 150 examples without the shapes that only one side has: the EAGLE drop repeated on a later pass
#: of the loop, a Mamba state finer than the alignment (rarer with EAGLE), or the single pass's
#: answer that a second pass would change.
EAGLE_ON, EAGLE_OFF = "eagle", "no-eagle"
PARTS = (EAGLE_ON, EAGLE_OFF)


class HybridLookupMachine(SuiteMachine):
    """Seeds and lookups over one generated hybrid configuration."""

    driver: HybridDriver
    parts = PARTS

    def __init__(self) -> None:
        super().__init__()
        self.seeded: list[int] = []
        #: Every prompt seeded in some group so far, in order (with repeats).
        self.touched: list[int] = []

    @initialize(data=st.data())
    def configure(self, data: st.DataObject) -> None:
        # (Drawn through ``data``, which draws nothing itself: without the capability the
        # examples are what a strategy argument drew.)
        part = self.draw_part(data)
        partial = self.driver.verdicts.capabilities.mamba_partial_hits and self.can("seed_partial_entry")
        self.driver.apply(data.draw(_setups(partial, part == EAGLE_ON), label="setup"))

    def _fine_groups(self) -> list[int]:
        """The fine-grained Mamba groups of a partial-hit model (KV-MAMBA-020), where partial
        entries can be seeded."""
        coordinator = self.driver.model.coordinator
        return [g for g in range(len(self.driver.setup.groups)) if coordinator.fine_grained(g)]

    def _alive(self) -> bool:
        return self.driver.setup is not None and not self.driver.dead

    @precondition(_alive)
    @rule(data=st.data())
    def seed(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        prompt = data.draw(st.integers(0, len(setup.prompts) - 1), label="prompt")
        group = data.draw(st.integers(0, len(setup.groups) - 1), label="group")
        size = setup.groups[group][1]
        # A seed holds its blocks until it frees them: at most the pool's non-null blocks.
        length = min(len(setup.prompts[prompt]) // size, setup.num_blocks - 1)
        self.touched.append(prompt)
        self.driver.apply(Seed(prompt, group, data.draw(_masks(length), label="mask")))

    @precondition(_alive)
    @rule(data=st.data())
    def seed_every_group(self, data: st.DataObject) -> None:
        # A hit needs the prompt cached in every group: seed one prompt in all of them, with
        # the same mask drawn over hash blocks (each group sees it at its own block size).
        setup = self.driver.setup
        prompt = data.draw(st.integers(0, len(setup.prompts) - 1), label="prompt")
        tokens = len(setup.prompts[prompt])
        mask = data.draw(_hash_masks(tokens // setup.hash_block_size), label="hash mask")
        self.seeded.append(prompt)
        self.touched.append(prompt)
        # Or (two times in three) each group its own random holes, four in five blocks cached:
        # the EAGLE peek and sliding-window runs then differ between groups, which is what
        # makes the loop take several passes and the groups' answers differ.
        independent = data.draw(st.integers(0, 2), label="independent masks") > 0
        alignment = _lcm([size for _, size, _ in setup.groups])
        for group, (kind, size, window) in enumerate(setup.groups):
            per = size // setup.hash_block_size
            length = min(tokens // size, setup.num_blocks - 1)
            if independent:
                need = sliding_window.contiguous_blocks_needed(window, size, setup.use_eagle) \
                    if kind == spec.SLIDING_WINDOW else None
                masks = _group_masks(length, alignment // size if size < alignment else None, need)
                self.driver.apply(Seed(prompt, group, data.draw(masks, label="mask")))
                continue
            self.driver.apply(Seed(prompt, group, tuple(
                all(mask[j * per:(j + 1) * per]) and len(mask) >= (j + 1) * per for j in range(length))))
        self._seed_tails(data, prompt)

    def _seed_tails(self, data: st.DataObject, prompt: int) -> None:
        """In a partial-hit model, one time in two per fine-grained Mamba group, a partial entry of
        the prompt: at its last hash boundary inside a block, where a producer keys its tail
        (KV-MAMBA-021), or at any hash boundary inside a block (a longer prompt's tail)."""
        setup = self.driver.setup
        h = setup.hash_block_size
        tokens = setup.prompts[prompt]
        for group in self._fine_groups():
            size = setup.groups[group][1]
            inside = [t for t in range(h, (len(tokens) // h) * h + 1, h) if mamba_spec.shared_entry(t, size) >= 0]
            if not inside or data.draw(st.integers(0, 1), label="partial entry") == 0:
                continue
            tail = mamba_spec.checkpoint_position(len(tokens), h, setup.use_eagle)
            choices = st.sampled_from(inside) | (st.just(tail) if tail in inside else st.nothing())
            self.driver.apply(SeedTail(prompt, group, data.draw(choices, label="partial entry tokens")))

    @precondition(_alive)
    @rule(data=st.data())
    def look_up(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        # Mostly (four times in five) a prompt seeded in every group: those can hit.
        seeded = self.seeded and data.draw(st.integers(0, 4), label="a seeded prompt") > 0
        prompt = data.draw(st.sampled_from(self.seeded) if seeded
                           else st.integers(0, len(setup.prompts) - 1), label="prompt")
        # Or bounded, now and then to a few aligned blocks: every group then tends to accept the whole
        # bound, and a group answering past it (KV-MAMBA-002) shows. Or on an aligned boundary, where
        # a window group finer than the alignment is looked up at the bound itself and its run must
        # end there or at an earlier boundary (KV-SWA-005).
        bound = data.draw(_bounds(len(setup.prompts[prompt]), _lcm([size for _, size, _ in setup.groups])),
                          label="bound")
        self.driver.apply(LookUp(prompt, bound))

    @precondition(lambda self: not self._alive())
    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead (no other rule runs)

    def closing_steps(self) -> list[object]:
        # Every prompt seeded in some group looked up once more, unbounded: with swarm rule
        # selection half the examples never looked anything up (106 of 208 on seed 0).
        return [LookUp(prompt) for prompt in dict.fromkeys(self.touched)] if self._alive() else []

    def teardown(self) -> None:
        super().teardown()
        for name, count in self.driver.divergences.items():
            DIVERGENCES[name] = DIVERGENCES.get(name, 0) + count


#: The hybrid lookup suite, registered with the harness.
HYBRID = register_suite(SuiteDef(
    name="hybrid",
    title="the hybrid cache-hit lookup over several KV-cache groups",
    operations=("configure", "seed_cache", "lookup"),
    returns={"lookup": returns.attributes(Lookup, block_ids=returns.block_id_groups,
                                          num_tokens=returns.integer),
             "uncached_common_prefix_tokens": returns.integer,
             "lookup_per_group": returns.attributes(PerGroupLookup, block_ids=returns.block_id_groups,
                                                    num_tokens=returns.sequence_of(returns.integer))},
    driver=HybridDriver, machine=HybridLookupMachine, module=__name__,
    step_names=("HybridSetup", "LookUp", "Seed", "SeedTail"),
    engines={"reference": f"{__name__}:ReferenceHybridLookup",
             "vllm": "kvoracle.conformance.engines.vllm_hybrid:VllmHybridLookup"},
    machine_options=lambda probe: {"parts": PARTS}))
