"""Judging one full-attention group: the manager suite's unitary-coordinator steps.

With a :class:`~kvoracle.conformance.steps.Configure` step the model is one
full-attention group, as vLLM's ``UnitaryKVCacheCoordinator`` holds it, and the
driver judges each step with the single-group chapters' rules (block pool,
hashing, full attention, lifecycle). After every step it

1. compares what the operation returned (hit lengths and blocks, allocation
   results) against the reference, attributing a difference to the most
   specific rule it can;
2. compares the engine's observation against the reference's, field by field,
   each field attributed to the rule that governs it in that kind of step;
3. checks the invariants that hold of any engine's observation alone
   (:mod:`..invariants`), whatever the reference says.

Engines that do not claim ``exact_block_ids`` are compared on shapes (table
lengths, cache-map sizes) instead of ids.
"""

from __future__ import annotations

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import lifecycle

from .. import invariants, steps
from ..adapter import Lookup, Observation
from ..harness.calls import RAISED, EngineError
from ..harness.capabilities import mode_rule


def _diff(label: str, expected: object, actual: object) -> str:
    return f"{label}: reference {expected!r}, engine {actual!r}"


class OneGroupJudge:
    """The manager driver's handlers for a model of one full-attention group (a mixin of
    :class:`~.driver.ManagerDriver`, whose state it reads: ``model``, ``config``, ``capabilities``
    and the engine-hash maps)."""

    # -- observation ---------------------------------------------------------------------
    def _one_observe(self) -> tuple[Observation, Observation]:
        return self.model.observe(), self.call("observe")

    def _one_compare(self, expected: Observation, actual: Observation, rules: dict[str, str]
                 ) -> None:
        """Field-by-field comparison; ``rules`` names the rule governing each field."""
        check = self.verdicts.check
        caps = self.capabilities
        check(rules["num_free"], expected.num_free_blocks == actual.num_free_blocks,
              lambda: _diff("free blocks", expected.num_free_blocks, actual.num_free_blocks))
        tables = _tables(expected, caps.exact_block_ids)
        check(rules["tables"], tables == _tables(actual, caps.exact_block_ids),
              lambda: _diff("block tables", tables, _tables(actual, caps.exact_block_ids)))
        if caps.ref_counts and caps.exact_block_ids:
            check(rules["ref_counts"], expected.ref_counts == actual.ref_counts,
                  lambda: _diff("ref counts", expected.ref_counts, actual.ref_counts))
        if caps.free_queue and caps.exact_block_ids:
            check(rules["free_queue"], expected.free_queue == actual.free_queue,
                  lambda: _diff("free queue", expected.free_queue, actual.free_queue))
        if caps.cache_map and caps.exact_block_ids and actual.cached is not None:
            for key, blocks in (expected.cached or {}).items():
                if len(blocks) > 1:  # identical contents cached twice: no de-dup, order kept
                    check("KV-POOL-009", actual.cached.get(key) == blocks,
                          lambda key=key, blocks=blocks: _diff(
                              "blocks cached under one key", blocks, actual.cached.get(key)))
        if caps.cache_map:
            cached = _cached(expected, caps.exact_block_ids)
            check(rules["cached"], cached == _cached(actual, caps.exact_block_ids),
                  lambda: _diff("cache map", cached, _cached(actual, caps.exact_block_ids)))

    def _one_judge(self, rules: dict[str, str]) -> Observation:
        expected, actual = self._one_observe()
        assert self.config is not None
        invariants.check_all(self.verdicts, self.config, actual)
        self._one_compare(expected, actual, rules)
        return actual

    # -- steps ---------------------------------------------------------------------------
    def _one_Configure(self, step: steps.Configure) -> None:
        self.config = step.config
        self.model.configure(step.config)
        self.new_engine()
        self.call("configure", step.config)
        self._engine_hash.clear()
        self._kv_hash.clear()
        self._hash_salt.clear()
        actual = self._one_judge(_rules(free_queue="KV-POOL-003", default="KV-POOL-001"))
        if self.capabilities.free_queue and self.capabilities.exact_block_ids:
            self.verdicts.check("KV-POOL-003", actual.free_queue == tuple(
                range(1, step.config.num_blocks)), lambda: f"initial queue {actual.free_queue}")

    def _one_AddRequest(self, step: steps.AddRequest) -> None:
        self.model.add_request(step.request_id, step.prompt, step.cache_salt)
        self.call("add_request", step.request_id, step.prompt, step.cache_salt)
        actual = self._one_judge(_rules(default="KV-LIFE-016"))
        self._check_hashes(step.request_id, actual, before=())

    def _one_AppendTokens(self, step: steps.AppendTokens) -> None:
        before = self.call("observe").request_hashes or {}
        self.model.append_tokens(step.request_id, step.tokens)
        self.call("append_tokens", step.request_id, step.tokens)
        actual = self._one_judge(_rules(default="KV-LIFE-016"))
        self._check_hashes(step.request_id, actual, before=before.get(step.request_id, ()))

    def _check_hashes(self, request_id: str, actual: Observation, before: tuple) -> None:
        """KV-HASH-001..004/007: the engine's hashes name exactly the spec's prefixes."""
        if not self.capabilities.request_hashes or actual.request_hashes is None:
            return
        check = self.verdicts.check
        engine_hashes = tuple(actual.request_hashes.get(request_id, ()))
        request = self.model.requests[request_id]
        spec_hashes = tuple(request.block_hashes)
        check("KV-HASH-002", len(engine_hashes) == len(spec_hashes), lambda: (
            f"{request_id} has {request.num_tokens} tokens with hash_block_size "
            f"{request.hash_block_size}: {len(spec_hashes)} hashes expected, engine has "
            f"{len(engine_hashes)}"))
        check("KV-HASH-003", engine_hashes[:len(before)] == tuple(before),
              lambda: f"{request_id}: appending tokens changed earlier hashes")
        for index, (engine_hash, spec_hash) in enumerate(zip(engine_hashes, spec_hashes)):
            known_spec = self._engine_hash.setdefault(engine_hash, spec_hash)
            known_engine = self._kv_hash.setdefault(spec_hash, engine_hash)
            salt = request.cache_salt or None  # an empty salt is no salt (KV-HASH-007)
            self._hash_salt.setdefault(spec_hash, salt)
            consistent = known_spec == spec_hash and known_engine == engine_hash
            salts_differ = self._hash_salt.get(known_spec) != salt
            salted = salt is not None or (not consistent and salts_differ)
            rule_id = "KV-HASH-007" if salted else "KV-HASH-004"
            check(rule_id, consistent, lambda index=index: (
                f"{request_id} block {index}: the engine's hash does not identify the prefix "
                "(equal hashes for different prefixes, or different hashes for one prefix)"))
            self.verdicts.check("KV-HASH-001", consistent, "chained hash mismatch")

    def _one_lookup(self, request_id: str, max_length: int | None) -> tuple[Lookup, Lookup]:
        expected = self.model.lookup(request_id, max_length)
        actual = self.call("lookup", request_id, max_length)
        self.last_lookup = (len(self.steps), request_id, expected, actual)
        self._check_lookup(request_id, max_length, expected, actual)
        return expected, actual

    def _check_lookup(self, request_id: str, max_length: int | None, expected: Lookup,
                      actual: Lookup) -> None:
        check = self.verdicts.check
        config = self.config
        assert config is not None
        request = self.model.requests[request_id]
        bound = lifecycle.max_cache_hit_length(request.num_tokens) if max_length is None \
            else max_length
        size = config.block_size
        got = actual.num_tokens
        check("KV-LIFE-002", config.enable_caching or got == 0,
              lambda: f"hit of {got} tokens with prefix caching off")
        if max_length is None:
            check("KV-LIFE-001", got <= bound,
                  lambda: f"hit of {got} tokens for a request of {request.num_tokens} tokens")
        check("KV-FULL-004", 0 <= got <= bound and got % size == 0
              and all(len(g) * size == got for g in actual.block_ids),
              lambda: f"hit of {got} tokens, blocks {actual.block_ids}, bound {bound}, "
                      f"block_size {size}")
        if config.use_eagle:
            check("KV-FULL-003", got != expected.num_tokens + size,
                  lambda: f"hit {got} = reference {expected.num_tokens} + one block: "
                          "the EAGLE drop was not applied")
        check("KV-FULL-001", got == expected.num_tokens,
              lambda: _diff(f"hit length of {request_id} (bound {bound})",
                            expected.num_tokens, got))
        if self.capabilities.exact_block_ids:
            check("KV-FULL-002", actual.block_ids == expected.block_ids,
                  lambda: _diff(f"hit blocks of {request_id}", expected.block_ids,
                                actual.block_ids))
        if self.capabilities.exact_block_ids and self.capabilities.cache_map and got:
            # KV-POOL-009: each hit block is the earliest block still cached under its key.
            cached = self.call("observe").cached or {}
            hashes = request.block_hashes
            for index, block_id in enumerate(actual.block_ids[0]):
                under_key = cached.get((hashes[index], 0), ()) if index < len(hashes) else ()
                check("KV-POOL-009", under_key[:1] == (block_id,), lambda index=index,
                      block_id=block_id, under_key=under_key: (
                          f"hit block {index} of {request_id} is {block_id}, but the key's "
                          f"blocks in caching order are {under_key}"))

    def _one_Observe(self, step: steps.Observe) -> None:
        self._one_judge(_rules(default="KV-LIFE-016"))

    def _one_EmptyAllocation(self, step: steps.EmptyAllocation) -> None:
        """KV-LIFE-013: nothing to compute and nothing adopted must be rejected."""
        before = self.call("observe")
        try:
            self.model.allocate(step.request_id, 0, 0)
        except ValueError:
            pass
        else:  # pragma: no cover - the reference always rejects it
            raise AssertionError("the reference accepted an empty allocation")
        self.caller.trail.operation("allocate", "KV-LIFE-013")
        try:  # raising is the right answer here: called past Driver.call, which would charge it
            result = self.caller(self.engine, "allocate", step.request_id, 0, 0)
        except EngineError as error:
            if error.kind != RAISED:
                raise self._charge(error, "KV-LIFE-013") from None
            rejected = True
        else:
            rejected = False
        self.verdicts.check("KV-LIFE-013", rejected, lambda: (
            f"allocate_slots({step.request_id}, num_new_tokens=0) returned {result!r} "
            "instead of raising"))
        after = self.call("observe")
        self.verdicts.check("KV-LIFE-013", _state(after) == _state(before),
                            "a rejected allocation changed state")
        self._one_judge(_rules(default="KV-LIFE-013"))

    def _one_Probe(self, step: steps.Probe) -> None:
        request = self.model.requests[step.request_id]
        full_bound = lifecycle.max_cache_hit_length(request.num_tokens)
        _, low = self._one_lookup(step.request_id, step.max_cache_hit_length)
        _, high = self._one_lookup(step.request_id, None)
        if step.max_cache_hit_length <= full_bound:
            self.verdicts.check("KV-FULL-005", low.num_tokens <= high.num_tokens, lambda: (
                f"hit {low.num_tokens} at bound {step.max_cache_hit_length} exceeds hit "
                f"{high.num_tokens} at bound {full_bound}"))
        self._one_judge(_rules(default="KV-LIFE-016"))

    def _one_Schedule(self, step: steps.Schedule) -> None:
        config = self.config
        assert config is not None
        request = self.model.requests[step.request_id]
        waiting = step.request_id not in self.model.manager.requests()
        expected_hit = actual_hit = Lookup(((),), 0)
        if waiting:
            expected_hit, actual_hit = self._one_lookup(step.request_id, None)
        before = self.call("observe")
        computed = request.num_computed_tokens

        def new_tokens(hit: int) -> int:
            return min(step.num_new_tokens, request.num_tokens - computed - hit)

        expected_new, actual_new = new_tokens(expected_hit.num_tokens), \
            new_tokens(actual_hit.num_tokens)
        needed = self.model.manager.num_blocks_to_allocate(
            step.request_id,
            lifecycle.num_slots(computed, expected_hit.num_tokens,
                                expected_new + step.num_draft_tokens,
                                step.num_lookahead_tokens, config.max_model_len),
            computed + expected_hit.num_tokens,
            tuple(tuple(self.model.manager.pool.blocks[i] for i in g)
                  for g in expected_hit.block_ids))
        free_before = self.model.manager.pool.num_free_blocks()
        expected = self.model.allocate(
            step.request_id, expected_new + step.num_draft_tokens, expected_hit.num_tokens,
            step.num_lookahead_tokens, step.delay_cache_blocks)
        actual = self.call("allocate", step.request_id, actual_new + step.num_draft_tokens,
                           actual_hit.num_tokens, step.num_lookahead_tokens,
                           step.delay_cache_blocks)
        check = self.verdicts.check
        check("KV-LIFE-003", (expected is None) == (actual is None), lambda: (
            f"allocate_slots needs {needed} blocks with {free_before} free: reference "
            f"{'fails' if expected is None else 'succeeds'}, engine "
            f"{'fails' if actual is None else 'succeeds'}"))
        if actual is None:
            after = self.call("observe")
            check("KV-LIFE-004", _state(after) == _state(before),
                  lambda: _diff("state after a failed allocation", _state(before),
                                _state(after)))
            self._one_judge(_rules(default="KV-LIFE-004"))
            return
        self.model.advance(step.request_id, expected_new)
        self.call("advance", step.request_id, actual_new)
        old_table = before.block_tables.get(step.request_id, ((),))[0]
        hits = actual_hit.block_ids[0] if actual_hit.block_ids else ()
        after = self.call("observe")
        table = after.block_tables.get(step.request_id, ((),))[0]
        if self.capabilities.exact_block_ids:
            check("KV-LIFE-006", not set(actual[0]) & set(hits),
                  lambda: f"new blocks {actual[0]} include the request's own hits {hits}")
            check("KV-POOL-004", actual == expected,
                  lambda: _diff("newly allocated blocks", expected, actual))
        if hits and after.free_queue is not None and after.ref_counts is not None:
            queue = set(after.free_queue)
            check("KV-POOL-008", all(b not in queue and after.ref_counts[b] >= 1 for b in hits),
                  lambda: f"hit blocks {hits} are still free after being touched")
        check("KV-LIFE-014", table[:len(old_table)] == old_table,
              lambda: f"table {old_table} became {table}: not append-only")
        check("KV-LIFE-005", table == old_table + tuple(hits) + tuple(actual[0]),
              lambda: f"table {table} is not old {old_table} + hits {hits} + new {actual[0]}")
        if config.enable_caching and self.capabilities.cache_map and after.cached is not None \
                and self.capabilities.exact_block_ids:
            # A block popped by this allocation must have lost its old key -- unless this
            # very allocation cached it again under the same key, as the reference did.
            popped = set(actual[0])
            kept = {(k, b) for k, blocks in (self.model.observe().cached or {}).items()
                    for b in blocks}
            stale = [(k.hex()[:12] if isinstance(k, bytes) else k, b)
                     for (k, _group), blocks in after.cached.items() for b in blocks
                     if b in popped and b in (before.cached or {}).get((k, _group), ())
                     and ((k, _group), b) not in kept]
            check("KV-POOL-005", not stale,
                  lambda: f"allocated blocks kept their old cache keys: {stale}")
        cached_rule = ("KV-LIFE-012" if not config.enable_caching else
                       "KV-LIFE-008" if step.delay_cache_blocks else "KV-LIFE-007")
        self._one_judge(_rules(free_queue="KV-POOL-004", ref_counts="KV-POOL-008",
                           tables="KV-LIFE-005", num_free="KV-LIFE-003", cached=cached_rule))

    def _one_Free(self, step: steps.Free) -> None:
        before = self.call("observe")
        self.model.free(step.request_id, step.preempted)
        self.call("free", step.request_id, step.preempted)
        expected, actual = self._one_observe()
        assert self.config is not None
        invariants.check_all(self.verdicts, self.config, actual)
        check = self.verdicts.check
        check("KV-LIFE-009", step.request_id not in actual.block_tables,
              lambda: f"{step.request_id} still holds {actual.block_tables[step.request_id]}")
        if self.capabilities.free_queue and self.capabilities.exact_block_ids:
            release_rule = mode_rule("free_order", self.capabilities.free_order)
            forward = _forward_free_queue(before, step.request_id, self.config.enable_caching,
                                          self.capabilities.free_order)
            if expected.free_queue == actual.free_queue:
                check(release_rule, True)
                if forward != expected.free_queue:  # the order was observable: it counts
                    check("KV-POOL-007", True)
            else:
                rule_id = "KV-POOL-007" if actual.free_queue == forward else release_rule
                check(rule_id, False, lambda: _diff("free queue after free",
                                                    expected.free_queue, actual.free_queue))
        self._one_compare(expected, actual, _rules(free_queue=mode_rule("free_order", self.capabilities.free_order),
                                                   default="KV-LIFE-009"))

    def _one_Evict(self, step: steps.Evict) -> None:
        before = self.call("observe")
        model_ids, engine_ids = step.block_ids, step.block_ids
        if not self.capabilities.exact_block_ids:
            # Block ids are the reference's; evict only blocks whose engine counterpart is
            # known (same table position, or the only block under the same cache key).
            pairs = _id_correspondence(self.model.observe(), before)
            model_ids = tuple(b for b in step.block_ids if b in pairs)
            engine_ids = tuple(pairs[b] for b in model_ids)
        self.model.evict(model_ids)
        self.call("evict", engine_ids)
        actual = self._one_judge(_rules(default="KV-POOL-013"))
        check = self.verdicts.check
        check("KV-POOL-013", _state(actual, with_cache=False) == _state(before, with_cache=False),
              "evict_blocks changed ref counts, tables or the free queue")
        if actual.cached is not None:
            left = {b for blocks in actual.cached.values() for b in blocks} & set(engine_ids)
            check("KV-POOL-013", not left, lambda: f"blocks {sorted(left)} are still cached")

    def _one_ResetPrefixCache(self, step: steps.ResetPrefixCache) -> None:
        before = self.call("observe")
        expected = self.model.reset_prefix_cache()
        actual = self.call("reset_prefix_cache")
        assert self.config is not None
        check = self.verdicts.check
        check("KV-POOL-014", actual == pool_spec.can_reset_prefix_cache(
            before.num_free_blocks, self.config.num_blocks), lambda: (
            f"reset returned {actual} with {before.num_free_blocks} of "
            f"{self.config.num_blocks - 1} blocks free"))
        check("KV-POOL-014", actual == expected, lambda: _diff("reset result", expected, actual))
        after = self._one_judge(_rules(default="KV-POOL-014"))
        if actual and after.cached is not None:
            check("KV-POOL-014", not after.cached, "cache keys survive a successful reset")
        if not actual:
            check("KV-POOL-014", _state(after) == _state(before), "a failed reset changed state")

    def _one_CommonPrefix(self, step: steps.CommonPrefix) -> None:
        expected = self.model.common_prefix_blocks(step.request_id)
        actual = self.call("common_prefix_blocks", step.request_id)
        rule_id = "KV-LIFE-011" if self.capabilities.common_prefix == "cascade" else "KV-LIFE-010"
        self.verdicts.check(rule_id, tuple(actual) == tuple(expected),
                            lambda: _diff(f"common prefix blocks of {step.request_id}",
                                          expected, actual))
        self._one_judge(_rules(default="KV-LIFE-016"))


