"""Choosing steps for a model of several KV-cache groups (the manager machine's half for it).

Configurations: 1 to 3 groups of full attention, sliding window (windows 1 to
12) and chunked local attention, block sizes multiples of the hash block size,
EAGLE on or off, a small pool; with prefix caching off, a cross-attention group
sized by the request's encoder tokens (KV-HLC-007), and Mamba groups in "none"
mode (KV-HLC-008), sometimes one block per request. With caching on, where the
engine claims ``mamba_align``, a Mamba group in "align" mode (chapter 8): its block
the hash block (KV-MAMBA-003), 0 to 2 speculative pages, sometimes a prefill
checkpoint page, alone or beside coarser groups (a hit alignment above its block),
and scheduler steps (``new_step``) between the others (KV-MAMBA-009); requests that
share a state cached in the current step, and decode steps whose rejected drafts leave
the Mamba table longer than the next step needs, the pool crowded by requests of fresh
tokens until a look-ahead falls short by no more than that (KV-MAMBA-008). A rule of its
own prefills prompts that end inside a coarse full-attention block and finishes
them at once, the case of vLLM's partial tail entries (KV-HLC-006). Where the engine
claims ``mamba_partial_hits``, one align-mode model in three has a Mamba block of 2 or 4
hash blocks beside groups of the hash block (vLLM's fine-grained partial hits,
KV-MAMBA-019 .. KV-MAMBA-025): the scheduler takes the step's copies before each new
step, and a rule of its own prefills a prompt whose last hash boundary lies inside a
Mamba block (the partial tail), runs it on (the tail's key moves to a copy), sometimes
with the pool one page short of that copy, and then resumes a request inside the
block. Features the engine does not claim (EAGLE, caching off, look-ahead, delayed
caching, eviction, reset, align mode, partial hits) are not generated.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec import lifecycle as lifecycle_spec
from kvoracle.spec import mamba as mamba_spec
from kvoracle.spec.lifecycle import cdiv

from ..adapter import Capabilities
from ..steps import (
    AddRequest,
    AppendTokens,
    ConfigureGroups,
    Evict,
    Free,
    NewStep,
    ResetPrefixCache,
    Schedule,
    TakeCopies,
)
from .what_if import what_if

TOKENS = st.integers(0, 3)
MAX_LIVE_REQUESTS = 4


@st.composite
def group_setups(draw: st.DrawFn, capabilities: Capabilities | None = None) -> ConfigureGroups:
    """Valid configurations of several groups, biased towards pools that fill up."""
    caps = capabilities or Capabilities()
    hash_size = draw(st.sampled_from([1, 2, 4]), label="hash_block_size")
    caching = draw(st.integers(0, 3), label="caching off") != 0 if caps.caching_off else True
    eagle = draw(st.booleans(), label="use_eagle") if caps.eagle else False
    count = draw(st.integers(1, 3), label="num_groups")
    kinds = [hybrid_spec.FULL, hybrid_spec.SLIDING_WINDOW, hybrid_spec.SLIDING_WINDOW]
    if not eagle:
        kinds.append(hybrid_spec.CHUNKED_LOCAL)  # KV-CHUNK-003
    drafts = []
    for _ in range(count):
        kind = draw(st.sampled_from(kinds), label="kind")
        size = hash_size if count == 1 else hash_size * draw(st.sampled_from([1, 2, 4]), label="scale")
        drafts.append([kind, size, 0])
    # Drawn first so that the EAGLE shape below never takes its share (chapter 8).
    align = caching and caps.mamba_align and draw(st.integers(0, 2), label="align mamba") == 0
    # Half the time with EAGLE, caching on, several groups and no align-mode Mamba group: a
    # coarse full group, a sparse window of the hash block and a full group of the hash block.
    # The window caches only the blocks it can reach, shifted by the peek block (KV-SWA-011,
    # KV-SWA-012), a short run in it loses an alignment unit (KV-SWA-010), and the coarse group
    # leaves partial tail entries (KV-HLC-006).
    sparse_window = None
    if count > 1 and eagle and caching and not align and draw(st.booleans(), label="sparse EAGLE window"):
        sparse_window = [hybrid_spec.SLIDING_WINDOW, hash_size, 0]
        drafts = [[hybrid_spec.FULL, hash_size * 4, 0], sparse_window, [hybrid_spec.FULL, hash_size, 0]]
    # Three times in four with EAGLE and caching on, where a partial tail entry can be left.
    elif count > 1 and draw(st.integers(0, 3 if eagle and caching else 1), label="coarse_full_group") > 0:
        # A full-attention group coarser than the hash blocks: a prompt ending inside one of
        # its blocks leaves a partial tail entry (KV-HLC-006).
        drafts[0][:2] = [hybrid_spec.FULL, hash_size * draw(st.sampled_from([2, 4]), label="coarse scale")]
    encoder = 0
    if not caching and draw(st.integers(0, 3), label="cross_attention") > 0:  # KV-HLC-007
        drafts.append([spec.CROSS_ATTENTION, hash_size * draw(st.sampled_from([1, 2])), 0])
        encoder = draw(st.integers(1, 12), label="num_encoder_tokens")
    mamba = None
    if not caching and draw(st.integers(0, 2), label="mamba") > 0:  # KV-HLC-008
        mamba = [hybrid_spec.MAMBA, hash_size * draw(st.sampled_from([1, 2, 4])),
                 draw(st.sampled_from([0, 0, 1, 2]), label="num_speculative_blocks")]
        drafts.insert(draw(st.integers(0, len(drafts)), label="mamba position"), mamba)
    checkpoints = (0, 0)
    if align:  # chapter 8
        # The block is the hash block (KV-MAMBA-003); the other groups' blocks are multiples of
        # it, so a hit aligns above the Mamba block whenever one of them is coarser.
        # Speculative pages three times in four: a growing table moves them (KV-MAMBA-005) and
        # keeps the last of them at its end (KV-MAMBA-013).
        mamba = [hybrid_spec.MAMBA, hash_size, draw(st.sampled_from([0, 1, 1, 2]), label="num_speculative_blocks")]
        if not eagle and draw(st.integers(0, 3), label="mamba alone") == 0:  # EAGLE needs another group
            drafts = [mamba]
        else:
            drafts.insert(draw(st.integers(0, len(drafts)), label="mamba position"), mamba)
        partial = caps.mamba_partial_hits and draw(st.integers(0, 2), label="partial hits") == 0
        if partial:
            # A Mamba block of 2 or 4 hash blocks beside groups of the hash block: vLLM's
            # fine-grained partial hits (KV-MAMBA-019); a chunked-local group (whose block is the
            # scheduler block) would turn them off, so it becomes full attention here.
            mamba[1] = hash_size * draw(st.sampled_from([2, 4]), label="mamba hash blocks")
            if len(drafts) == 1:
                drafts.append([hybrid_spec.FULL, hash_size, 0])
            for draft in drafts:
                if draft is not mamba:
                    draft[0] = hybrid_spec.FULL if draft[0] == hybrid_spec.CHUNKED_LOCAL else draft[0]
                    draft[1] = hash_size
        # Three times in four a prefill checkpoint (KV-MAMBA-006; with drafts, KV-MAMBA-017), mostly
        # one the backend can export.
        if draw(st.integers(0, 3), label="prefill checkpoint"):
            checkpoints = (1, draw(st.sampled_from([1, hash_size, 1, 0]), label="prefill_checkpoint_alignment"))
    others = [size for kind, size, _ in drafts if kind != hybrid_spec.CHUNKED_LOCAL]
    alignment = math.lcm(hash_size, *others) if others else hash_size
    for draft in drafts:
        if draft[0] == hybrid_spec.CHUNKED_LOCAL:
            draft[1] = alignment  # KV-CHUNK-003
            draft[2] = alignment * draw(st.integers(1, 3), label="chunk_blocks")
        elif draft[0] == hybrid_spec.SLIDING_WINDOW:
            # Small windows as often as large ones: a window shorter than the alignment
            # caches only the reachable blocks (KV-SWA-011).
            windows = st.integers(1, 12) | st.integers(1, 4)
            # Sparse windows: each aligned segment then holds blocks no hit reads, so what a
            # group caches is a strict subset of its full blocks (KV-SWA-011, KV-SWA-012;
            # vLLM #44082 left out the EAGLE peek block there). Among them the edges of a tail
            # of ``t`` blocks: a window reading exactly t blocks back (window - 1 a multiple of
            # the block size) and the smallest window reading as far.
            size = draft[1]
            tails = alignment // size - int(eagle) - 1  # the longest tail that stays sparse
            if tails >= 1:
                sparse = st.integers(1, tails).flatmap(
                    lambda t, size=size: st.sampled_from([t * size + 1, (t - 1) * size + 2]))
                windows = sparse if draft is sparse_window else windows | sparse
            draft[2] = draw(windows, label="window")
    max_model_len = alignment * draw(st.integers(4, 12), label="max_model_len blocks")
    chunked = any(kind == hybrid_spec.CHUNKED_LOCAL for kind, _, _ in drafts)
    if mamba is not None and not caching and not chunked and draw(st.integers(0, 2), label="one state block") == 0:
        # One block per request (a third of the time: only several blocks leave skipped ones to
        # judge, KV-HLC-008): the state block covers the model length (the chunked-local block
        # size must stay the scheduler block size, KV-CHUNK-003).
        mamba[1] = max_model_len
    groups = tuple(tuple(d) for d in drafts)
    blocks_per_request = sum(cdiv(max_model_len, size) for _, size, _ in groups)
    # Mostly room for two or three requests; one time in four a pool that runs out early.
    small = draw(st.integers(0, 3), label="small pool") == 0
    num_blocks = draw(st.integers(2, max(3, blocks_per_request)) if small else st.integers(
        blocks_per_request, 3 * blocks_per_request), label="num_blocks")
    return ConfigureGroups(groups, hash_size, num_blocks, max_model_len, eagle, caching, encoder, *checkpoints)


def _alignment(setup: ConfigureGroups) -> int:
    """The scheduler block size of a configured model (KV-HYB-001)."""
    return hybrid_spec.scheduler_block_size(tuple(size for _, size, _ in setup.groups))


class GroupsRules:
    """The manager machine's rules for a model of several groups: requests arriving, running in
    chunks, decoding, being preempted and finishing (a mixin of :class:`~.machine.ManagerMachine`,
    which holds ``driver``, ``prompts``, ``warm`` and the request ids)."""

    @property
    def caps(self) -> Capabilities:
        return self.verdicts.capabilities

    def _alive(self) -> bool:
        return self.driver.setup is not None and not self.driver.dead

    def _live(self) -> list[str]:
        return sorted(self.driver.model.requests)

    def _can_arrive(self) -> bool:
        return self._alive() and len(self._live()) < MAX_LIVE_REQUESTS

    def _has_live(self) -> bool:
        return self._alive() and bool(self._live())

    @precondition(_can_arrive)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        limit = setup.max_model_len - 1
        alignment = _alignment(setup)
        prefix: tuple[int, ...] = ()
        warm = self._warm()
        sources = warm if warm and data.draw(st.integers(0, 3), label="warm source") else self.prompts
        if sources and data.draw(st.integers(0, 4), label="shares a prefix"):
            source = data.draw(st.sampled_from(sources), label="source")
            cut = data.draw(st.integers(0, len(source)) | st.integers(0, len(source) // alignment).map(
                lambda k: k * alignment), label="cut")
            prefix = source[:cut]
        # Prompts a whole number of aligned segments long (or one token past) as often as
        # any other length: the first caching step then covers several segments at once.
        length = data.draw(st.integers(1, 3 * alignment) | st.integers(1, 3).flatmap(
            lambda k: st.sampled_from([k * alignment, k * alignment + 1])), label="suffix length")
        suffix = data.draw(st.lists(TOKENS, min_size=length, max_size=length), label="suffix")
        prompt = (prefix + tuple(suffix))[:limit]
        self.prompts.append(prompt)
        request_id = self.new_request_id()
        self.driver.apply(AddRequest(request_id, prompt))

    def _warm(self) -> list[tuple[int, ...]]:
        """Computed tokens of live and released requests: the prefixes that can hit."""
        return [tuple(r.all_token_ids[:r.num_computed_tokens]) for r in self.driver.model.requests.values()
                if r.num_computed_tokens] + self.warm

    @precondition(_can_arrive)
    @rule(data=st.data())
    def serve_shared_prefix(self, data: st.DataObject) -> None:
        # A request continuing a computed prefix (or a fresh one, before any) arrives and is
        # scheduled at once: the lifecycle's hits (KV-HLC-003, KV-SWA-009) need exactly this.
        # It is also a second rule that starts requests: Hypothesis switches rules off at random
        # per example, and with caching off no other rule would.
        setup = self.driver.setup
        fresh = self._fresh_states()
        if not fresh and setup.align_groups and data.draw(st.booleans(), label="cache a state first"):
            fresh = self._cache_state_now(data)
            if self.driver.dead:
                return
        warm = self._warm()
        if fresh and data.draw(st.booleans(), label="fresh state"):
            # A prefix ending on a Mamba state cached in this scheduler step: the hit waits for
            # the next step (KV-MAMBA-009).
            source = data.draw(st.sampled_from(fresh), label="source")
            suffix = data.draw(st.lists(TOKENS, min_size=1, max_size=4), label="suffix")
        else:
            source = data.draw(st.sampled_from(warm), label="source") if warm else ()
            suffix = data.draw(st.lists(TOKENS, min_size=0 if warm else 1, max_size=4), label="suffix")
        prompt = (source + tuple(suffix))[:setup.max_model_len - 1] or (0,)
        self.prompts.append(prompt)
        request_id = self.new_request_id()
        self.driver.apply(AddRequest(request_id, prompt))
        self.driver.apply(Schedule(request_id, data.draw(st.integers(1, len(prompt)), label="num_new_tokens")))

    def _cache_state_now(self, data: st.DataObject) -> list[tuple[int, ...]]:
        """A live request (or, with room for two more, a new one) is scheduled up to an aligned
        boundary, so that an align-mode group caches a state in this step; the fresh states after."""
        alignment = _alignment(self.driver.setup)
        model = self.driver.model
        behind = [r for r in self._live() if model.requests[r].num_tokens // alignment * alignment
                  > model.requests[r].num_computed_tokens]
        room = len(self._live()) + 2 <= MAX_LIVE_REQUESTS
        if room and (not behind or data.draw(st.booleans(), label="new producer")):
            # (max_model_len is at least four aligned segments)
            segments = data.draw(st.integers(1, (self.driver.setup.max_model_len - 1) // alignment), label="segments")
            producer = self.new_request_id()
            self.driver.apply(AddRequest(producer, self._prompt_of_length(data, segments * alignment)))
        elif behind:
            producer = data.draw(st.sampled_from(behind), label="producer")
        else:
            return []
        request = model.requests.get(producer)
        chunk = 0 if request is None else request.num_tokens // alignment * alignment - request.num_computed_tokens
        if chunk > 0 and not self.driver.dead:
            self.driver.apply(Schedule(producer, chunk))
        return [] if self.driver.dead else self._fresh_states()

    def _fresh_states(self) -> list[tuple[int, ...]]:
        """Computed prefixes of live requests, each a whole number of aligned segments long,
        whose last Mamba page an align-mode group cached in this scheduler step."""
        setup = self.driver.setup
        if not setup.align_groups:
            return []
        manager = self.driver.model.manager
        alignment = _alignment(setup)
        found = []
        for request in self.driver.model.requests.values():
            for end in range(alignment, request.num_computed_tokens + 1, alignment):
                for g in setup.align_groups:
                    group = manager.groups[g]
                    index = end // group.block_size - 1
                    if index < len(request.block_hashes) * request.hash_block_size // group.block_size and (
                            group.coordinator.view_hash(request.block_hashes, group.block_size, index), g
                    ) in group.cached_this_step:
                        found.append(tuple(request.all_token_ids[:end]))
                        break
        return found

    @precondition(_has_live)
    @rule(data=st.data())
    def run(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._live()), label="request")
        request = self.driver.model.requests[request_id]
        if request.num_computed_tokens >= request.num_tokens:
            room = self.driver.setup.max_model_len - request.num_tokens
            if room <= 0:
                self.driver.apply(Free(request_id))
                return
            self.driver.apply(AppendTokens(request_id, tuple(data.draw(
                st.lists(TOKENS, min_size=1, max_size=min(room, 3)), label="tokens"))))
        left = request.num_tokens - request.num_computed_tokens
        chunks = st.integers(1, max(1, left)) | st.just(max(1, left))
        # Or up to an aligned boundary: caching then ends exactly on a segment's end.
        alignment = _alignment(self.driver.setup)
        aligned = (request.num_tokens // alignment) * alignment - request.num_computed_tokens
        if aligned > 0:
            chunks |= st.just(aligned)
        # In an align-mode model whose Mamba block is finer than the alignment: up to the last
        # Mamba block boundary, where it falls inside an aligned segment. A checkpoint of the
        # segment's start then lies in the page the boundary copy reaches (KV-MAMBA-018).
        setup = self.driver.setup
        if setup.align_groups:
            block = min(setup.groups[g][1] for g in setup.align_groups)
            inside = (request.num_tokens // block) * block - request.num_computed_tokens
            if inside > 0 and inside != aligned:
                chunks |= st.just(inside)
        chunk = data.draw(chunks, label="num_new_tokens")
        drafts = data.draw(st.sampled_from([0, 0, 0, 1, 2]), label="num_draft_tokens")
        lookahead = data.draw(st.sampled_from([0, 0, 0, 1, 3]), label="num_lookahead_tokens") \
            if self.caps.lookahead else 0
        delay = data.draw(st.sampled_from([False] * 5 + [True]), label="delay_cache_blocks") \
            if self.caps.delay_cache else False
        self.driver.apply(Schedule(request_id, chunk, drafts, lookahead, delay))

    @precondition(_has_live)
    @rule(data=st.data())
    def run_again(self, data: st.DataObject) -> None:
        self.run(data)  # scheduling is the common step: twice the weight of the others

    @precondition(_has_live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._live()), label="request")
        request = self.driver.model.requests[request_id]
        if request.num_computed_tokens:
            self.warm.append(tuple(request.all_token_ids[:request.num_computed_tokens]))
        self.driver.apply(Free(request_id, data.draw(st.booleans(), label="preempted")))

    def _coarse_full_sizes(self) -> list[int]:
        setup = self.driver.setup
        return [size for kind, size, _ in setup.groups
                if kind == hybrid_spec.FULL and size > setup.hash_block_size] if setup else []

    def _prompt_of_length(self, data: st.DataObject, length: int) -> tuple[int, ...]:
        """A prompt of ``length`` tokens, one time in two starting with a warm prompt's tokens
        (recorded in ``prompts``)."""
        warm = [w for w in self._warm() if w]
        prefix = data.draw(st.sampled_from(warm), label="source")[:length] if warm and data.draw(
            st.booleans(), label="shares a prefix") else ()
        prompt = prefix + tuple(data.draw(st.lists(TOKENS, min_size=length - len(prefix),
                                                   max_size=length - len(prefix)), label="suffix"))
        self.prompts.append(prompt)
        return prompt

    def _can_leave_partial_tail(self) -> bool:
        # Only with EAGLE: without it several groups cache whole aligned segments, so the
        # boundary's block is cached whole or not reached at all.
        setup = self.driver.setup
        return self._can_arrive() and setup.enable_caching and setup.use_eagle and bool(self._coarse_full_sizes())

    @precondition(_can_leave_partial_tail)
    @rule(data=st.data())
    def prefill_and_finish(self, data: st.DataObject) -> None:
        # KV-HLC-006: a prompt whose last hash boundary lies inside a coarse full-attention
        # block, prefilled at once and finished before that block fills: the block carries
        # only a partial tail entry when it is freed.
        setup = self.driver.setup
        size = data.draw(st.sampled_from(self._coarse_full_sizes()), label="block size")
        hash_size = setup.hash_block_size
        longest = setup.max_model_len - 1 - hash_size  # room for the tokens after the boundary
        boundaries = [b for b in range(hash_size, longest + 1, hash_size) if b % size]
        if not boundaries:
            return
        boundary = data.draw(st.sampled_from(boundaries), label="boundary")
        self._make_room(data)  # for the producer and a consumer
        # The boundary is the prompt in whole hash blocks with EAGLE, one token less without.
        length = boundary + data.draw(st.integers(0, hash_size - 1), label="past the boundary") + int(
            not setup.use_eagle)
        prompt = self._prompt_of_length(data, length)
        request_id = self.new_request_id()
        self.driver.apply(AddRequest(request_id, prompt))
        self.driver.apply(Schedule(request_id, length))
        if request_id in self.driver.model.requests:
            self.warm.append(prompt)
            self.driver.apply(Free(request_id))

    def _has_cache(self) -> bool:
        return self._alive() and self.driver.setup.enable_caching and (self.caps.evict or self.caps.reset)

    @precondition(_has_cache)
    @rule(data=st.data())
    def forget_cached(self, data: st.DataObject) -> None:
        # One rule for both ways of forgetting (a connector's eviction, a reset), so that
        # they do not crowd out the lifecycle's own steps.
        # A reset one time in four, but three in four where exactly one block is held: the
        # boundary of KV-POOL-014 (a count off by one lets the reset through).
        observed = self.driver.model.observe()
        boundary = pool_spec.can_reset_prefix_cache(observed.num_free_blocks + 1, self.driver.setup.num_blocks)
        if not self.caps.evict or (self.caps.reset and (data.draw(st.integers(0, 3), label="reset") == 0) != boundary):
            self.driver.apply(ResetPrefixCache())
            return
        cached = sorted({b for blocks in (observed.cached or {}).values() for b in blocks})
        any_block = st.integers(1, self.driver.setup.num_blocks - 1)
        chosen = data.draw(st.lists(st.sampled_from(cached) if cached else any_block, max_size=3)
                           | st.lists(any_block, max_size=2), label="block ids")
        self.driver.apply(Evict(tuple(chosen)))
        if self.driver.setup.align_groups:
            self._fail_holders(set(chosen))

    def _fail_holders(self, evicted: set[int]) -> None:
        """Free every live request holding an evicted block, as vLLM's scheduler does.

        The scheduler evicts only the blocks of requests whose KV failed to load, and fails
        those requests at once (``Scheduler._handle_invalid_blocks``): no request runs on
        after one of its blocks lost its key. In align mode the difference shows: a running
        request's Mamba page at its prompt's last hash boundary is keyed again by its next
        step in vLLM (it re-keys a page whose own key is missing) and not in the reference (it
        counts the page as cached already), after a sequence the real engine never produces.
        Without align groups both agree, so the other models keep their wider sequences.
        """
        tables = self.driver.model.observe().block_tables
        for request_id in sorted(tables):
            if request_id in self.driver.model.requests and any(
                    block in evicted for table in tables[request_id] for block in table):
                self.driver.apply(Free(request_id))

    def _has_align_group(self) -> bool:
        return self._alive() and bool(self.driver.setup.align_groups)

    @precondition(_has_align_group)
    @rule()
    def new_step(self) -> None:
        # The scheduler's step boundary: a state cached in a step becomes a hit after it
        # (KV-MAMBA-009). Between two of them any number of requests are scheduled, so a
        # request can ask for a state another one cached in the same step. With partial hits the
        # scheduler first takes the step's copies (KV-MAMBA-023 .. KV-MAMBA-025).
        if self.driver.config.partial_hits:
            self.driver.apply(TakeCopies())
            if self.driver.dead:
                return
        self.driver.apply(NewStep())

    def _partial_model(self) -> bool:
        return self._alive() and self.driver.config.partial_hits

    @precondition(_partial_model)
    @rule(data=st.data())
    def share_partial_tail(self, data: st.DataObject) -> None:
        # KV-MAMBA-021 .. KV-MAMBA-025: a prompt whose last hash boundary lies inside a Mamba block
        # is prefilled (the scheduler stops a chunk there, keying the partial tail), runs on (its
        # next step moves the tail's key to a copy), and after a step boundary a request sharing
        # exactly that boundary resumes inside the block (a private copy).
        setup = self.driver.setup
        h = setup.hash_block_size
        size = max(setup.groups[g][1] for g in setup.align_groups)
        eagle = setup.use_eagle
        boundaries = [b for b in range(h, setup.max_model_len - 2 * h, h) if b % size]
        if not boundaries:
            return
        boundary = data.draw(st.sampled_from(boundaries), label="boundary")
        self._make_room(data)  # for the producer and a consumer
        length = boundary + (h + data.draw(st.integers(0, h - 1), label="past the boundary") if eagle
                             else data.draw(st.integers(1, h), label="past the boundary"))
        prompt = self._prompt_of_length(data, length)
        producer = self.new_request_id()
        self.driver.apply(AddRequest(producer, prompt))
        self.new_step()  # (a hit on a state cached in this step would wait for the next, KV-MAMBA-009)
        for _ in range(data.draw(st.integers(1, 4), label="chunks")):
            request = self.driver.model.requests.get(producer)
            if request is None or self.driver.dead or request.num_computed_tokens >= length:
                break
            if self._copy_due(producer) and data.draw(st.booleans(), label="one page short"):
                self.new_step()
                self._leave_one_short(producer, length)
            self.driver.apply(Schedule(producer, length))
        if self.driver.dead:
            return
        self.new_step()
        self._make_room(data)
        if self.driver.dead:
            return
        shared = prompt[:boundary] + tuple(data.draw(st.lists(TOKENS, min_size=1, max_size=2 * h), label="tail"))
        self.prompts.append(shared)
        consumer = self.new_request_id()
        self.driver.apply(AddRequest(consumer, shared))
        self.driver.apply(Schedule(consumer, data.draw(st.integers(1, len(shared)), label="num_new_tokens")))

    @precondition(_partial_model)
    @rule(data=st.data())
    def share_partial_tail_again(self, data: st.DataObject) -> None:
        self.share_partial_tail(data)  # twice the weight: partial-hit models are a few of many

    def _make_room(self, data: st.DataObject) -> None:
        """Live requests finish until one more may arrive."""
        while not self._can_arrive() and not self.driver.dead:
            request_id = data.draw(st.sampled_from(self._live()), label="finishes")
            request = self.driver.model.requests[request_id]
            if request.num_computed_tokens:
                self.warm.append(tuple(request.all_token_ids[:request.num_computed_tokens]))
            self.driver.apply(Free(request_id))

    def _copy_due(self, request_id: str) -> bool:
        """Whether the request registered a partial tail and its next allocation copies it."""
        groups = self.driver.model.manager.groups
        return any(request_id in groups[g].copy_due for g in self.driver.setup.align_groups)

    def _leave_one_short(self, request_id: str, length: int) -> None:
        """A request of fresh tokens arrives and prefills so that the request's next step to
        ``length`` tokens finds one free block fewer than it needs with its copy: KV-MAMBA-022's
        page decides whether it runs."""
        setup = self.driver.setup
        with what_if(self.driver.model) as model:
            manager = model.manager
            request = model.requests[request_id]
            computed = min(request.num_computed_tokens, setup.max_model_len)
            new, _ = self.driver._align_chunk(request_id, 0, length - computed, 0)
            for group in manager.groups:
                group.remove_skipped_blocks(request_id, computed)
            need = manager.num_blocks_to_allocate(request_id, lifecycle_spec.num_slots(
                computed, 0, new, 0, setup.max_model_len), computed, None, 0, computed + new)
            spare = manager.pool.num_free_blocks() - need + 1  # the blocks the filler must take
            if new <= 0 or spare <= 0 or len(self._live()) >= 2 * MAX_LIVE_REQUESTS:
                return
            filler_id = self.new_request_id()
            token = 4 + int(filler_id[1:])  # outside the prompts' alphabet: it hits nothing
            model.add_request(filler_id, (token,) * (setup.max_model_len - 1))
            block_size = max(setup.groups[g][1] for g in setup.align_groups)

            def first_chunk(n: int) -> int:  # what the driver's scheduler runs of a fresh n-token prompt
                end = mamba_spec.aligned_chunk_end(0, n, n, block_size)
                return self.driver._tail_stop(SimpleNamespace(num_tokens=n, num_prompt_tokens=n), 0, end, n,
                                              block_size)

            fits = [n for n in range(1, setup.max_model_len) if model.manager.num_blocks_to_allocate(
                filler_id, first_chunk(n), 0, None, 0, first_chunk(n)) == spare]
        if fits:
            prompt = (token,) * fits[0]
            self.prompts.append(prompt)
            self.driver.apply(AddRequest(filler_id, prompt))
            self.driver.apply(Schedule(filler_id, fits[0]))

    def _decoding_align(self) -> list[str]:
        """Live requests of an align-mode model with every token computed and room for two more."""
        if not self._has_align_group() or not self.caps.lookahead:
            return []
        limit = self.driver.setup.max_model_len - 2
        return [rid for rid, r in sorted(self.driver.model.requests.items())
                if r.num_computed_tokens == r.num_tokens and r.num_tokens < limit]

    @precondition(lambda self: bool(self._decoding_align()))
    @rule(data=st.data())
    def reject_drafts(self, data: st.DataObject) -> None:
        # A decode step with a Mamba block's worth of drafts or more, all rejected, then a step
        # with a look-ahead: the Mamba table is longer than this step needs (a negative need,
        # KV-MAMBA-008) while the look-ahead makes another group need blocks. vLLM's own
        # scheduler keeps the look-ahead constant; an engine's caller need not.
        request_id = data.draw(st.sampled_from(self._decoding_align()), label="request")
        setup = self.driver.setup
        block_size = setup.groups[setup.align_groups[0]][1]
        token = st.lists(TOKENS, min_size=1, max_size=1).map(tuple)
        self.driver.apply(AppendTokens(request_id, data.draw(token, label="token")))
        self.driver.apply(Schedule(request_id, 1, block_size * data.draw(st.integers(1, 3), label="draft blocks")))
        if request_id not in self.driver.model.requests or self.driver.dead:
            return
        self.driver.apply(AppendTokens(request_id, data.draw(token, label="token")))
        # Mostly the pool one block short: where a need that is too small shows.
        tight = self._first_failing_lookahead(request_id)
        # Where the pool holds every look-ahead, mostly other requests take it up first: the
        # pool is big enough for the whole model length more often than not.
        if not tight and data.draw(st.integers(0, 3), label="crowd the pool"):
            self._crowd_pool(request_id)
            if request_id not in self.driver.model.requests or self.driver.dead:
                return
            tight = self._first_failing_lookahead(request_id)
        lookahead = st.just(tight) if tight and data.draw(st.integers(0, 3), label="tight look-ahead") else \
            st.integers(1, 3 * _alignment(setup))
        self.driver.apply(Schedule(request_id, 1, 0, data.draw(lookahead, label="num_lookahead_tokens")))

    @precondition(lambda self: bool(self._decoding_align()))
    @rule(data=st.data())
    def reject_drafts_again(self, data: st.DataObject) -> None:
        self.reject_drafts(data)  # twice the weight: it needs a model, a request and a pool to line up

    def _mamba_shrink(self, request_id: str) -> int:
        """By how many entries the request's Mamba tables are longer than its next one-token step
        needs (the most over its align-mode groups; 0 where none is)."""
        setup = self.driver.setup
        request = self.driver.model.requests[request_id]
        tables = self.driver.model.observe().block_tables.get(request_id, ())
        main_tokens = min(request.num_computed_tokens, setup.max_model_len) + 1
        return max((len(tables[g]) - mamba_spec.num_required_entries(main_tokens, setup.groups[g][1],
                                                                      setup.groups[g][2])
                    for g in setup.align_groups if g < len(tables)), default=0)

    def _step_needs(self, request_id: str) -> tuple[set[int], int]:
        """The reference's summed needs of the request's next one-token step over every
        look-ahead, and the free blocks that step finds (after its own retired states)."""
        setup = self.driver.setup
        with what_if(self.driver.model) as model:
            manager = model.manager
            computed = min(model.requests[request_id].num_computed_tokens, setup.max_model_len)
            for group in manager.groups:
                group.remove_skipped_blocks(request_id, computed)
            needs = {manager.num_blocks_to_allocate(request_id, lifecycle_spec.num_slots(
                computed, 0, 1, lookahead, setup.max_model_len), computed, None, 0, computed + 1)
                for lookahead in range(1, setup.max_model_len - computed)}
            return needs, manager.pool.num_free_blocks()

    def _crowd_pool(self, request_id: str) -> None:
        """Requests of fresh tokens arrive and prefill (up to twice the live requests the other
        rules start) until, for some look-ahead, the request's next one-token step needs more blocks
        than are free by no more than its Mamba tables shrank: there an unfloored negative Mamba
        need hides the other groups' shortfall (KV-MAMBA-008)."""
        setup = self.driver.setup
        shrink = self._mamba_shrink(request_id)
        fillers: list[str] = []
        while shrink > 0 and len(fillers) < 6 and not self.driver.dead:
            needs, free = self._step_needs(request_id)
            if not any(needs) or any(1 <= need - free <= shrink for need in needs) or max(needs) > free:
                return  # no other group needs a block, or the pool is short already
            if len(self._live()) >= 2 * MAX_LIVE_REQUESTS:
                return
            # The shortest filler after which some look-ahead falls short by 1 to ``shrink``
            # blocks, or the longest one that fits, and another after it.
            filler_id = self.new_request_id()
            token = 4 + int(filler_id[1:])  # outside the prompts' alphabet: it hits nothing
            length = 0
            with what_if(self.driver.model) as model:
                model.add_request(filler_id, (token,) * (setup.max_model_len - 1))
                now = model.manager.pool.num_free_blocks()
                for candidate in range(1, setup.max_model_len):
                    taken = model.manager.num_blocks_to_allocate(filler_id, candidate, 0, None, 0, candidate)
                    if taken > now:
                        break
                    length = candidate
                    if any(1 <= need - (free - taken) <= shrink for need in needs):
                        break
            if not length:
                return
            prompt = (token,) * length
            self.prompts.append(prompt)
            fillers.append(filler_id)
            self.driver.apply(AddRequest(filler_id, prompt))
            self.driver.apply(Schedule(filler_id, length))
            if filler_id not in self.driver.running:
                return

    def _first_failing_lookahead(self, request_id: str) -> int:
        """The smallest look-ahead with which the reference's next one-token step fails, or 0.
        (A longer look-ahead needs at least as many blocks: a bisection over copies.)"""
        model = self.driver.model

        def fails(lookahead: int) -> bool:
            with what_if(model) as other:
                return other.allocate(request_id, 1, 0, lookahead) is None

        low, high = 1, self.driver.setup.max_model_len - 1
        if high < low or not fails(high):
            return 0
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if fails(middle) else (middle + 1, high)
        return low

    @precondition(lambda self: self.driver.several_groups)
    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead
