"""Hypothesis state machines that drive the reference and an engine in lockstep.

:func:`make_machine` builds a ``RuleBasedStateMachine`` class for one engine.
Its rules only *choose* steps (:mod:`.steps`) from the model's state; the
:class:`~.lockstep.LockstepDriver` applies each step to both sides and judges
it. Third parties can use the machine directly in their own test suites::

    from kvoracle.conformance.machine import make_machine
    TestMyEngine = make_machine(MyEngineAdapter).TestCase

Generated configurations vary the pool size, block size, ``max_model_len``,
prefix caching and EAGLE; request prompts are cut from earlier requests'
tokens (often at block boundaries) plus a few fresh tokens from a tiny
alphabet, so prefixes collide, get cached, evicted and come back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvoracle.reference import ManagerConfig

from .adapter import EngineAdapter
from .lockstep import LockstepDriver
from .steps import (AddRequest, AppendTokens, CommonPrefix, Configure, EmptyAllocation, Evict,
                    Free, Probe, ResetPrefixCache, Schedule)
from .verdicts import Verdicts

#: Tokens come from a tiny alphabet so that independent requests collide.
TOKENS = st.integers(min_value=0, max_value=3)
MAX_LIVE_REQUESTS = 5


@st.composite
def manager_configs(draw: st.DrawFn, allow_caching_off: bool = True,
                    allow_eagle: bool = True) -> ManagerConfig:
    """Valid single-group configurations, biased towards small pools that fill up."""
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    num_blocks = draw(st.integers(min_value=2, max_value=24))
    max_model_len = draw(st.integers(min_value=max(2, block_size), max_value=12 * block_size))
    enable_caching = draw(st.sampled_from([True, True, True, False])) if allow_caching_off \
        else True
    use_eagle = draw(st.booleans()) if allow_eagle else False
    return ManagerConfig(num_blocks=num_blocks, block_size=block_size,
                         max_model_len=max_model_len, enable_caching=enable_caching,
                         use_eagle=use_eagle)


class LockstepMachine(RuleBasedStateMachine):
    """Base machine; :func:`make_machine` binds it to an engine and a verdict collector."""

    engine_factory: Callable[[], EngineAdapter]
    verdicts: Verdicts
    quarantine: set[str]
    step_timeout: float | None = 10.0
    on_example: Callable[[], None] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.driver: LockstepDriver | None = None
        self.ids = itertools.count()
        self.history: list[tuple[int, ...]] = []
        if self.on_example is not None:
            self.on_example()

    # -- model state the rules choose from -----------------------------------------------
    @property
    def model(self):  # the reference adapter inside the driver
        assert self.driver is not None
        return self.driver.model

    def _config(self) -> ManagerConfig:
        assert self.driver is not None and self.driver.config is not None
        return self.driver.config

    def _held(self) -> set[str]:
        return self.model.manager.coordinator.requests()

    def _waiting(self) -> list[str]:
        held = self._held()
        return sorted(rid for rid in self.model.requests if rid not in held)

    def _running(self) -> list[str]:
        held = self._held()
        return sorted(rid for rid in self.model.requests if rid in held)

    def _can(self, operation: str) -> bool:
        return self.driver is not None and self.driver.available(operation)

    # -- rules ---------------------------------------------------------------------------
    @initialize(config=manager_configs())
    def configure(self, config: ManagerConfig) -> None:
        self.driver = LockstepDriver(type(self).engine_factory, self.verdicts,
                                     self.step_timeout, self.quarantine)
        self.driver.apply(Configure(config))

    @precondition(lambda self: self._can("add_request") and len(self.model.requests)
                  < MAX_LIVE_REQUESTS)
    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        config = self._config()
        corpus = [tuple(r.all_token_ids) for r in self.model.requests.values()] + self.history
        prefix: tuple[int, ...] = ()
        if corpus and data.draw(st.booleans(), label="shares a prefix"):
            base = data.draw(st.sampled_from(corpus), label="base")
            blocks = len(base) // config.block_size
            cut = data.draw(st.one_of(
                st.integers(0, blocks).map(lambda b: b * config.block_size),
                st.integers(0, len(base))), label="cut")
            prefix = base[:cut]
        suffix = tuple(data.draw(st.lists(TOKENS, min_size=0 if prefix else 1,
                                          max_size=2 * config.block_size + 2), label="suffix"))
        prompt = (prefix + suffix)[: config.max_model_len - 1] or (0,)
        salt = data.draw(st.sampled_from([None, None, None, "salt-1"]), label="salt")
        self.history = ([prompt] + self.history)[:8]
        self.driver.apply(AddRequest(f"r{next(self.ids)}", prompt, salt))

    @precondition(lambda self: self._can("allocate") and self._waiting())
    @rule(data=st.data())
    def schedule_waiting(self, data: st.DataObject) -> None:
        config = self._config()
        request_id = data.draw(st.sampled_from(self._waiting()), label="request")
        self.driver.apply(Schedule(
            request_id,
            num_new_tokens=data.draw(st.integers(1, 3 * config.block_size), label="new"),
            num_lookahead_tokens=data.draw(st.sampled_from([0, 0, 1, config.block_size]),
                                           label="lookahead"),
            delay_cache_blocks=data.draw(st.sampled_from([False, False, False, True]),
                                         label="delay")))

    @precondition(lambda self: self._can("allocate") and any(
        self.model.requests[r].num_computed_tokens < self.model.requests[r].num_tokens
        for r in self._running()))
    @rule(data=st.data())
    def schedule_running(self, data: st.DataObject) -> None:
        config = self._config()
        candidates = [r for r in self._running()
                      if self.model.requests[r].num_computed_tokens
                      < self.model.requests[r].num_tokens]
        request_id = data.draw(st.sampled_from(candidates), label="request")
        self.driver.apply(Schedule(
            request_id,
            num_new_tokens=data.draw(st.integers(1, 3 * config.block_size), label="new"),
            num_draft_tokens=data.draw(st.sampled_from([0, 0, 1, 2]), label="drafts"),
            num_lookahead_tokens=data.draw(st.sampled_from([0, 0, 1, config.block_size]),
                                           label="lookahead")))

    @precondition(lambda self: self._can("append_tokens") and any(
        self.model.requests[r].num_computed_tokens == self.model.requests[r].num_tokens
        < self._config().max_model_len for r in self._running()))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        config = self._config()
        candidates = [r for r in self._running()
                      if self.model.requests[r].num_computed_tokens
                      == self.model.requests[r].num_tokens < config.max_model_len]
        request_id = data.draw(st.sampled_from(candidates), label="request")
        room = config.max_model_len - self.model.requests[request_id].num_tokens
        tokens = data.draw(st.lists(TOKENS, min_size=1, max_size=min(3, room)), label="tokens")
        self.driver.apply(AppendTokens(request_id, tuple(tokens)))

    @precondition(lambda self: self._can("free") and self.model.requests)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.model.requests)), label="request")
        preempted = data.draw(st.booleans(), label="preempted")
        self.driver.apply(Free(request_id, preempted))

    @precondition(lambda self: self._can("lookup") and self.model.requests)
    @rule(data=st.data())
    def probe(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.model.requests)), label="request")
        num_tokens = self.model.requests[request_id].num_tokens
        bound = data.draw(st.integers(0, num_tokens + self._config().block_size), label="bound")
        self.driver.apply(Probe(request_id, bound))

    @precondition(lambda self: self._can("evict"))
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        config = self._config()
        cached = sorted(b for blocks in self.model.manager.pool.cached.values()
                        for b in blocks)
        any_block = st.integers(0, config.num_blocks - 1)
        choice = st.sampled_from(cached) if cached else any_block
        ids = data.draw(st.lists(st.one_of(choice, any_block), max_size=3, unique=True),
                        label="block ids")
        self.driver.apply(Evict(tuple(ids)))

    @precondition(lambda self: self._can("allocate") and self._running())
    @rule(data=st.data())
    def empty_allocation(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._running()), label="request")
        self.driver.apply(EmptyAllocation(request_id))

    @precondition(lambda self: self._can("reset_prefix_cache"))
    @rule()
    def reset(self) -> None:
        self.driver.apply(ResetPrefixCache())

    @precondition(lambda self: self._can("common_prefix_blocks") and self._running())
    @rule(data=st.data())
    def common_prefix(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._running()), label="request")
        self.driver.apply(CommonPrefix(request_id))

    def teardown(self) -> None:
        if self.driver is not None:
            self.driver.close()


def make_machine(engine_factory: Callable[[], EngineAdapter], verdicts: Verdicts | None = None,
                 quarantine: set[str] | None = None, step_timeout: float | None = 10.0,
                 on_example: Callable[[], None] | None = None,
                 max_examples: int = 100, step_count: int = 40) -> type[LockstepMachine]:
    """A machine class bound to one engine (``engine_factory()`` builds a fresh adapter)."""
    if verdicts is None:
        verdicts = Verdicts(engine_factory().capabilities())
    machine = type(f"Lockstep_{getattr(engine_factory, '__name__', 'engine')}",
                   (LockstepMachine,), {
                       "engine_factory": staticmethod(engine_factory),
                       "verdicts": verdicts,
                       "quarantine": quarantine if quarantine is not None else set(),
                       "step_timeout": step_timeout,
                       "on_example": staticmethod(on_example) if on_example else None,
                   })
    machine.TestCase.settings = settings(
        max_examples=max_examples, stateful_step_count=step_count, deadline=None,
        database=None, suppress_health_check=list(HealthCheck))
    return machine
