"""The external-store suite: an engine's store coordinator against the spec.

An external KV store (spec chapter ``external_store``) answers cache hits over
an existence set of ``(group_id, hash)`` keys. This suite drives an engine's
store coordinator behind the small :class:`ExternalStoreAdapter` protocol. The
driver keeps the existence set itself: it grows by what the engine's
``store_mask`` says a request writes (``Store``) and by arbitrary chunks
(``Put``), and shrinks by random evictions (``Evict``). kvoracle's reference
(:class:`kvoracle.reference.external_store.ExternalStoreCoordinator`) answers
the same questions over the same set.

Per lookup, in this order (the first failing rule names the counterexample):

* KV-EXT-003: one mask per group, of cdiv(hit, block_size) entries;
* KV-EXT-002: every chunk a mask asks for exists under the key it is fetched by;
* KV-EXT-001: the hit equals the reference's (the local hybrid loop over the
  store's flags) and, where the engine exposes its own local hybrid coordinator,
  that coordinator's hit over a pool holding exactly the same keys (the
  differential check);
* KV-EXT-003: the masks are the groups' load masks at the hit;
* KV-EXT-004 / KV-EXT-003: ``load_mask(hashes, hit)`` covers the whole hit and
  equals the lookup's masks.

Per store: KV-EXT-008 (no Mamba chunk), KV-EXT-005 (the reference's store mask),
KV-EXT-007 (``lookup_mask``, where the engine has it), KV-EXT-011 (no chunk of a
window of 1) and KV-EXT-006 (what was stored serves every aligned bound, in
configurations that KV-EXT-008, KV-EXT-011 and KV-EXT-012 leave alone).

Named differences are charged to their own rules where the engine's answer is
exactly the one they name (and judged passed where an answer could have shown
them and did not):

* KV-EXT-009: with groups marked as EAGLE groups and EAGLE off, a hit, lookup
  masks, store mask or lookup mask computed with the store's drop
  (:func:`kvoracle.spec.external_store.store_eagle_groups`) instead of the local
  coordinator's (none);
* KV-EXT-013: with several KV-cache groups sharing one spec and EAGLE, the hit of
  one lookup at the bound with the drop and without the look-ahead, or the load
  masks of that lookup where the local loop's last lookup had no drop;
* KV-EXT-010: with partial hash hits, a full-attention group asked to load the
  chunk a hit ends inside, whose key at the hit's end is missing although the
  group holds the chunk under a later hash boundary inside it (the group was
  found at the longer boundary and trimmed to a shorter one);
* KV-EXT-014: ``load_mask(hashes, hit)`` of an EAGLE sliding window of 1 marking the
  block before the hit (the mask recomputed without the drop), where the group's hit
  reads no block.

Engines that support vLLM's partial hash hits (``supports_partial_hash_hits``)
also get full-attention + Mamba configurations with Mamba blocks larger than
the hash block; the reference does not model them, so there only the checks
that need no reference are made: KV-EXT-002 (KV-EXT-010), KV-EXT-004 and the
differential KV-EXT-001. KV-EXT-010 is not judged for other engines.

Run it with ``kvoracle check --suite external-store [--engine reference|vllm|module:Class]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvoracle import __version__
from kvoracle.reference.external_store import (
    ExternalCachedBlockPool,
    ExternalStoreConfig,
    ExternalStoreCoordinator,
    Key,
)
from kvoracle.spec import external_store as spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec.hashing import extend_block_hashes
from kvoracle.spec.lifecycle import cdiv

from .harness import picture as draw
from .harness import returns
from .harness.driver import Driver
from .harness.machine import SuiteMachine
from .harness.suites import SuiteDef, register_suite
from .hybrid_lookup import EAGLE_ON, MOSTLY_TRUE, PARTS, GroupDesc, _kv_spec, hybrid_setups, kept

#: Per-group masks, as plain tuples.
Masks = tuple[tuple[bool, ...], ...]


@runtime_checkable
class ExternalStoreAdapter(Protocol):
    """An engine's external-store coordinator, behind engine-neutral operations.

    Hashes are the request's hash-block hashes as bytes; ``exists`` is the store's key
    set. Masks are per group; an engine's "all chunks" sentinel is spelled out.
    """

    name: str
    #: Whether the engine can be configured with partial (sub-block) hash hits.
    supports_partial_hash_hits: bool

    def version(self) -> str: ...

    def configure(self, setup: StoreSetup) -> None: ...

    def lookup(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[Key]
               ) -> tuple[Masks, int]:
        """``(per-group load masks, hit length)`` over a store holding ``exists``."""

    def load_mask(self, block_hashes: Sequence[bytes], token_len: int) -> Masks: ...

    def store_mask(self, aligned_len: int, start_token: int = 0) -> Masks: ...

    def lookup_mask(self, aligned_len: int) -> Masks | None:
        """``None`` if the engine has no lookup mask."""

    def local_hit(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[Key]) -> int | None:
        """The engine's own local hybrid coordinator's hit over a pool holding exactly
        ``exists``; ``None`` if the engine has none."""


# -- steps ---------------------------------------------------------------------------------
@attrs.frozen
class StoreSetup:
    """Configure the engine; the prompts later steps refer to by index.

    ``eagle_groups`` marks draft groups; ``partial`` turns on partial hash hits (engines
    that support them only)."""

    primary_rule = "KV-EXT-001"

    groups: tuple[GroupDesc, ...]
    hash_block_size: int
    use_eagle: bool
    eagle_groups: tuple[bool, ...]
    prompts: tuple[tuple[int, ...], ...]
    partial: bool = False

    @property
    def scheduler_block_size(self) -> int:
        return hybrid_spec.scheduler_block_size(tuple(size for _, size, _ in self.groups))

    def config(self) -> ExternalStoreConfig:
        return ExternalStoreConfig(tuple(_kv_spec(g) for g in self.groups), self.hash_block_size,
                                   self.use_eagle, self.eagle_groups)


@attrs.frozen
class Store:
    """A request of ``prompt`` writes what ``store_mask(aligned_len)`` marks."""

    primary_rule = "KV-EXT-005"

    prompt: int
    aligned_len: int


@attrs.frozen
class Put:
    """The store gains group ``group``'s keys at these hash indices of ``prompt``."""

    primary_rule = "KV-EXT-001"

    prompt: int
    group: int
    hash_indices: tuple[int, ...]


