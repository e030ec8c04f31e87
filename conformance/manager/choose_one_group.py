"""Choosing steps for a model of one full-attention group (the manager machine's half for it).

Generated configurations vary the pool size, block size, ``max_model_len``,
prefix caching and EAGLE; request prompts are cut from earlier requests'
tokens (often at block boundaries) plus a few fresh tokens from a tiny
alphabet, so prefixes collide, get cached, evicted and come back. The rules
only *choose* steps from the reference's state; the driver applies and judges
them.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvoracle.reference import ManagerConfig
from kvoracle.spec import block_pool as pool_spec

from .. import steps
from ..adapter import Capabilities

#: Tokens come from a tiny alphabet so that independent requests collide.
TOKENS = st.integers(min_value=0, max_value=3)
MAX_LIVE_REQUESTS = 5
#: The first token of the requests that crowd the pool (each its own token, repeated).
FILLER_TOKENS = 10_000_000
MAX_FILLERS = 12


@st.composite
def manager_configs(draw: st.DrawFn, allow_caching_off: bool = True,
                    allow_eagle: bool = True) -> ManagerConfig:
    """Valid single-group configurations, biased towards small pools that fill up."""
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    # Small pools fill up: allocation failures, evictions and reuse of freed blocks.
    num_blocks = draw(st.integers(min_value=2, max_value=8) | st.integers(min_value=2,
                                                                            max_value=24))
    max_model_len = draw(st.integers(min_value=max(2, block_size), max_value=12 * block_size))
    enable_caching = draw(st.sampled_from([True, True, True, False])) if allow_caching_off \
        else True
    use_eagle = draw(st.booleans()) if allow_eagle else False
    return ManagerConfig(num_blocks=num_blocks, block_size=block_size,
                         max_model_len=max_model_len, enable_caching=enable_caching,
                         use_eagle=use_eagle)


class OneGroupRules:
    """The manager machine's rules for a model of one full-attention group (a mixin of
    :class:`~.machine.ManagerMachine`, which holds ``driver``, ``freed`` and the request ids)."""

    # -- model state the rules choose from -----------------------------------------------
    @property
    def model(self):  # the reference adapter inside the driver
        return self.driver.model

    def _config(self) -> ManagerConfig:
        assert self.driver.config is not None
        return self.driver.config

    def _held(self) -> set[str]:
        return self.model.manager.requests()

    def _waiting(self) -> list[str]:
        held = self._held()
        return sorted(rid for rid in self.model.requests if rid not in held)

    def _running(self) -> list[str]:
        held = self._held()
        return sorted(rid for rid in self.model.requests if rid in held)

    def _can(self, operation: str) -> bool:
        return self.driver.config is not None and not self.driver.several_groups and self.can(operation)

    # -- rules ---------------------------------------------------------------------------
    @property
    def caps(self) -> Capabilities:
        """What the engine claims: the machine only generates what it claims to support."""
        return self.verdicts.capabilities

    @precondition(lambda self: self._can("add_request") and len(self.model.requests)
                  < MAX_LIVE_REQUESTS)
    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        config = self._config()
        if self.workload == "mooncake":  # prompts shaped like the Mooncake trace (trace.py)
            prompt = self.conversations.next_prompt(data, config.block_size, config.max_model_len - 1)
        else:
            prompt = self._drawn_prompt(data, config)
        salt = data.draw(st.sampled_from([None, None, None, "salt-1", ""]), label="salt") \
            if self.caps.cache_salt else None
        self.driver.apply(steps.AddRequest(self.new_request_id(), prompt, salt))

    def _drawn_prompt(self, data: st.DataObject, config: ManagerConfig) -> tuple[int, ...]:
        """A prompt of the tiny alphabet: fresh, or cut from a live or past request's tokens."""
        live = [tuple(r.all_token_ids) for r in self.model.requests.values()]
        prefix: tuple[int, ...] = ()
        source = data.draw(st.sampled_from(["fresh", "live", "past", "past", "resend"]),
                           label="source")
        history = [tokens for tokens, _, _ in self.freed]
        corpus = {"fresh": [], "live": live, "past": history,
                  "resend": live + history}[source] or live or history
        if source != "fresh" and corpus:
            # Prefixes of live requests hit referenced blocks; prefixes of past (finished or
            # preempted) requests hit cached blocks waiting in the free queue.
            base = data.draw(st.sampled_from(corpus), label="base")
            blocks = len(base) // config.block_size
            cut = len(base) if source == "resend" else data.draw(st.one_of(
                st.just(len(base)),
                st.integers(0, blocks).map(lambda b: b * config.block_size),
                st.integers(0, len(base))), label="cut")
            prefix = base[:cut]
        if source == "resend" and prefix:
            # The same prompt again: its last block cannot be hit (num_tokens - 1), so it is
            # computed and cached a second time -- two blocks under one key (KV-POOL-009).
            suffix: tuple[int, ...] = ()
        else:
            # Mostly a few fresh tokens; sometimes enough to fill the pool on its own.
            room = max(1, config.max_model_len - 1 - len(prefix))
            suffix = tuple(data.draw(st.lists(TOKENS, min_size=0 if prefix else 1,
                                              max_size=2 * config.block_size + 2)
                                     | st.lists(TOKENS, min_size=1, max_size=room),
                                     label="suffix"))
        return (prefix + suffix)[: config.max_model_len - 1] or (0,)

    def _schedulable(self) -> list[str]:
        """Waiting requests, and running ones with uncomputed tokens."""
        held = self._held()
        return sorted(rid for rid, r in self.model.requests.items()
                      if rid not in held or r.num_computed_tokens < r.num_tokens)

    def _free_hit_blocks(self, hashes: tuple[bytes, ...], num_tokens: int) -> int:
        """How many blocks of a prompt's prefix-cache hit wait in the free queue (ref count 0).

        The hit is the longest run of cached keys, capped below the prompt's last token
        (KV-LIFE-001); each key resolves to the first block cached under it (KV-POOL-009).
        """
        pool = self.model.manager.pool
        free = 0
        for block_hash in hashes[:(num_tokens - 1) // self._config().block_size]:
            block = pool.get_cached_block((block_hash, 0))
            if block is None:
                break
            free += block.ref_cnt == 0
        return free

    def _revivable(self) -> list[int]:
        """Indices into ``freed`` of requests whose prompt would hit a free cached block."""
        if not self._config().enable_caching:
            return []
        return [i for i, (tokens, _, hashes) in enumerate(self.freed)
                if self._free_hit_blocks(hashes, len(tokens))]

    def _capacity_edge(self, request_id: str) -> tuple[int, int] | None:
        """New and lookahead tokens one block more than the free blocks outside the hit.

        A waiting request whose hit holds ``h`` free blocks fits only if the new blocks and
        those ``h`` together fit in the free queue (KV-LIFE-003): touching a free hit takes it
        out of the queue. Asking for exactly one block more than the free blocks outside the
        hit fails; an engine that forgets the ``h`` allocates it (and runs out). ``None`` where
        the hit holds no free block or the request cannot be that long.
        """
        config = self._config()
        request = self.model.requests[request_id]
        hit, hit_tokens = self.model.manager.get_computed_blocks(request)
        blocks = hit.blocks[0]
        free_hits = sum(block.ref_cnt == 0 for block in blocks)
        if not free_hits:
            return None
        free_elsewhere = self.model.manager.pool.num_free_blocks() - free_hits
        slots = (len(blocks) + free_elsewhere) * config.block_size + 1
        num_new = min(slots, request.num_tokens) - hit_tokens
        lookahead = slots - hit_tokens - num_new
        if num_new < 1 or slots > config.max_model_len or (lookahead and not self.caps.lookahead):
            return None
        return num_new, lookahead

    def _blocks_to_crowd(self, request_id: str) -> int:
        """How many free blocks other requests must take before ``request_id`` has a capacity
        edge (:meth:`_capacity_edge`), or 0 where it has one already or none can be made.

        The edge needs the free blocks outside the hit, ``e``, few enough that the hit, those
        ``e`` and one block more fit the model length. A pool of more blocks than the model
        length holds rarely has it: an engine that counts none of the free hit blocks against
        the pool (admitting where the new blocks fit but the new and the revived ones do not)
        escaped whole seeds. Blocks are taken from the front of the free queue, so only those
        before the hit's first free block can go without evicting it.
        """
        config = self._config()
        if not config.enable_caching:
            return 0
        request = self.model.requests[request_id]
        hit, _ = self.model.manager.get_computed_blocks(request)
        blocks = hit.blocks[0]
        free_hits = {block.block_id for block in blocks if block.ref_cnt == 0}
        if not free_hits:
            return 0
        queue = self.model.manager.pool.free_queue.block_ids()
        free_elsewhere = len(queue) - len(free_hits)
        # Past the prompt, the edge's slots are look-ahead tokens, which not every engine takes.
        limit = config.max_model_len if self.caps.lookahead else request.num_tokens
        most = (limit - 1) // config.block_size - len(blocks)
        before_hit = next(i for i, block_id in enumerate(queue) if block_id in free_hits)
        if most < 0 or free_elsewhere <= most or free_elsewhere - most > before_hit:
            return 0
        return free_elsewhere - most

    def _crowd_for_edge(self, request_id: str) -> None:
        """Requests of fresh tokens arrive and prefill until ``request_id``'s free hit blocks
        are most of the pool's free blocks (:meth:`_blocks_to_crowd`): each as long as the
        model allows, the last only as long as needed, up to ``MAX_FILLERS`` of them (23 free
        blocks and fillers of two blocks take 11). A shrunk counterexample has few: the fillers
        follow from the pool and the model length, which shrink."""
        config = self._config()
        per_filler = (config.max_model_len - 1) // config.block_size
        for _ in range(MAX_FILLERS):
            missing = self._blocks_to_crowd(request_id)
            if not missing or per_filler < 1:
                return
            filler_id = self.new_request_id()
            # Outside every workload's tokens (the alphabet, the trace's ids): it hits nothing.
            token = FILLER_TOKENS + int(filler_id[1:])
            length = min(missing, per_filler) * config.block_size
            self.driver.apply(steps.AddRequest(filler_id, (token,) * length))
            if self.driver.dead or filler_id not in self.model.requests:
                return
            self.driver.apply(steps.Schedule(filler_id, num_new_tokens=length))
            if self.driver.dead or filler_id not in self._held() or request_id not in self.model.requests:
                return

    def _schedule(self, data: st.DataObject, request_id: str, press: bool = False) -> None:
        """Schedule a request; a waiting one mostly at its capacity edge where it has one,
        crowding the pool for one first where that makes one. ``press``: always both."""
        config = self._config()
        running = request_id in self._held()
        edge = None if running else self._capacity_edge(request_id)
        if edge is None and not running and self._blocks_to_crowd(request_id) and (press or data.draw(
                st.sampled_from([True, True, True, False]), label="crowd the pool")):
            self._crowd_for_edge(request_id)
            if self.driver.dead or request_id not in self.model.requests or request_id in self._held():
                return
            edge = self._capacity_edge(request_id)
        if edge is not None and (press or data.draw(st.sampled_from([True, True, True, False]),
                                                    label="capacity edge")):
            num_new, lookahead = edge
        else:
            num_new = data.draw(st.integers(1, 3 * config.block_size), label="new")
            lookahead = data.draw(st.sampled_from([0, 0, 1, config.block_size]),
                                  label="lookahead") if self.caps.lookahead else 0
        self.driver.apply(steps.Schedule(
            request_id, num_new_tokens=num_new,
            num_draft_tokens=data.draw(st.sampled_from([0, 0, 1, 2]), label="drafts")
            if running else 0,
            num_lookahead_tokens=lookahead,
            delay_cache_blocks=False if running or not self.caps.delay_cache else data.draw(
                st.sampled_from([False, False, False, True]), label="delay")))

    @precondition(lambda self: self._can("allocate") and self._schedulable())
    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        self._schedule(data, data.draw(st.sampled_from(self._schedulable()), label="request"))

    def _can_revive(self) -> bool:
        return self._can("add_request") and self._can("allocate") \
            and len(self.model.requests) < MAX_LIVE_REQUESTS

    @precondition(lambda self: self._can_revive() and self._revivable())
    @rule(data=st.data())
    def revive(self, data: st.DataObject) -> None:
        """A freed request's prompt comes back while some of its blocks wait in the free queue."""
        self._revive(data, data.draw(st.sampled_from(self._revivable()), label="freed request"))

    def _revive(self, data: st.DataObject, index: int, press: bool = False) -> None:
        """Send ``freed[index]``'s tokens again, plus up to a block more, and schedule them.

        Drawn from the whole corpus, such a request was scheduled in a few per cent of
        examples, before the blocks were reallocated, evicted or reset; and some seeds never
        touched a free hit (KV-POOL-008) or counted one against the free queue (KV-LIFE-003)
        in 150 examples. Here the prompt arrives and is scheduled at once.
        """
        config = self._config()
        tokens, salt, _ = self.freed[index]
        suffix = tuple(data.draw(st.lists(TOKENS, max_size=config.block_size), label="suffix"))
        request_id = self.new_request_id()
        self.driver.apply(steps.AddRequest(request_id, (tokens + suffix)[: config.max_model_len - 1],
                                     salt))
        if not self.driver.dead and request_id in self.model.requests:
            self._schedule(data, request_id, press)

    def _shortest_to_come_back(self) -> int:
        """A prompt whose hit holds a block: a block and a token (with EAGLE, which drops the
        hit's last block, two blocks and a token)."""
        config = self._config()
        return (2 if config.use_eagle else 1) * config.block_size + 1

    def _can_come_back(self) -> bool:
        return self._can_revive() and self._can("free") and self._config().enable_caching \
            and self._shortest_to_come_back() <= self._config().max_model_len - 1

    @precondition(lambda self: self._can_come_back())
    @rule(data=st.data())
    def come_back_to_a_crowded_pool(self, data: st.DataObject) -> None:
        """A prompt is computed and finishes; requests of fresh tokens take the free blocks
        outside its cached ones; the prompt comes back and asks for one block more than the
        pool holds once its hit blocks leave the free queue (KV-LIFE-003, :meth:`_capacity_edge`).

        Where the pool holds more than the model length, the free blocks are rarely mostly one
        request's hit: an engine that admits by the new blocks alone, forgetting the hit blocks
        it takes out of the free queue, escaped whole seeds. Where a failure elsewhere stops
        the engine's allocations after the first round, this has to show in the first few
        examples, so it is a rule of its own and sets the whole case up each time.
        """
        config = self._config()
        length = data.draw(st.integers(self._shortest_to_come_back(), config.max_model_len - 1), label="length")
        request_id = self.new_request_id()
        # Tokens of its own: every block of the prompt is its own, free once it finishes.
        prompt = (FILLER_TOKENS + int(request_id[1:]),) * length
        self.driver.apply(steps.AddRequest(request_id, prompt))
        if self.driver.dead or request_id not in self.model.requests:
            return
        self.driver.apply(steps.Schedule(request_id, num_new_tokens=length))
        if self.driver.dead or request_id not in self._held():
            return
        request = self.model.requests[request_id]
        self.freed = [(tuple(request.all_token_ids), request.cache_salt,
                       tuple(request.block_hashes)), *self.freed][:8]
        self.driver.apply(steps.Free(request_id, False))
        if not self.driver.dead and self._can_revive() and 0 in self._revivable():
            self._revive(data, 0, press=True)

    # Hypothesis picks among rules uniformly: two more names for `schedule` make it the most
    # frequent step, as it is in a serving engine.
    schedule_more = schedule
    schedule_most = schedule

    def _decodable(self) -> list[str]:
        limit = self._config().max_model_len
        return [r for r in self._running()
                if self.model.requests[r].num_computed_tokens
                == self.model.requests[r].num_tokens < limit]

    @precondition(lambda self: self._can("append_tokens") and self._decodable())
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        config = self._config()
        request_id = data.draw(st.sampled_from(self._decodable()), label="request")
        room = config.max_model_len - self.model.requests[request_id].num_tokens
        tokens = data.draw(st.lists(TOKENS, min_size=1, max_size=min(3, room)), label="tokens")
        self.driver.apply(steps.AppendTokens(request_id, tuple(tokens)))

    @precondition(lambda self: self._can("free") and self.model.requests)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        # Mostly a request that has computed a full block: it finishes (or is preempted) and
        # leaves cached blocks in the free queue. Drawn uniformly, two frees in three were of
        # requests that had cached nothing, aborted before they were scheduled.
        requests = sorted(self.model.requests)
        computed = [rid for rid in requests if self.model.requests[rid].num_computed_tokens
                    >= self._config().block_size]
        choices = computed if computed and data.draw(
            st.sampled_from([True, True, True, False]), label="finished") else requests
        request_id = data.draw(st.sampled_from(choices), label="request")
        preempted = data.draw(st.booleans(), label="preempted")
        request = self.model.requests[request_id]
        self.freed = [(tuple(request.all_token_ids), request.cache_salt,
                       tuple(request.block_hashes)), *self.freed][:8]
        self.driver.apply(steps.Free(request_id, preempted))
        # The next turn of a conversation: the finished request's whole text comes back as
        # the prefix of a new prompt, while its blocks still wait in the free queue.
        if not self.driver.dead and self._can_revive() and 0 in self._revivable() \
                and data.draw(st.booleans(), label="next turn"):
            self._revive(data, 0)

    @precondition(lambda self: self._can("lookup") and self.model.requests)
    @rule(data=st.data())
    def query(self, data: st.DataObject) -> None:
        """Read-only questions: a bounded lookup, common prefix blocks, an empty allocation."""
        kinds = ["probe", "probe"]
        if self._running() and self._can("common_prefix_blocks") \
                and self.caps.common_prefix != "none":
            kinds.append("common_prefix")
        if self._running() and self._can("allocate"):
            kinds.append("empty_allocation")
        kind = data.draw(st.sampled_from(kinds), label="query")
        if kind == "probe":
            request_id = data.draw(st.sampled_from(sorted(self.model.requests)), label="request")
            num_tokens = self.model.requests[request_id].num_tokens
            bound = data.draw(st.integers(0, num_tokens + self._config().block_size),
                              label="bound")
            self.driver.apply(steps.Probe(request_id, bound))
            return
        request_id = data.draw(st.sampled_from(self._running()), label="request")
        self.driver.apply(steps.CommonPrefix(request_id) if kind == "common_prefix"
                          else steps.EmptyAllocation(request_id))

    def _can_evict(self) -> bool:
        return self.caps.evict and self._can("evict")

    def _can_reset(self) -> bool:
        return self.caps.reset and self._can("reset_prefix_cache")

    def _one_block_short_of_reset(self) -> bool:
        """Whether exactly one block is held: the smallest state in which a reset must fail."""
        pool = self.model.manager.pool
        return pool_spec.can_reset_prefix_cache(pool.num_free_blocks() + 1, self._config().num_blocks)

    def _hold_one_block(self, data: st.DataObject) -> None:
        """A request of at most a block of fresh tokens arrives and is scheduled whole.

        Waiting for the requests to end until one holding a single block is left reached
        that state by chance: against vLLM 0.33.0 (whose capabilities draw other examples than
        the reference's) seed 9 never reset there in 2,139 test calls, and a reset let
        through with one block held went unseen. With nothing held, one short prompt (too
        short for a hit: its last token is never hit) takes exactly one block of a
        full-attention group.
        """
        config = self._config()
        longest = min(config.block_size, config.max_model_len - 1)
        prompt = tuple(data.draw(st.lists(TOKENS, min_size=1, max_size=longest), label="one block of tokens"))
        request_id = self.new_request_id()
        self.driver.apply(steps.AddRequest(request_id, prompt))
        if not self.driver.dead and request_id in self.model.requests:
            self.driver.apply(steps.Schedule(request_id, num_new_tokens=len(prompt)))

    @precondition(lambda self: self._can_evict() or self._can_reset())
    @rule(data=st.data())
    def maintenance(self, data: st.DataObject) -> None:
        """A connector evicts blocks, or an RL loop resets the prefix cache."""
        # A reset one time in three, but three in four where exactly one block is held: the
        # boundary of KV-POOL-014, which a count off by one lets through. The reference's run of
        # seed 6 reached it in 3 % of its steps and tried 7 resets there, against 172 with
        # nothing held.
        boundary = self._can_reset() and self._one_block_short_of_reset()
        kinds = (["evict"] * (1 if boundary else 2) if self._can_evict() else []) + \
            (["reset"] * (3 if boundary else 1) if self._can_reset() else [])
        if data.draw(st.sampled_from(kinds), label="maintenance") == "reset":
            # Nothing held is the state in which a reset succeeds (KV-POOL-014); _can_revive
            # is the gate for a request that arrives and is scheduled at once.
            pool = self.model.manager.pool
            nothing_held = pool_spec.can_reset_prefix_cache(pool.num_free_blocks(), self._config().num_blocks)
            if nothing_held and self._can_revive() and data.draw(
                    st.booleans(), label="hold one block first"):
                self._hold_one_block(data)
            if not self.driver.dead:
                self.driver.apply(steps.ResetPrefixCache())
            return
        config = self._config()
        cached = sorted(b for blocks in self.model.manager.pool.cached.values()
                        for b in blocks)
        any_block = st.integers(0, config.num_blocks - 1)
        choice = st.sampled_from(cached) if cached else any_block
        ids = data.draw(st.lists(st.one_of(choice, any_block), max_size=2, unique=True),
                        label="block ids")
        self.driver.apply(steps.Evict(tuple(ids)))

    @precondition(lambda self: not self.driver.several_groups and (self.driver.dead or self.quarantined()))
    @rule()
    def observe(self) -> None:
        # Available once the engine is dead or an operation is quarantined, so that a run can
        # always make progress; otherwise every step already observes.
        self.driver.apply(steps.Observe())