# -- helpers ---------------------------------------------------------------------------------
def _rules(default: str = "KV-LIFE-016", **fields: str) -> dict[str, str]:
    names = ("num_free", "tables", "ref_counts", "free_queue", "cached")
    return {name: fields.get(name, default) for name in names}


def _tables(observation: Observation, exact: bool) -> dict[str, tuple]:
    if exact:
        return dict(observation.block_tables)
    return {rid: tuple(len(g) for g in groups) for rid, groups in observation.block_tables.items()}


def _cached(observation: Observation, exact: bool) -> dict | None:
    if observation.cached is None:
        return None
    if exact:
        return dict(observation.cached)
    return {key: len(blocks) for key, blocks in observation.cached.items()}


def _state(observation: Observation, with_cache: bool = True) -> tuple:
    return (observation.num_free_blocks, observation.free_queue, observation.ref_counts,
            dict(observation.block_tables),
            dict(observation.cached or {}) if with_cache else None)


def _forward_free_queue(before: Observation, request_id: str, caching: bool, free_order: str
                        ) -> tuple[int, ...] | None:
    """The free queue a *forward-order* free would give (to name KV-POOL-007 precisely)."""
    if before.free_queue is None or before.ref_counts is None:
        return None
    table = before.block_tables.get(request_id, ((),))[0]
    keyed = {b for blocks in (before.cached or {}).values() for b in blocks}
    remaining = dict(enumerate(before.ref_counts))
    released, hashed = [], []
    for block_id in table:
        if block_id == 0:
            continue
        remaining[block_id] -= 1
        if remaining[block_id] == 0:
            released.append(block_id)
            hashed.append(caching and block_id in keyed)
    if free_order == "append":
        return pool_spec.queue_after_append(before.free_queue, tuple(released))
    return pool_spec.queue_after_release(before.free_queue, tuple(released), tuple(hashed))


def _id_correspondence(expected: Observation, actual: Observation) -> dict[int, int]:
    """Reference block id -> engine block id, where the observations pin it down."""
    pairs: dict[int, int] = {}
    for request_id, groups in expected.block_tables.items():
        for mine, theirs in zip(groups, actual.block_tables.get(request_id, ())):
            pairs.update(zip(mine, theirs))
    for key, blocks in (expected.cached or {}).items():
        theirs = (actual.cached or {}).get(key, ())
        if len(blocks) == 1 and len(theirs) == 1:
            pairs.setdefault(blocks[0], theirs[0])
    pairs.pop(0, None)
    return pairs