@attrs.frozen
class Evict:
    """The store loses these keys: positions in the sorted key list, modulo its length."""

    primary_rule = "KV-EXT-001"

    picks: tuple[int, ...]


@attrs.frozen
class LookUp:
    primary_rule = "KV-EXT-001"

    prompt: int
    max_length: int | None = None


def _hashes(setup: StoreSetup, prompt: int) -> tuple[bytes, ...]:
    return extend_block_hashes((), setup.prompts[prompt], setup.hash_block_size, None)


class ReferenceExternalStore:
    """kvoracle's reference store coordinator behind :class:`ExternalStoreAdapter`."""

    name = "reference"
    supports_partial_hash_hits = False
    coordinator_class: type[ExternalStoreCoordinator] = ExternalStoreCoordinator

    def __init__(self) -> None:
        self.coordinator: ExternalStoreCoordinator | None = None

    def version(self) -> str:
        return __version__

    def configure(self, setup: StoreSetup) -> None:
        self.coordinator = self.coordinator_class(setup.config())

    def lookup(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[Key]
               ) -> tuple[Masks, int]:
        assert self.coordinator is not None
        pool = ExternalCachedBlockPool(self.coordinator.config.hash_block_size, exists)
        masks, hit = self.coordinator.find_longest_cache_hit(block_hashes, max_length, pool)
        return tuple(tuple(m) for m in masks), hit

    def load_mask(self, block_hashes: Sequence[bytes], token_len: int) -> Masks:
        assert self.coordinator is not None
        return tuple(tuple(m) for m in self.coordinator.load_mask(block_hashes, token_len))

    def store_mask(self, aligned_len: int, start_token: int = 0) -> Masks:
        assert self.coordinator is not None
        return tuple(tuple(m) for m in self.coordinator.store_mask(aligned_len, start_token))

    def lookup_mask(self, aligned_len: int) -> Masks | None:
        assert self.coordinator is not None
        return tuple(tuple(m) for m in self.coordinator.lookup_mask(aligned_len))

    def local_hit(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[Key]) -> int | None:
        return None  # the reference's hit is the local loop's by construction


# -- generation ----------------------------------------------------------------------------
# Strategies are kept, built once per shape (why: hybrid_lookup's ``kept``).
@kept
def _hybrids(eagle: bool | None) -> st.SearchStrategy:
    return hybrid_setups(eagle=eagle)


