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

Engines that support vLLM's partial hash hits (``supports_partial_hash_hits``)
also get full-attention + Mamba configurations with Mamba blocks larger than
the hash block; the reference does not model them, so there only the checks
that need no reference are made: KV-EXT-002, KV-EXT-004 and the differential
KV-EXT-001.

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

from .harness import returns
from .harness.driver import Driver
from .harness.machine import SuiteMachine
from .harness.suites import SuiteDef, register_suite
from .hybrid_lookup import MOSTLY_TRUE, GroupDesc, _kv_spec, hybrid_setups

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
@st.composite
def store_setups(draw: st.DrawFn, partial: bool = False) -> StoreSetup:
    """Hybrid configurations (hybrid_lookup's generator) with EAGLE marks, or -- for engines
    with partial hash hits -- full attention and Mamba with Mamba blocks above the hash block."""
    if partial and draw(st.booleans(), label="partial"):
        hash_size = draw(st.sampled_from([1, 2, 4]), label="hash_block_size")
        block = hash_size * draw(st.sampled_from([2, 3, 4]), label="blocks per hash")
        groups: tuple[GroupDesc, ...] = ((hybrid_spec.FULL, block, 0), (hybrid_spec.MAMBA, block, 0))
        if draw(st.booleans(), label="fine full group"):
            groups = (*groups, (hybrid_spec.FULL, hash_size, 0))
        tokens = st.lists(st.integers(0, 3), min_size=1, max_size=5 * block)
        prefix = draw(tokens)
        prompts = tuple(tuple(prefix + draw(tokens)) for _ in range(draw(st.integers(1, 3))))
        return StoreSetup(groups, hash_size, False, tuple(False for _ in groups), prompts, partial=True)
    hybrid = draw(hybrid_setups())
    if hybrid.use_eagle:  # KV-EXT-014: window 1 with EAGLE is a named difference, not generated
        hybrid = attrs.evolve(hybrid, groups=tuple(
            (kind, size, 2 if kind == hybrid_spec.SLIDING_WINDOW and param == 1 else param)
            for kind, size, param in hybrid.groups))
    elif draw(st.integers(0, 4), label="window of 1") == 0:  # KV-EXT-011 needs one, outside EAGLE
        hybrid = attrs.evolve(hybrid, groups=tuple(
            (kind, size, 1 if kind == hybrid_spec.SLIDING_WINDOW else param) for kind, size, param in hybrid.groups))
    flaggable = [kind != hybrid_spec.CHUNKED_LOCAL for kind, _, _ in hybrid.groups]
    marks = draw(st.sampled_from(["none", "some", "some"]), label="eagle marks")
    flags = tuple(ok and marks == "some" and draw(st.booleans(), label="eagle group") for ok in flaggable)
    return StoreSetup(hybrid.groups, hybrid.hash_block_size, hybrid.use_eagle, flags, hybrid.prompts)


# -- judging -------------------------------------------------------------------------------
def _fmt(masks: Sequence[Sequence[bool]]) -> list[str]:
    return ["".join("x" if m else "." for m in mask) for mask in masks]


