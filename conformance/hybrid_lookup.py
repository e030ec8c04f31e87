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

* KV-HYB-006: every full-attention group has exactly cdiv(hit, block_size) entries;
* KV-MAMBA-002 / KV-HYB-004: no other group's entries reach beyond the hit;
* KV-SWA-001, KV-HYB-007, KV-HYB-003: the hit length equals the spec's fixed point
  (:func:`kvoracle.spec.hybrid.fixed_point`); a wrong hit that is exactly what a scan
  needing cdiv(window, block_size) blocks gives is named KV-SWA-001, otherwise an
  EAGLE configuration names KV-HYB-007 and any other KV-HYB-003;
* KV-HYB-013: null entries where the attention type puts them
  (:func:`kvoracle.spec.hybrid.num_null_hit_blocks`);
* KV-FULL-002: the non-null entries are the reference's block ids (engines that
  allocate in the reference's order, as vLLM does).

The spec's loop is also compared with :func:`~kvoracle.spec.hybrid.declarative_hit`:
where they differ the named divergence (KV-SWA-010, KV-HYB-009, or KV-SWA-003 for
window 1) is what the engine was checked against, and is counted as exercised.

Run it with ``kvoracle check --suite hybrid [--engine reference|vllm|module:Class]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

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
from kvoracle.spec.hashing import extend_block_hashes
from kvoracle.spec.lifecycle import cdiv

from .adapter import Lookup
from .engines import load_engine
from .suite_kit import bind_machine, replay_steps, scoped_verdicts
from .verdicts import Counterexample, KnownFailure, RuleViolation, Verdicts, violation

#: Engines with a hybrid lookup adapter, by the name ``--engine`` accepts.
HYBRID_ENGINES: dict[str, str] = {
    "reference": "kvoracle.conformance.hybrid_lookup:ReferenceHybridLookup",
    "vllm": "kvoracle.conformance.engines.vllm_hybrid:VllmHybridLookup",
}

#: The rules this suite judges; every other rule is "not applicable" in its report.
SCOPE = ("KV-HYB-003", "KV-HYB-004", "KV-HYB-006", "KV-HYB-007", "KV-HYB-009", "KV-HYB-013",
         "KV-SWA-001", "KV-SWA-003", "KV-SWA-010", "KV-MAMBA-002", "KV-FULL-002")
OUT_OF_SCOPE = "not judged by the hybrid lookup suite (see kvoracle check --suite lockstep)"
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


class ReferenceHybridLookup:
    """kvoracle's reference hybrid coordinator behind :class:`HybridLookupAdapter`."""

    name = "reference"
    coordinator_class: type[HybridCoordinator] = HybridCoordinator

    def __init__(self) -> None:
        self.coordinator: HybridCoordinator | None = None

    def version(self) -> str:
        return __version__

    def configure(self, config: HybridConfig) -> None:
        self.coordinator = self.coordinator_class(config)

    def hashes(self, prompt_tokens: Sequence[int]) -> tuple[bytes, ...]:
        assert self.coordinator is not None
        return extend_block_hashes((), tuple(prompt_tokens), self.coordinator.config.hash_block_size, None)

    def seed_cache(self, prompt_tokens: Sequence[int], group_id: int, mask: Sequence[bool]) -> None:
        assert self.coordinator is not None
        self.coordinator.seed_cache(self.hashes(prompt_tokens), group_id, list(mask))

    def lookup(self, prompt_tokens: Sequence[int], max_cache_hit_length: int | None = None) -> Lookup:
        assert self.coordinator is not None
        bound = len(prompt_tokens) - 1 if max_cache_hit_length is None else max_cache_hit_length
        blocks, hit, _ = self.coordinator.find_longest_cache_hit(self.hashes(prompt_tokens), bound)
        return Lookup(tuple(tuple(b.block_id for b in group) for group in blocks), hit)


# -- steps ---------------------------------------------------------------------------------
#: One group, flat: (kind, block size, window or chunk size, 0 if none).
GroupDesc = tuple[str, int, int]


@attrs.frozen
class HybridSetup:
    """Configure both sides; the prompts later steps refer to by index."""

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
    prompt: int
    group: int
    mask: tuple[bool, ...]