@st.composite
def store_setups(draw: st.DrawFn, partial: bool = False, eagle: bool | None = None) -> StoreSetup:
    """Hybrid configurations (hybrid_lookup's generator) with EAGLE marks, or -- for engines
    with partial hash hits -- full attention and Mamba with Mamba blocks above the hash block.
    ``eagle`` fixes EAGLE on or off (partial-hit models have it off) instead of drawing it."""
    if partial and not eagle and draw(st.booleans(), label="partial"):
        hash_size = draw(st.sampled_from([1, 2, 4]), label="hash_block_size")
        block = hash_size * draw(st.sampled_from([2, 3, 4]), label="blocks per hash")
        groups: tuple[GroupDesc, ...] = ((hybrid_spec.FULL, block, 0), (hybrid_spec.MAMBA, block, 0))
        if draw(st.booleans(), label="fine full group"):
            groups = (*groups, (hybrid_spec.FULL, hash_size, 0))
        tokens = st.lists(st.integers(0, 3), min_size=1, max_size=5 * block)
        prefix = draw(tokens)
        prompts = tuple(tuple(prefix + draw(tokens)) for _ in range(draw(st.integers(1, 3))))
        return StoreSetup(groups, hash_size, False, tuple(False for _ in groups), prompts, partial=True)
    hybrid = draw(_hybrids(eagle))
    if hybrid.use_eagle and draw(st.integers(0, 5), label="marked mamba") == 0:
        # Full attention and a marked Mamba group, both at the hash block, so the alignment is
        # one block and equals the attention groups' EAGLE look-ahead. The store writes no Mamba
        # chunk (KV-EXT-008); put ones sit at most block ends, so where full attention's run
        # stops at a missing key a Mamba state usually waits one block past the verified hit,
        # which only a Mamba lookup widened by that look-ahead would take. Among the drawn
        # hybrids below, one or two EAGLE setups in a hundred had this shape.
        size = hybrid.hash_block_size
        return StoreSetup(((hybrid_spec.FULL, size, 0), (hybrid_spec.MAMBA, size, 0)), size, True,
                          (draw(st.booleans(), label="full attention marked"), True), hybrid.prompts)
    if len(hybrid.groups) > 1 and draw(st.integers(0, 1 if hybrid.use_eagle else 5), label="one spec group") == 0:
        # Several KV-cache groups sharing one spec (a target and a draft group): the store
        # looks the spec group up once, without the EAGLE look-ahead (KV-EXT-013), which a
        # Mamba group never has.
        shared = draw(st.sampled_from([g for g in hybrid.groups if g[0] != hybrid_spec.MAMBA] or hybrid.groups),
                      label="shared spec")
        hybrid = attrs.evolve(hybrid, groups=(shared,) * len(hybrid.groups))
    if draw(st.integers(0, 2 if hybrid.use_eagle else 3), label="window of 1") == 0:
        # Windows of 1: never stored without EAGLE (KV-EXT-011); with EAGLE their hits read no
        # block, which load_mask must not ask for (KV-EXT-014). Without a window the last
        # group becomes one.
        groups = tuple((kind, size, 1 if kind == hybrid_spec.SLIDING_WINDOW else param)
                       for kind, size, param in hybrid.groups)
        if len(groups) > 1 and not any(kind == hybrid_spec.SLIDING_WINDOW for kind, _, _ in groups):
            groups = (*groups[:-1], (hybrid_spec.SLIDING_WINDOW, groups[-1][1], 1))
        windows = [g for g in groups if g[0] == hybrid_spec.SLIDING_WINDOW]
        if hybrid.use_eagle and windows and draw(st.booleans(), label="full and window of 1"):
            # Full attention and the window alone: the loop's single pass leaves the window's
            # EAGLE drop in place (KV-HYB-005), so its hit reads no block; after a second pass
            # its last lookup has no drop and reads the block before the hit.
            full = next((g for g in groups if g[0] == hybrid_spec.FULL), (hybrid_spec.FULL, hybrid.hash_block_size, 0))
            groups = (full, windows[0])
        hybrid = attrs.evolve(hybrid, groups=groups)
    if hybrid.use_eagle and any(kind == hybrid_spec.MAMBA for kind, _, _ in hybrid.groups) and any(
            size != hybrid.hash_block_size for _, size, _ in hybrid.groups) and draw(
            st.booleans(), label="mamba eagle margin"):
        # With EAGLE, every group at the Mamba block: only there is a Mamba state one block past
        # the attention-verified hit an aligned boundary, which a Mamba group looked up with
        # the other groups' EAGLE look-ahead would take.
        hybrid = attrs.evolve(hybrid, groups=tuple((kind, hybrid.hash_block_size, param)
                                                   for kind, _, param in hybrid.groups))
    if hybrid.use_eagle and draw(st.integers(0, 4), label="re-verified window") == 0:
        # A marked window of a block or two beside an unmarked, much wider one, every group at the
        # hash block. Past a gap (the store's gap opening) the marked window accepts the candidate
        # with its drop, then the wide window's run reaches back into the gap and shrinks the hit
        # to the gap's start; a group without the drop shrank it, so on the next pass the marked
        # window must be looked up with its drop again, and there its peek block is in the gap.
        size = hybrid.hash_block_size
        verified = (hybrid_spec.SLIDING_WINDOW, size, draw(st.integers(1, 2 * size + 1), label="verified window"))
        wide = (hybrid_spec.SLIDING_WINDOW, size, size * draw(st.integers(4, 8), label="wide window blocks") + 1)
        groups = ((hybrid_spec.FULL, size, 0), verified, wide)
        return StoreSetup(groups, size, True, (draw(st.booleans(), label="full attention marked"), True, False),
                          hybrid.prompts)
    flaggable = [kind != hybrid_spec.CHUNKED_LOCAL for kind, _, _ in hybrid.groups]
    # A draft group needs a second spec group to show which of a spec group's members the
    # store read the mark from: with one spec group the store marks it either way.
    marks = draw(st.sampled_from(["none", "some", "some", "draft"] if len(set(hybrid.groups)) > 1 and any(flaggable)
                                 else ["none", "some", "some"]), label="eagle marks")
    if marks == "draft":
        # A draft model's layers as vLLM lays them out: a KV-cache group of its own, after the
        # target's, sharing a target group's spec, and the only one marked (sometimes with
        # another target group). Its spec group's drop then comes from a member that is not
        # the spec group's first (KV-HYB-002); with EAGLE on, a store that reads only the first
        # member's mark gives every group the drop (no group marked) or that spec group none.
        target = draw(st.sampled_from([g for g, ok in enumerate(flaggable) if ok]), label="drafted group")
        groups = (*hybrid.groups, hybrid.groups[target])
        others = [g for g, ok in enumerate(flaggable) if ok and hybrid.groups[g] != hybrid.groups[target]]
        also = draw(st.sampled_from(others), label="also marked") if others and draw(
            st.booleans(), label="another mark") else None
        flags = tuple(g == len(groups) - 1 or g == also for g in range(len(groups)))
        return StoreSetup(groups, hybrid.hash_block_size, hybrid.use_eagle, flags, hybrid.prompts)
    flags = tuple(ok and marks == "some" and draw(st.booleans(), label="eagle group") for ok in flaggable)
    if marks == "some" and not any(flags) and any(flaggable):
        # "Some" marks at least one group: with EAGLE off only a marked group can show the
        # store's drop (KV-EXT-009).
        first = flaggable.index(True)
        flags = tuple(g == first for g in range(len(flags)))
    return StoreSetup(hybrid.groups, hybrid.hash_block_size, hybrid.use_eagle, flags, hybrid.prompts)


@kept
def _setups(partial: bool, eagle: bool) -> st.SearchStrategy[StoreSetup]:
    return store_setups(partial, eagle=eagle)


@kept
def _bounds(length: int, hashed: int, block: int) -> st.SearchStrategy[int | None]:
    """A lookup's bound: mostly none; or any; or a block or more below the ``hashed`` tokens,
    which leaves room for the EAGLE look-ahead (KV-HYB-007) that a store looking one spec group
    up directly skips (KV-EXT-013)."""
    short = st.integers(0, 2).map(lambda blocks: max(0, hashed - (blocks + 1) * block))
    return st.none() | st.none() | st.integers(0, length) | short


# -- judging -------------------------------------------------------------------------------
def _fmt(masks: Sequence[Sequence[bool]]) -> list[str]:
    return ["".join("x" if m else "." for m in mask) for mask in masks]