class StoreDriver(Driver):
    """Applies steps to the engine and the reference, and judges each answer."""

    suite_name = "external-store"
    fault_rule = "KV-EXT-001"

    def prepare(self) -> None:
        self.model: ExternalStoreCoordinator | None = None
        self.setup: StoreSetup | None = None
        self.exists: set[Key] = set()

    def _StoreSetup(self, step: StoreSetup) -> None:
        self.setup = step
        self.exists = set()
        self.model = None if step.partial else ExternalStoreCoordinator(step.config())
        self.new_engine()
        self.call("configure", step)

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
        check("KV-EXT-005", len(got) == len(setup.groups),
              lambda: f"store_mask answered {len(got)} groups for {len(setup.groups)}")
        for g, (kind, _, _) in enumerate(setup.groups):
            if kind == hybrid_spec.MAMBA:
                check("KV-EXT-008", not any(got[g]), lambda g=g: f"store_mask({aligned}) writes Mamba group "
                      f"{g}'s chunks {_fmt([got[g]])[0]}")
        check("KV-EXT-005", got == want,
              lambda: f"store_mask({aligned}) is {_fmt(got)}; want {_fmt(want)} (groups {list(setup.groups)}, "
                      f"scheduler block {setup.scheduler_block_size}, EAGLE groups {model.group_eagle})")
        lookup = self.call("lookup_mask", aligned, rule="KV-EXT-007")
        if lookup is not None:
            want_lookup = tuple(tuple(m) for m in model.lookup_mask(aligned))
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
        check("KV-EXT-003", len(masks) == len(setup.groups)
              and all(len(m) == cdiv(hit, size) for m, (_, size, _) in zip(masks, setup.groups)),
              lambda: f"hit {hit}: masks of lengths {[len(m) for m in masks]}; want cdiv({hit}, block size) "
                      f"per group; {detail}")
        for g, mask in enumerate(masks):
            size = setup.groups[g][1]
            present = tuple((g, hashes[spec.chunk_key_index(i, size, setup.hash_block_size, hit)]) in exists
                            for i in range(len(mask)))
            check("KV-EXT-002", spec.is_loadable(tuple(mask), present),
                  lambda g=g, mask=mask, present=present, size=size:
                  f"hit {hit}: group {g} (block size {size}) asks for chunks {_fmt([mask])[0]} but the store "
                  f"holds only {_fmt([present])[0]} of their keys; {detail}")
        if self.model is not None:
            _, want = self.model.find_longest_cache_hit(
                hashes, bound, ExternalCachedBlockPool(setup.hash_block_size, exists))
            flat = self.model.flat_groups()
            cached = self.model.existence_flags(hashes, ExternalCachedBlockPool(setup.hash_block_size, exists))
            check("KV-EXT-001", hit == want,
                  lambda: f"hit {hit}; the local hybrid loop over the store's keys answers {want}; spec groups "
                          f"{list(flat)}, stored {_fmt(cached)}; {detail}")
            at_hit = tuple(self.model.group_load_mask(g, hit) for g in range(len(setup.groups)))
            check("KV-EXT-003", hit % self.model.alignment != 0 or masks == at_hit,
                  lambda: f"hit {hit}: load masks {_fmt(masks)}; the groups' load masks at {hit} are "
                          f"{_fmt(at_hit)}; {detail}")
        local = self.call("local_hit", hashes, bound, exists, rule="KV-EXT-001")
        if local is not None:
            check("KV-EXT-001", hit == local,
                  lambda: f"the store coordinator answers {hit}, the engine's own local hybrid coordinator "
                          f"over a pool holding the same keys answers {local}; EAGLE on: {setup.use_eagle}, "
                          f"EAGLE groups {list(setup.eagle_groups)}; {detail}")
        loaded = self.call("load_mask", hashes, hit, rule="KV-EXT-004")
        check("KV-EXT-004", len(loaded) == len(setup.groups) and all(
            len(m) == cdiv(hit, size) and (hit == 0 or m[-1] or kind == hybrid_spec.CHUNKED_LOCAL)
            for m, (kind, size, _) in zip(loaded, setup.groups)),
              lambda: f"load_mask(hashes, {hit}) is {_fmt(loaded)}: it does not cover the whole hit (an "
                      f"EAGLE block dropped again?); {detail}")
        check("KV-EXT-003", loaded == masks,
              lambda: f"load_mask(hashes, {hit}) is {_fmt(loaded)}, the lookup's masks {_fmt(masks)}; {detail}")


class ExternalStoreMachine(SuiteMachine):
    """Stores, puts, evictions and lookups over one generated configuration."""

    driver: StoreDriver
    #: Whether the engine supports partial hash hits (set from the adapter when bound).
    partial: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.touched: list[int] = []

    @initialize(data=st.data())
    def configure(self, data: st.DataObject) -> None:
        self.driver.apply(data.draw(store_setups(type(self).partial), label="setup"))

    def _alive(self) -> bool:
        return self.driver.setup is not None and not self.driver.dead

    def _prompt(self, data: st.DataObject) -> int:
        setup = self.driver.setup
        return data.draw(st.sampled_from(self.touched) if self.touched and data.draw(st.booleans())
                         else st.integers(0, len(setup.prompts) - 1), label="prompt")

    @precondition(lambda self: self._alive() and not self.driver.setup.partial)
    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        prompt = self._prompt(data)
        alignment = setup.scheduler_block_size
        most = len(setup.prompts[prompt]) // alignment
        self.touched.append(prompt)
        self.driver.apply(Store(prompt, alignment * data.draw(st.integers(0, most), label="segments")))

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
        bound = data.draw(st.none() | st.none() | st.integers(0, len(setup.prompts[prompt])), label="bound")
        self.driver.apply(LookUp(prompt, bound))

    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead


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
    machine_options=lambda probe: {"partial": bool(getattr(probe, "supports_partial_hash_hits", False))}))