@attrs.frozen
class LookUp:
    prompt: int
    max_cache_hit_length: int | None = None


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


@st.composite
def hybrid_setups(draw: st.DrawFn) -> HybridSetup:
    """Valid hybrid configurations (HybridConfig's rules) and prompts that share prefixes.

    Biased towards the states where a coordinator's bugs show: hash block size 1 half the
    time, two or three groups, often every group at the hash block size (the alignment is
    then one block, so the loop can stop on any block and a Mamba group can answer one
    block past the candidate, KV-MAMBA-002), and prompts of several aligned blocks.
    """
    hash_size = draw(st.sampled_from([1, 1, 2, 4]), label="hash_block_size")
    eagle = draw(st.booleans(), label="use_eagle")
    # Sliding windows twice as often: most named loop behaviours (KV-SWA-001/003/010, KV-HYB-009)
    # need one.
    kinds = [*spec.LOOKUP_KINDS, spec.SLIDING_WINDOW] if not eagle else [
        spec.FULL, spec.SLIDING_WINDOW, spec.SLIDING_WINDOW, spec.MAMBA]
    # EAGLE matters only when the loop takes several passes: two groups at least.
    count = draw(st.sampled_from([2, 3, 3, 3, 4] if eagle else [1, 2, 2, 3, 3, 4]), label="num_groups")
    # Every group at the hash block size a third of the time, else mostly small multiples.
    uniform = draw(st.integers(0, 2), label="uniform_block_size") == 0
    drafts = []
    for _ in range(count):
        kind = draw(st.sampled_from(kinds), label="kind")
        scale = 1 if uniform or kind == spec.MAMBA else draw(st.sampled_from([1, 1, 2, 3, 4]), label="scale")
        drafts.append([kind, hash_size * scale, 0])
    if count == 2 and uniform and draw(st.booleans(), label="full_and_other"):
        # Full attention and one other group, one block size: the loop's single pass
        # (KV-HYB-005), in which the other group alone decides the hit -- a Mamba group
        # answering past the candidate (KV-MAMBA-002) or a window scan (KV-SWA-001).
        drafts[0][0] = spec.FULL
        drafts[1][0] = draw(st.sampled_from([k for k in kinds if k != spec.FULL]), label="other kind")
    if count >= 3 and draw(st.integers(0, 2), label="two_full_specs") > 0:
        # Two full-attention spec groups (different block sizes) before others that can
        # shrink the hit: only then can a coordinator forget to trim the second (KV-HYB-006).
        drafts[0][:2] = [spec.FULL, hash_size]
        drafts[1][:2] = [spec.FULL, 2 * hash_size]
        for draft in drafts[2:]:
            if draft[0] == spec.FULL:
                draft[0] = draw(st.sampled_from([k for k in kinds if k != spec.FULL]), label="shrinking kind")
                draft[1] = hash_size if draft[0] == spec.MAMBA else draft[1]
    # Chunked local attention must use the scheduler block size (KV-CHUNK-003).
    others = [size for kind, size, _ in drafts if kind != spec.CHUNKED_LOCAL]
    alignment = _lcm([hash_size, *others]) if others else hash_size * draw(st.sampled_from([1, 2]))
    for draft in drafts:
        if draft[0] == spec.CHUNKED_LOCAL:
            draft[1] = alignment
            draft[2] = alignment * draw(st.integers(1, 3), label="chunk_blocks")
        elif draft[0] == spec.SLIDING_WINDOW:
            # Windows 1..16, often one past a multiple of the block size, where
            # cdiv(window, b) != cdiv(window - 1, b) (KV-SWA-001).
            # Small windows as often: a run of a few blocks is what a mostly cached group has.
            draft[2] = draw(st.integers(1, 16) | st.builds(lambda k, b=draft[1]: b * k + 1, st.integers(0, 4))
                            | st.builds(lambda k, b=draft[1]: b * k + 1, st.integers(0, 2)), label="window")
    groups = tuple(tuple(d) for d in drafts)
    if draw(st.integers(0, 3), label="duplicate_group") == 0:  # equal specs share a spec group (KV-HYB-002)
        groups = (*groups, draw(st.sampled_from(groups)))
    # Prompts: a few prefixes, each extended by random suffixes, so prefixes collide. Hits
    # are multiples of the alignment: prefixes span several aligned blocks, and at least
    # a dozen tokens where the alignment is small.
    tokens = st.integers(0, 3)
    most_blocks = max(4, 12 // alignment)
    prefixes = draw(st.lists(st.integers(1, most_blocks).flatmap(
        lambda k: st.lists(tokens, min_size=k * alignment, max_size=k * alignment + alignment)),
        min_size=1, max_size=3))
    prompts = []
    for _ in range(draw(st.integers(1, 4), label="num_prompts")):
        prefix = draw(st.sampled_from(prefixes))
        suffix = draw(st.lists(tokens, min_size=1, max_size=2 * alignment))
        prompts.append(tuple(prefix + suffix))
    most = max(len(p) for p in prompts) // hash_size
    # A pool that holds every seed, or a small one in which seeding evicts earlier seeds.
    large = max(2, 1 + most * len(groups) * len(prompts) * 2)
    small = st.integers(2, max(3, most + 1))
    num_blocks = draw(st.sampled_from([large, large, large, 0]).flatmap(lambda n: st.just(n) if n else small),
                      label="num_blocks")
    return HybridSetup(groups, hash_size, num_blocks, eagle, tuple(prompts))


def _masks(length: int) -> st.SearchStrategy[tuple[bool, ...]]:
    dense = st.integers(0, length).map(lambda k: (True,) * k)
    sparse = st.lists(st.booleans(), min_size=0, max_size=length).map(tuple)
    holes = st.tuples(st.integers(0, length), st.sets(st.integers(0, max(length - 1, 0)), max_size=2)).map(
        lambda kh: tuple(i not in kh[1] for i in range(kh[0])))
    mostly = st.lists(MOSTLY_TRUE, min_size=length, max_size=length).map(tuple)
    return dense | sparse | holes | mostly


# -- judging -------------------------------------------------------------------------------
class HybridDriver:
    """Applies steps to the engine and the reference, and judges each lookup."""

    def __init__(self, engine_factory: Callable[[], HybridLookupAdapter], verdicts: Verdicts) -> None:
        self.engine_factory = engine_factory
        self.verdicts = verdicts
        self.engine: HybridLookupAdapter | None = None
        self.model = ReferenceHybridLookup()
        self.setup: HybridSetup | None = None
        self.steps: list[object] = []
        self.dead = False
        #: Divergences of the spec's loop from the declarative hit seen (rule id -> count).
        self.divergences: dict[str, int] = {}

    def apply(self, step: object) -> None:
        if self.dead:
            return
        self.steps.append(step)
        try:
            getattr(self, "_" + type(step).__name__)(step)
            return
        except KnownFailure:
            self.dead = True
            return
        except RuleViolation as failed:
            found = failed
        found.steps = list(self.steps)
        self.dead = True
        raise found

    def _engine(self, rule_id: str, operation: Callable[[], object]) -> object:
        try:
            return operation()
        except Exception as error:  # the engine's failure is a verdict, not a crash of kvoracle
            failure = violation(rule_id, f"engine raised {type(error).__name__}: {error}")
            failure.is_engine_error = True
            raise failure from None

    def _HybridSetup(self, step: HybridSetup) -> None:
        self.setup = step
        config = step.config()
        self.model.configure(config)
        self.engine = self.engine_factory()
        self._engine("KV-HYB-003", lambda: self.engine.configure(config))

    def _Seed(self, step: Seed) -> None:
        assert self.setup is not None and self.engine is not None
        prompt = self.setup.prompts[step.prompt]
        self.model.seed_cache(prompt, step.group, step.mask)
        self._engine("KV-HYB-003", lambda: self.engine.seed_cache(prompt, step.group, step.mask))

    def _LookUp(self, step: LookUp) -> None:
        assert self.setup is not None and self.engine is not None
        prompt = self.setup.prompts[step.prompt]
        got = self._engine("KV-HYB-003", lambda: self.engine.lookup(prompt, step.max_cache_hit_length))
        want = self.model.lookup(prompt, step.max_cache_hit_length)
        self._judge(prompt, step, got, want)

    def _judge(self, prompt: Sequence[int], step: LookUp, got: Lookup, want: Lookup) -> None:
        check = self.verdicts.check
        coordinator = self.model.coordinator
        assert coordinator is not None and self.setup is not None
        config = coordinator.config
        hashes = self.model.hashes(prompt)
        bound = len(prompt) - 1 if step.max_cache_hit_length is None else step.max_cache_hit_length
        alignment = config.scheduler_block_size
        flat = tuple(group.flat(config.use_eagle) for group in coordinator.spec_groups)
        cached = tuple(coordinator._cached_flags(hashes, group) for group in coordinator.spec_groups)
        num_hashed = len(hashes) * config.hash_block_size
        loop = spec.fixed_point(flat, cached, bound, num_hashed, alignment)
        hit = got.num_tokens
        check("KV-HYB-003", len(got.block_ids) == len(config.kv_cache_specs),
              lambda: f"the engine answered {len(got.block_ids)} groups, the config has "
                      f"{len(config.kv_cache_specs)}")
        groups = [(sg, g) for sg in coordinator.spec_groups for g in sg.group_ids]
        for sg, g in groups:  # KV-HYB-006 first: a full group's surplus is its rule, not KV-HYB-004's
            if sg.kind == spec.FULL:
                size = sg.kv_cache_spec.block_size
                check("KV-HYB-006", len(got.block_ids[g]) == cdiv(hit, size),
                      lambda g=g, size=size: f"full-attention group {g} (block size {size}) has "
                      f"{len(got.block_ids[g])} hit blocks for a hit of {hit} tokens; want "
                      f"cdiv({hit}, {size}) = {cdiv(hit, size)}")
        for sg, g in groups:
            if sg.kind != spec.FULL:
                size = sg.kv_cache_spec.block_size
                rule_id = "KV-MAMBA-002" if sg.kind == spec.MAMBA else "KV-HYB-004"
                check(rule_id, len(got.block_ids[g]) * size <= hit,
                      lambda g=g, size=size, sg=sg: f"{sg.kind} group {g} answers "
                      f"{len(got.block_ids[g])} blocks of {size} tokens, beyond the hit of {hit} tokens")
        self._judge_length(hit, loop[0], flat, cached, bound, num_hashed, alignment, prompt)
        for sg, g in groups:
            index = coordinator.spec_groups.index(sg)
            kind, size, param, _ = flat[index]
            entries = got.block_ids[g]
            last_bound, drop = loop[4][index]
            nulls = spec.num_null_hit_blocks(kind, len(entries), last_bound, drop, size, param)
            if flat[index][3] and not drop and kind != spec.MAMBA and _null_pattern(entries) != nulls:
                # Wrong nulls in a group the loop had already verified, exactly where a lookup
                # that drops its EAGLE block again (bound one block further) puts them: a
                # second drop, named KV-HYB-007 like a wrong hit with EAGLE.
                again = spec.num_null_hit_blocks(kind, len(entries), min(last_bound + size, num_hashed),
                                                 True, size, param)
                check("KV-HYB-007", _null_pattern(entries) != again,
                      lambda entries=entries, nulls=nulls, g=g, kind=kind: f"{kind} group {g} answers "
                      f"{list(entries)}: the null entries of an EAGLE drop repeated after the group was "
                      f"verified; want {nulls} null entries first (id {NULL_BLOCK_ID})")
            check("KV-HYB-013", all((b == NULL_BLOCK_ID) == (j < nulls) for j, b in enumerate(entries)),
                  lambda entries=entries, nulls=nulls, g=g, kind=kind: f"{kind} group {g} answers "
                  f"{list(entries)}; want {nulls} null entries (id {NULL_BLOCK_ID}) first and none after")
        check("KV-FULL-002", got.block_ids == want.block_ids,
              lambda: f"hit block ids {[list(b) for b in got.block_ids]}; the reference's are "
                      f"{[list(b) for b in want.block_ids]}")

    def _judge_length(self, hit: int, expected: int, flat: tuple[spec.SpecGroup, ...],
                      cached: tuple[tuple[bool, ...], ...], bound: int, num_hashed: int, alignment: int,
                      prompt: Sequence[int]) -> None:
        check = self.verdicts.check
        detail = (f"prompt of {len(prompt)} tokens, bound {bound}, spec groups {list(flat)}, cached "
                  f"{[''.join('x' if c else '.' for c in flags) for flags in cached]}")
        has_swa = any(kind == spec.SLIDING_WINDOW for kind, _, _, _ in flat)
        eagle = any(e for _, _, _, e in flat)
        if has_swa:
            # The scan that wrongly needs cdiv(window, b) blocks is the loop with window + 1.
            wide = tuple((k, s, p + 1 if k == spec.SLIDING_WINDOW else p, e) for k, s, p, e in flat)
            wrong = spec.fixed_point(wide, cached, bound, num_hashed, alignment)[0]
            check("KV-SWA-001", hit == expected or hit != wrong,
                  lambda: f"hit {hit} tokens, the spec's {expected}: what a sliding-window scan needing "
                          f"cdiv(window, block_size) blocks answers; {detail}")
        check("KV-HYB-004", 0 <= hit <= bound and hit % alignment == 0,
              lambda: f"hit {hit} is not an aligned length within the bound {bound}; {detail}")
        if eagle:
            check("KV-HYB-007", hit == expected,
                  lambda: f"hit {hit} tokens with EAGLE; the spec's fixed point is {expected}; {detail}")
        check("KV-HYB-003", hit == expected,
              lambda: f"hit {hit} tokens; the spec's fixed point is {expected}; {detail}")
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
            ideal = spec.fixed_point(flat, cached, bound, num_hashed, alignment, ideal=True)[0]
            names = ["KV-SWA-003"] if ideal != declarative else (
                (["KV-SWA-010"] if swa_misaligned else []) + (["KV-HYB-009"] if eagle_swa else []))
            for name in names or ["unnamed"]:
                self.divergences[name] = self.divergences.get(name, 0) + 1


def _null_pattern(entries: Sequence[int]) -> int | None:
    """How many leading entries are the null block, or None if a null entry follows a real one."""
    leading = next((j for j, b in enumerate(entries) if b != NULL_BLOCK_ID), len(entries))
    return leading if NULL_BLOCK_ID not in entries[leading:] else None


#: Divergences of the spec's loop from the declarative hit, over a whole run (for the report).
DIVERGENCES: dict[str, int] = {}


class HybridLookupMachine(RuleBasedStateMachine):
    """Seeds and lookups over one generated hybrid configuration."""

    engine_factory: Callable[[], HybridLookupAdapter]
    verdicts: Verdicts
    on_example: Callable[[], None] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.driver = HybridDriver(type(self).engine_factory, self.verdicts)
        self.seeded: list[int] = []
        if self.on_example is not None:
            self.on_example()

    @initialize(setup=hybrid_setups())
    def configure(self, setup: HybridSetup) -> None:
        self.driver.apply(setup)

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
        self.driver.apply(Seed(prompt, group, data.draw(_masks(length), label="mask")))

    @precondition(_alive)
    @rule(data=st.data())
    def seed_every_group(self, data: st.DataObject) -> None:
        # A hit needs the prompt cached in every group: seed one prompt in all of them, with
        # the same mask drawn over hash blocks (each group sees it at its own block size).
        setup = self.driver.setup
        prompt = data.draw(st.integers(0, len(setup.prompts) - 1), label="prompt")
        tokens = len(setup.prompts[prompt])
        hash_blocks = tokens // setup.hash_block_size
        dense = st.integers(0, hash_blocks).map(lambda k: (True,) * k)
        mask = data.draw(dense | dense | _masks(hash_blocks), label="hash mask")
        self.seeded.append(prompt)
        # Or (two times in three) each group its own random holes, four in five blocks cached:
        # the EAGLE peek and sliding-window runs then differ between groups, which is what
        # makes the loop take several passes and the groups' answers differ.
        independent = data.draw(st.integers(0, 2), label="independent masks") > 0
        for group, (_, size, _) in enumerate(setup.groups):
            per = size // setup.hash_block_size
            length = min(tokens // size, setup.num_blocks - 1)
            if independent:
                # A group now and then wholly cached: the others then decide the hit.
                holes = st.lists(MOSTLY_TRUE, min_size=length, max_size=length).map(tuple)
                whole = st.just((True,) * length)
                self.driver.apply(Seed(prompt, group, data.draw(holes | holes | whole, label="mask")))
                continue
            self.driver.apply(Seed(prompt, group, tuple(
                all(mask[j * per:(j + 1) * per]) and len(mask) >= (j + 1) * per for j in range(length))))

    @precondition(_alive)
    @rule(data=st.data())
    def look_up(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        # Mostly (four times in five) a prompt seeded in every group: those can hit.
        seeded = self.seeded and data.draw(st.integers(0, 4), label="a seeded prompt") > 0
        prompt = data.draw(st.sampled_from(self.seeded) if seeded
                           else st.integers(0, len(setup.prompts) - 1), label="prompt")
        # Or bounded, now and then to a few aligned blocks: every group then tends to accept the whole
        # bound, and a group answering past it (KV-MAMBA-002) shows.
        tokens = len(setup.prompts[prompt])
        near = min(tokens, 3 * _lcm([size for _, size, _ in setup.groups]))
        bound = data.draw(st.none() | st.none() | st.none() | st.integers(0, tokens) | st.integers(0, near),
                          label="bound")
        self.driver.apply(LookUp(prompt, bound))

    @precondition(lambda self: not self._alive())
    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead (no other rule runs)

    def teardown(self) -> None:
        for name, count in self.driver.divergences.items():
            DIVERGENCES[name] = DIVERGENCES.get(name, 0) + count


def make_hybrid_machine(engine_factory: Callable[[], HybridLookupAdapter], verdicts: Verdicts,
                        quarantine: object = None, step_timeout: float | None = None,
                        on_example: Callable[[], None] | None = None) -> type[HybridLookupMachine]:
    """A machine class bound to one engine (the runner's ``make_machine`` signature).

    ``quarantine`` and ``step_timeout`` are accepted for that signature and unused: lookups
    are not run under a time limit.
    """
    return bind_machine(HybridLookupMachine, "HybridLookup", engine_factory, verdicts, on_example)


#: Verdicts over every rule, with the rules outside :data:`SCOPE` not applicable.
hybrid_verdicts = scoped_verdicts(SCOPE, OUT_OF_SCOPE)


def load_hybrid_engine(name: str) -> Callable[[], HybridLookupAdapter]:
    """A built-in hybrid adapter by engine name, or ``module:Class``."""
    return load_engine(HYBRID_ENGINES.get(name, name))


# -- replay --------------------------------------------------------------------------------
def replay_hybrid(engine: str | Callable[[], HybridLookupAdapter], steps: Sequence[object]) -> Verdicts:
    """Apply ``steps``; raises :class:`~.verdicts.RuleViolation` on a failure."""
    factory = load_hybrid_engine(engine) if isinstance(engine, str) else engine
    return replay_steps(HybridDriver, factory, hybrid_verdicts(None, None), steps)


_TEMPLATE = '''\
"""kvoracle counterexample: {rule_id} on engine {engine!r} (hybrid lookup suite).

{message}

Generated by `kvoracle check --suite hybrid`; run with `pytest {filename}`. The test
fails while the engine still violates the rule, and passes once it is fixed.
"""

from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, Seed, replay_hybrid

ENGINE = {engine!r}
STEPS = [
{steps}
]


def test_{test_name}():
    replay_hybrid(ENGINE, STEPS)
'''


def write_hybrid_replay(directory: Path, engine_spec: str, example: Counterexample) -> Path:
    """Write ``example`` as ``test_hybrid_<rule>_<engine>.py`` under ``directory``."""
    from .replay import write_replay  # lazily, like hybrid_suite: replay imports the lockstep driver

    return write_replay(directory, engine_spec, example, template=_TEMPLATE, prefix="hybrid_")


def hybrid_suite():
    """The runner's description of this suite (imported lazily: runner imports the lockstep machine)."""
    from .runner import Suite
    return Suite(load=load_hybrid_engine, make_verdicts=hybrid_verdicts, make_machine=make_hybrid_machine,
                 write_replay=write_hybrid_replay)