def _store_loop(groups: tuple[hybrid_spec.SpecGroup, ...], cached: tuple[tuple[bool, ...], ...], bound: int,
                num_hashed_tokens: int, alignment: int) -> tuple[int, tuple[tuple[int, bool], ...]]:
    """vLLM 0.33.0's store coordinator's hit over the spec groups ``groups`` (flat, with the
    drop it gives them), and each spec group's last lookup ``(bound, drop)``: the local loop,
    except that a single spec group is looked up once at the bound, with its drop and without
    the look-ahead (KV-EXT-013)."""
    if len(groups) == 1:
        kind, size, param, eagle = groups[0]
        return (hybrid_spec.group_hit_length(kind, cached[0], bound, size, param, eagle, alignment),
                ((bound, eagle),))
    result = hybrid_spec.fixed_point(groups, cached, bound, num_hashed_tokens, alignment)
    return result[0], result[4]


class StoreDriver(Driver):
    """Applies steps to the engine and the reference, and judges each answer."""

    suite_name = "external-store"
    fault_rule = "KV-EXT-001"

    def prepare(self) -> None:
        self.model: ExternalStoreCoordinator | None = None
        self.setup: StoreSetup | None = None
        self.exists: set[Key] = set()
        #: What the last answers were, for the picture: operation -> (step number, what was asked,
        #: the reference's answer, the engine's).
        self.answers: dict[str, tuple] = {}

    def picture(self) -> list[dict] | None:
        """The per-group masks of the last store and lookup (``True``: the chunk is written,
        looked up or loaded) and the hit length: the reference's and the engine's."""
        if self.setup is None or self.model is None:
            return None  # (partial hash hits have no reference model to compare with)
        groups = [draw.group_label(g, *group) for g, group in enumerate(self.setup.groups)]
        panels = []
        for name in ("store_mask", "lookup_mask", "lookup", "load_mask"):
            if name not in self.answers:
                continue
            number, asked, want, got = self.answers[name]
            if name == "load_mask":
                want = self.model.load_mask(*want)
            rows = draw.rows_by_position(groups, want, got)
            if name == "lookup":
                rows.append(draw.row("hit tokens", [self.answers["hit"][0]], [self.answers["hit"][1]]))
            now = number == len(self.steps)
            note = "x: the chunk is in the mask, .: it is not" + (
                "; the reference's masks are those of its own hit" if name == "lookup" else "")
            panels.append((not now, draw.panel(f"{name}({asked}) at {'this step' if now else f'step {number}'}",
                                               rows, note)))
        return [drawn for _, drawn in sorted(panels, key=lambda item: item[0])] or None

    def _StoreSetup(self, step: StoreSetup) -> None:
        self.setup = step
        self.exists = set()
        self.model = None if step.partial else ExternalStoreCoordinator(step.config())
        self.new_engine()
        self.call("configure", step)

    def _store_flat(self) -> tuple[hybrid_spec.SpecGroup, ...]:
        """The spec groups with the drop vLLM 0.33.0's store coordinator gives them
        (:func:`~kvoracle.spec.external_store.store_eagle_groups`, KV-EXT-009)."""
        assert self.model is not None
        model = self.model
        drop = spec.store_eagle_groups(model.config.flags, model.config.use_eagle)
        return tuple((kind, size, param, kind != hybrid_spec.CHUNKED_LOCAL and any(drop[g] for g in group.group_ids))
                     for (kind, size, param, _), group in zip(model.flat_groups(), model.spec_groups))

    def _reachable_masks(self, flat: tuple[hybrid_spec.SpecGroup, ...], aligned: int, lookup: bool) -> Masks:
        """Per KV-cache group, the store mask (or lookup mask) of ``aligned`` tokens with the
        spec groups ``flat``."""
        assert self.model is not None and self.setup is not None
        out = []
        for g in range(len(self.setup.groups)):
            kind, size, param, eagle = flat[self.model._group_of(g)]
            end = aligned // size
            out.append(spec.lookup_mask(kind, size, param, eagle, self.model.alignment, end) if lookup
                       else spec.store_mask(kind, size, param, eagle, self.model.alignment, 0, end))
        return tuple(out)

    def _hit_masks(self, last: tuple[tuple[int, bool], ...], hit: int) -> Masks:
        """Per KV-cache group, the non-null entries of a ``hit``-token hit whose spec groups
        were last looked up with ``last`` (bound, drop) (KV-HYB-013)."""
        assert self.model is not None and self.setup is not None
        return tuple(self.model.group_load_mask(g, hit, last[self.model._group_of(g)][1])
                     for g in range(len(self.setup.groups)))

    def _Put(self, step: Put) -> None:
        assert self.setup is not None
        hashes = _hashes(self.setup, step.prompt)
        self.exists |= {(step.group, hashes[i]) for i in step.hash_indices if i < len(hashes)}

    def _Evict(self, step: Evict) -> None:
        keys = sorted(self.exists)
        if keys:
            self.exists -= {keys[pick % len(keys)] for pick in step.picks}

    def _Store(self, step: Store) -> None:
        assert self.setup is not None and self.engine is not None and self.model is not None
        check = self.verdicts.check
        setup, model = self.setup, self.model
        hashes = _hashes(setup, step.prompt)
        aligned = step.aligned_len
        got = self.call("store_mask", aligned, rule="KV-EXT-005")
        want = tuple(tuple(m) for m in model.store_mask(aligned))
        self.answers["store_mask"] = (len(self.steps), aligned, want, got)
        check("KV-EXT-005", len(got) == len(setup.groups),
              lambda: f"store_mask answered {len(got)} groups for {len(setup.groups)}")
        for g, (kind, _, _) in enumerate(setup.groups):
            if kind == hybrid_spec.MAMBA:
                check("KV-EXT-008", not any(got[g]), lambda g=g: f"store_mask({aligned}) writes Mamba group "
                      f"{g}'s chunks {_fmt([got[g]])[0]}")
        store_flat = self._store_flat()
        if store_flat != model.flat_groups():  # KV-EXT-009: the masks of the store's drop
            dropped = self._reachable_masks(store_flat, aligned, lookup=False)
            if dropped != want:
                check("KV-EXT-009", got != dropped,
                      lambda: f"store_mask({aligned}) is {_fmt(got)}, the mask with the EAGLE drop in the marked "
                              f"groups {list(setup.eagle_groups)} although EAGLE is off; want {_fmt(want)} "
                              f"(groups {list(setup.groups)}, scheduler block {setup.scheduler_block_size})")
        check("KV-EXT-005", got == want,
              lambda: f"store_mask({aligned}) is {_fmt(got)}; want {_fmt(want)} (groups {list(setup.groups)}, "
                      f"scheduler block {setup.scheduler_block_size}, EAGLE groups {model.group_eagle})")
        lookup = self.call("lookup_mask", aligned, rule="KV-EXT-007")
        if lookup is not None:
            want_lookup = tuple(tuple(m) for m in model.lookup_mask(aligned))
            self.answers["lookup_mask"] = (len(self.steps), aligned, want_lookup, lookup)
            if store_flat != model.flat_groups():
                dropped = self._reachable_masks(store_flat, aligned, lookup=True)
                if dropped != want_lookup:
                    check("KV-EXT-009", lookup != dropped,
                          lambda: f"lookup_mask({aligned}) is {_fmt(lookup)}, the mask with the EAGLE drop in the "
                                  f"marked groups {list(setup.eagle_groups)} although EAGLE is off; want "
                                  f"{_fmt(want_lookup)}")
            check("KV-EXT-007", lookup == want_lookup,
                  lambda: f"lookup_mask({aligned}) is {_fmt(lookup)}; want {_fmt(want_lookup)}")
        written = model.store_keys(hashes, got)
        flat = model.flat_groups()
        window_one = [kind == hybrid_spec.SLIDING_WINDOW and param == 1 and not eagle
                      for kind, _, param, eagle in flat]
        for g in range(len(setup.groups)):
            if window_one[model._group_of(g)]:
                check("KV-EXT-011", not any(got[g]), lambda g=g: f"store_mask({aligned}) writes chunks "
                      f"{_fmt([got[g]])[0]} of group {g}, a sliding window of 1")
        alignment = setup.scheduler_block_size
        fine_eagle_window = any(kind == hybrid_spec.SLIDING_WINDOW and eagle and size != alignment
                                for kind, size, _, eagle in flat)
        if fine_eagle_window:  # the engine shows KV-EXT-012 when its store mask is the spec's
            check("KV-EXT-012", got == want, "")
        elif not any(kind == hybrid_spec.MAMBA for kind, _, _ in setup.groups) and not any(window_one):
            pool = ExternalCachedBlockPool(setup.hash_block_size, written)
            stored = tuple(flags[:aligned // size] for flags, (_, size, _, _) in
                           zip(model.existence_flags(hashes, pool), flat))
            check("KV-EXT-006", spec.store_is_sufficient(flat, stored, aligned, setup.scheduler_block_size),
                  lambda: f"a store holding exactly store_mask({aligned}) = {_fmt(got)} misses an aligned "
                          f"hit a fully stored prompt serves; spec groups {list(flat)}")
        self.exists |= written

    def _LookUp(self, step: LookUp) -> None:
        assert self.setup is not None and self.engine is not None
        setup = self.setup
        check = self.verdicts.check
        hashes = _hashes(setup, step.prompt)
        bound = len(setup.prompts[step.prompt]) - 1 if step.max_length is None else step.max_length
        exists = frozenset(self.exists)
        masks, hit = self.call("lookup", hashes, bound, exists, rule="KV-EXT-001")
        detail = (f"prompt of {len(setup.prompts[step.prompt])} tokens, bound {bound}, groups "
                  f"{list(setup.groups)}, hash block {setup.hash_block_size}")
        # A hit no lookup can find (off a hash boundary, or past the prompt's hashes) is the engine's
        # wrong answer, charged here: the chunk keys below are read only for hits on a boundary.
        on_boundary = 0 <= hit <= len(hashes) * setup.hash_block_size and hit % setup.hash_block_size == 0
        check("KV-EXT-001", on_boundary,
              lambda: f"hit {hit}: not a multiple of the hash block within the prompt's "
                      f"{len(hashes) * setup.hash_block_size} hashed tokens; {detail}")
        if not on_boundary:
            return
        check("KV-EXT-003", len(masks) == len(setup.groups)
              and all(len(m) == cdiv(hit, size) for m, (_, size, _) in zip(masks, setup.groups)),
              lambda: f"hit {hit}: masks of lengths {[len(m) for m in masks]}; want cdiv({hit}, block size) "
                      f"per group; {detail}")
        for g, mask in enumerate(masks):
            kind, size, _ = setup.groups[g]
            present = tuple((g, hashes[spec.chunk_key_index(i, size, setup.hash_block_size, hit)]) in exists
                            for i in range(len(mask)))
            inside = hit // size
            if setup.partial and kind == hybrid_spec.FULL and hit % size and mask[inside]:
                # KV-EXT-010: the hit ends inside a chunk that the group holds under a later hash
                # boundary of the chunk (its end, or the prompt's last hash inside it).
                later = [i for i in range(hit // setup.hash_block_size,
                                          min((inside + 1) * size // setup.hash_block_size, len(hashes)))
                         if (g, hashes[i]) in exists]
                if later:
                    check("KV-EXT-010", present[inside],
                          lambda g=g, size=size, inside=inside, later=later:
                          f"hit {hit} ends inside chunk {inside} of full-attention group {g} (block size {size}): "
                          f"the store holds the chunk under its key at {(later[-1] + 1) * setup.hash_block_size} "
                          f"tokens but not at the hit's end, the key a load fetches it by -- the group was found "
                          f"at the longer boundary and trimmed to a shorter one; {detail}")
            check("KV-EXT-002", spec.is_loadable(tuple(mask), present),
                  lambda g=g, mask=mask, present=present, size=size:
                  f"hit {hit}: group {g} (block size {size}) asks for chunks {_fmt([mask])[0]} but the store "
                  f"holds only {_fmt([present])[0]} of their keys; {detail}")
        if self.model is not None:
            model = self.model
            want_masks, want = model.find_longest_cache_hit(
                hashes, bound, ExternalCachedBlockPool(setup.hash_block_size, exists))
            self.answers["lookup"] = (len(self.steps), f"prompt {step.prompt}, bound {bound}",
                                      tuple(tuple(m) for m in want_masks), masks)
            self.answers["hit"] = (want, hit)
            flat = model.flat_groups()
            cached = model.existence_flags(hashes, ExternalCachedBlockPool(setup.hash_block_size, exists))
            hashed, alignment = len(hashes) * setup.hash_block_size, model.alignment
            store_flat = self._store_flat()
            if store_flat != flat:
                # KV-EXT-009: the store's drop in the marked groups, looked up by the store's loop
                # or by the local one (whose look-ahead vLLM 0.20 to 0.31 capped at the bound).
                for alt in {_store_loop(store_flat, cached, bound, hashed, alignment)[0],
                            hybrid_spec.fixed_point(store_flat, cached, bound, hashed, alignment)[0],
                            hybrid_spec.fixed_point(store_flat, cached, bound, hashed, alignment,
                                                    margin_cap="max_length")[0]} - {want}:
                    check("KV-EXT-009", hit != alt,
                          lambda alt=alt: f"hit {alt}, the hit with the EAGLE drop in the marked groups "
                                  f"{list(setup.eagle_groups)} although EAGLE is off; the local hybrid loop over "
                                  f"the store's keys answers {want}; spec groups {list(flat)}, stored "
                                  f"{_fmt(cached)}; {detail}")
            elif len(flat) == 1 and len(setup.groups) > 1 and flat[0][3]:
                alt = _store_loop(flat, cached, bound, hashed, alignment)[0]
                if alt != want:
                    check("KV-EXT-013", hit != alt,
                          lambda: f"hit {hit}, the spec group's own lookup at the bound without the EAGLE "
                                  f"look-ahead; the local hybrid loop over the store's keys (looking the "
                                  f"group up {flat[0][1]} tokens past the candidate) answers {want}; spec group "
                                  f"{flat[0]} of {len(setup.groups)} KV-cache groups, stored {_fmt(cached)}; "
                                  f"{detail}")
            if setup.use_eagle:
                # The store's copy of the loop with the EAGLE look-ahead capped at the bound, as the
                # local one of vLLM 0.20 to 0.31: KV-HYB-007's difference, not the store's own.
                capped = (hybrid_spec.fixed_point(flat, cached, bound, hashed, alignment, margin_cap="max_length")[0]
                          if hit != want else None)
                check("KV-HYB-007", hit != capped,
                      lambda: f"hit {hit}, the hit of the loop whose EAGLE look-ahead is capped at the bound; "
                              f"the local hybrid loop over the store's keys answers {want}; spec groups "
                              f"{list(flat)}, stored {_fmt(cached)}; {detail}")
            check("KV-EXT-001", hit == want,
                  lambda: f"hit {hit}; the local hybrid loop over the store's keys answers {want}; spec groups "
                          f"{list(flat)}, stored {_fmt(cached)}; {detail}")
            _, last_local = model.local_loop(hashes, bound, ExternalCachedBlockPool(setup.hash_block_size, exists))
            at_hit = self._hit_masks(last_local, hit)
            reads_none = tuple(spec.reads_no_block(kind, param, last_local[model._group_of(g)][1])
                               for g, (kind, _, param) in enumerate(setup.groups))
            loop_inputs = (cached, bound, hashed, hit, masks, at_hit, detail)
            if store_flat != flat and hit % alignment == 0:
                self._judge_store_loop_masks("KV-EXT-009", store_flat, *loop_inputs, what=(
                    f"the null entries of lookups with the EAGLE drop in the marked groups "
                    f"{list(setup.eagle_groups)} although EAGLE is off"))
            elif len(flat) == 1 and len(setup.groups) > 1 and flat[0][3] and hit % alignment == 0:
                self._judge_store_loop_masks("KV-EXT-013", flat, *loop_inputs, what=(
                    f"the null entries of the spec group's own lookup at the bound (with the EAGLE drop, "
                    f"without the look-ahead), spec group {flat[0]} of {len(setup.groups)} KV-cache groups"))
            check("KV-EXT-003", hit % alignment != 0 or masks == at_hit,
                  lambda: f"hit {hit}: load masks {_fmt(masks)}; the groups' load masks at {hit} are "
                          f"{_fmt(at_hit)}; {detail}")
        local = self.call("local_hit", hashes, bound, exists, rule="KV-EXT-001")
        if local is not None:
            check("KV-EXT-001", hit == local,
                  lambda: f"the store coordinator answers {hit}, the engine's own local hybrid coordinator "
                          f"over a pool holding the same keys answers {local}; EAGLE on: {setup.use_eagle}, "
                          f"EAGLE groups {list(setup.eagle_groups)}; {detail}")
        loaded = self.call("load_mask", hashes, hit, rule="KV-EXT-004")
        # (the reference's load mask at the engine's hit is drawn only for a picture)
        self.answers["load_mask"] = (len(self.steps), f"prompt {step.prompt}, {hit}", (hashes, hit), loaded)
        if self.model is None:
            reads_none = tuple(False for _ in setup.groups)
        if hit and len(loaded) == len(setup.groups):
            self._judge_window_one_loads(loaded, hit, reads_none, detail)
        check("KV-EXT-004", len(loaded) == len(setup.groups) and all(
            len(m) == cdiv(hit, size) and (hit == 0 or m[-1] or kind == hybrid_spec.CHUNKED_LOCAL or none)
            for m, (kind, size, _), none in zip(loaded, setup.groups, reads_none)),
              lambda: f"load_mask(hashes, {hit}) is {_fmt(loaded)}: it does not cover the whole hit (an "
                      f"EAGLE block dropped again?); {detail}")
        check("KV-EXT-003", loaded == masks,
              lambda: f"load_mask(hashes, {hit}) is {_fmt(loaded)}, the lookup's masks {_fmt(masks)}; {detail}")


    def _judge_store_loop_masks(self, rule_id: str, groups: tuple[hybrid_spec.SpecGroup, ...],
                                cached: tuple[tuple[bool, ...], ...], bound: int, hashed: int, hit: int,
                                masks: Masks, at_hit: Masks, detail: str, what: str) -> None:
        """A named difference in the lookup's masks: where vLLM 0.33.0's store loop over
        ``groups`` answers the same hit, its last lookups leave other null entries than the
        local loop's, and the engine's masks are exactly those (KV-EXT-009, KV-EXT-013)."""
        assert self.model is not None
        alt, last = _store_loop(groups, cached, bound, hashed, self.model.alignment)
        other = self._hit_masks(last, hit) if alt == hit else at_hit
        if other != at_hit:
            self.verdicts.check(rule_id, masks != other, lambda: (
                f"hit {hit}: load masks {_fmt(masks)}, {what}; the local loop's last lookups leave "
                f"{_fmt(at_hit)}; {detail}"))

    def _judge_window_one_loads(self, loaded: Masks, hit: int, reads_none: tuple[bool, ...], detail: str) -> None:
        """KV-EXT-014: an EAGLE window of 1 whose last lookup dropped its peek block (its hit
        reads no block), and whose ``load_mask`` asks for the block before the hit: the mask
        recomputed without the drop."""
        assert self.setup is not None
        for g, (kind, size, param) in enumerate(self.setup.groups):
            if not reads_none[g] or len(loaded[g]) != hit // size:
                continue
            undropped = spec.load_mask(kind, size, param, hit)
            self.verdicts.check("KV-EXT-014", tuple(loaded[g]) != undropped, lambda g=g, size=size: (
                f"load_mask(hashes, {hit}) asks group {g} (an EAGLE sliding window of 1, block size {size}) for "
                f"chunks {_fmt([loaded[g]])[0]}: the block before the hit, which its lookup never checked "
                f"(it checked only the peek block past the hit and dropped it); the group's hit reads no "
                f"block; {detail}"))


def _re_verified_window(setup: StoreSetup) -> bool:
    """The shape :func:`store_setups` draws as "re-verified window": EAGLE, full attention, a
    marked window and an unmarked one."""
    kinds = tuple(kind for kind, _, _ in setup.groups)
    return (setup.use_eagle and kinds == (hybrid_spec.FULL, hybrid_spec.SLIDING_WINDOW, hybrid_spec.SLIDING_WINDOW)
            and setup.eagle_groups[1:] == (True, False))


def _gap_shape(setup: StoreSetup) -> bool:
    """EAGLE with a Mamba group, or with a loop of several passes (no single full-attention
    pass) in which a sliding window can be verified again after another group shrinks the hit."""
    if setup.partial or not setup.use_eagle:
        return False
    kinds = [kind for kind, _, _ in set(setup.groups) if kind != hybrid_spec.FULL]
    return hybrid_spec.MAMBA in kinds or (len(kinds) > 1 and hybrid_spec.SLIDING_WINDOW in kinds)


class ExternalStoreMachine(SuiteMachine):
    """Stores, puts, evictions and lookups over one generated configuration."""

    driver: StoreDriver
    #: Whether the engine supports partial hash hits (set from the adapter when bound).
    partial: bool = False
    # EAGLE on and off, each given --max-examples: EAGLE's look-ahead and drop make most of the
    # store's shapes (draft marks, Mamba margins, re-verified windows, windows of 1, one spec
    # group), which a drawn flag gave half the examples.
    parts = PARTS

    def __init__(self) -> None:
        super().__init__()
        self.touched: list[int] = []

    @initialize(data=st.data())
    def configure(self, data: st.DataObject) -> None:
        part = self.draw_part(data)
        self.driver.apply(data.draw(_setups(type(self).partial, part == EAGLE_ON), label="setup"))
        if self._alive() and self.driver.setup.partial and data.draw(st.integers(0, 2), label="first put"):
            # Partial hash hits: most examples start from keys at arbitrary hash boundaries of one
            # prompt in every group, looked up at once (a hit the groups trim to a boundary one
            # of them lacks, KV-EXT-010).
            self.put(data)
            self.driver.apply(LookUp(self.touched[-1], None))
        elif self._alive() and _gap_shape(self.driver.setup) and self._takes_gap(data):
            self._gap(data)
        elif self._alive() and not self.driver.setup.partial and data.draw(st.integers(0, 2), label="first store"):
            # Most examples start from a stored prompt, so that even short ones judge a store
            # mask and look something up that the store holds: half of them at once, at the
            # prompt's bound or a segment short of what was stored (with EAGLE, a group finer
            # than the alignment finds its peek block only inside the stored segments).
            stored = self._store(data)
            if data.draw(st.booleans(), label="first lookup"):
                alignment = self.driver.setup.scheduler_block_size
                bound = data.draw(st.sampled_from([None, max(0, stored.aligned_len - alignment)]),
                                  label="first bound")
                self.driver.apply(LookUp(stored.prompt, bound))

    def _takes_gap(self, data: st.DataObject) -> bool:
        """One gap shape in three opens with a gap; the re-verified window shape two in three (its
        re-check past the gap is why it is drawn, store.hit.keeps-eagle-verified), by one draw."""
        gap = data.draw(st.integers(0, 2), label="gap")
        return gap != 0 if _re_verified_window(self.driver.setup) else gap == 0

    def _gap(self, data: st.DataObject) -> None:
        """A stored prompt, Mamba states at every block end (a Mamba group looked up past the
        verified hit takes one, KV-EXT-001/-003), a gap of one aligned segment near the end in
        every group but full attention, and a lookup (see :func:`_gap_shape`)."""
        setup = self.driver.setup
        stored = self._store(data)
        hashes = _hashes(setup, stored.prompt)
        for g, (kind, size, _) in enumerate(setup.groups):
            if kind == hybrid_spec.MAMBA:
                per = size // setup.hash_block_size
                self.driver.apply(Put(stored.prompt, g, tuple(range(per - 1, len(hashes), per))))
        alignment = setup.scheduler_block_size
        segments = stored.aligned_len // alignment
        if segments and self._alive():
            # Near the end: a window verified past the gap with its drop, and a group whose run
            # reaches back into the gap, which shrinks the hit to the gap's start.
            segment = max(0, segments - 1 - data.draw(st.integers(1, 3), label="gap segments from the end"))
            holed = [g for g, (kind, _, _) in enumerate(setup.groups) if kind != hybrid_spec.FULL]
            per = alignment // setup.hash_block_size
            doomed = {(g, hashes[i]) for g in holed for i in range(segment * per, (segment + 1) * per)}
            keys = sorted(self.driver.exists)
            picks = tuple(n for n, key in enumerate(keys) if key in doomed)
            if picks:
                self.driver.apply(Evict(picks))
        if self._alive():
            self.driver.apply(LookUp(stored.prompt, None))

    def _alive(self) -> bool:
        return self.driver.setup is not None and not self.driver.dead

    def _prompt(self, data: st.DataObject) -> int:
        setup = self.driver.setup
        return data.draw(st.sampled_from(self.touched) if self.touched and data.draw(st.booleans())
                         else st.integers(0, len(setup.prompts) - 1), label="prompt")

    @precondition(lambda self: self._alive() and not self.driver.setup.partial)
    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        self._store(data)

    def _store(self, data: st.DataObject) -> Store:
        setup = self.driver.setup
        prompt = self._prompt(data)
        alignment = setup.scheduler_block_size
        most = len(setup.prompts[prompt]) // alignment
        self.touched.append(prompt)
        step = Store(prompt, alignment * data.draw(st.integers(0, most), label="segments"))
        self.driver.apply(step)
        return step

    @precondition(_alive)
    @rule(data=st.data())
    def put(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        prompt = self._prompt(data)
        self.touched.append(prompt)
        num_hashes = len(setup.prompts[prompt]) // setup.hash_block_size
        for group, (_, size, _) in enumerate(setup.groups):
            per = size // setup.hash_block_size
            if setup.partial:  # keys at any hash boundary, block ends included
                indices = [i for i in range(num_hashes) if data.draw(st.booleans(), label="key")]
            else:  # the block ends, most of them present
                flags = data.draw(st.lists(MOSTLY_TRUE, min_size=num_hashes // per, max_size=num_hashes // per),
                                  label="chunks")
                indices = [(j + 1) * per - 1 for j, keep in enumerate(flags) if keep]
            self.driver.apply(Put(prompt, group, tuple(indices)))

    @precondition(lambda self: self._alive() and bool(self.driver.exists))
    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4).map(tuple))
    def evict(self, picks: tuple[int, ...]) -> None:
        self.driver.apply(Evict(picks))

    @precondition(_alive)
    @rule(data=st.data())
    def look_up(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        prompt = self._prompt(data)
        length = len(setup.prompts[prompt])
        hashed = length // setup.hash_block_size * setup.hash_block_size
        bound = data.draw(_bounds(length, hashed, setup.scheduler_block_size), label="bound")
        self.driver.apply(LookUp(prompt, bound))

    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead

    def closing_steps(self) -> list[object]:
        # Every prompt stored or put looked up once more, unbounded: with swarm rule selection
        # about half the examples judged only their first lookup, if any (on seed 0, 45 of 172
        # looked nothing up).
        return [LookUp(prompt, None) for prompt in dict.fromkeys(self.touched)] if self._alive() else []


_MASKS = returns.mask_groups

#: The external-store suite, registered with the harness.
EXTERNAL_STORE = register_suite(SuiteDef(
    name="external-store",
    title="an external KV store's (Mooncake) hit, load and store masks",
    operations=("configure", "lookup", "load_mask", "store_mask", "lookup_mask", "local_hit"),
    returns={"lookup": returns.tuple_of(_MASKS, returns.integer), "load_mask": _MASKS,
             "store_mask": _MASKS, "lookup_mask": returns.optional(_MASKS),
             "local_hit": returns.optional(returns.integer)},
    driver=StoreDriver, machine=ExternalStoreMachine, module=__name__,
    step_names=("Evict", "LookUp", "Put", "Store", "StoreSetup"),
    engines={"reference": f"{__name__}:ReferenceExternalStore",
             "vllm": "kvoracle.conformance.engines.vllm_mooncake:VllmMooncakeStore"},
    machine_options=lambda probe: {"partial": bool(getattr(probe, "supports_partial_hash_hits", False)),
                                   "parts": PARTS},
    exclusions=lambda probe: {} if getattr(probe, "supports_partial_hash_hits", False) else {
        "KV-EXT-010": "the engine has no partial hash hits (supports_partial_hash_hits), the only "
                      "configurations where a hit ends inside a block"}))
