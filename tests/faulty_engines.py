"""Engines that misbehave instead of answering wrongly: they raise, return the wrong type,
exit, kill their process or hang. The harness tests require each misbehaviour to be
charged to a rule, with a replay that keeps failing, and the run to go on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import attrs

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.external_store import ReferenceExternalStore, StoreSetup
from kvoracle.conformance.hybrid_lookup import ReferenceHybridLookup


class LookupReturnsNone(ReferenceEngine):
    name = "faulty-lookup-none"

    def lookup(self, request_id, max_cache_hit_length=None):
        super().lookup(request_id, max_cache_hit_length)
        return None


class ObserveReturnsDict(ReferenceEngine):
    name = "faulty-observe-dict"

    def observe(self):
        return attrs.asdict(super().observe())


class CommonPrefixReturnsInt(ReferenceEngine):
    name = "faulty-common-prefix-int"

    def common_prefix_blocks(self, request_id):
        return 0


class ExitsOnFree(ReferenceEngine):
    name = "faulty-sys-exit"

    def free(self, request_id, preempted=False):
        sys.exit(3)


class HardExitsOnEvict(ReferenceEngine):
    """``os._exit`` from the engine: without the harness's guard it ends the whole run."""

    name = "faulty-os-exit"

    def evict(self, block_ids):
        os._exit(4)


class SegfaultsOnReset(ReferenceEngine):
    """Kills its own process, as a crash in an engine's native extension would."""

    name = "faulty-segfault"

    def reset_prefix_cache(self):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5)  # the signal is delivered asynchronously
        return False


_CALLS = {"allocate": 0}
_LOCK = threading.Lock()


class RaisesNowAndThen(ReferenceEngine):
    """Raises in one ``allocate`` call of 53, whatever the steps: a flaky engine."""

    name = "faulty-intermittent"

    def allocate(self, *args, **kwargs):
        with _LOCK:
            _CALLS["allocate"] += 1
            count = _CALLS["allocate"]
        if count % 53 == 0:
            raise RuntimeError(f"transient allocator failure on call {count}")
        return super().allocate(*args, **kwargs)


class HangsInStoreMask(ReferenceExternalStore):
    name = "faulty-store-hang"

    def store_mask(self, aligned_len, start_token=0):
        time.sleep(3600)
        return super().store_mask(aligned_len, start_token)


class SpinsInStoreMask:
    """An adapter for two suites, external-store and hybrid: its ``store_mask`` never answers
    and holds the GIL (a pure-Python loop); its hybrid lookups are the reference's. Its
    version names its process, so a report shows which process ran each suite."""

    name = "faulty-store-spin"

    def __init__(self) -> None:
        self.store = ReferenceExternalStore()
        self.hybrid = ReferenceHybridLookup()
        self.current: ReferenceExternalStore | ReferenceHybridLookup = self.store

    def version(self) -> str:
        return f"pid {os.getpid()}"

    def configure(self, setup) -> None:
        self.current = self.store if isinstance(setup, StoreSetup) else self.hybrid
        self.current.configure(setup)

    def lookup(self, *args):
        return self.current.lookup(*args)

    def seed_cache(self, *args) -> None:
        self.hybrid.seed_cache(*args)

    def load_mask(self, *args):
        return self.store.load_mask(*args)

    def lookup_mask(self, *args):
        return self.store.lookup_mask(*args)

    def local_hit(self, *args):
        return self.store.local_hit(*args)

    def store_mask(self, *args):
        while True:
            pass


class HybridOnly(ReferenceHybridLookup):
    """Has the hybrid lookup suite's operations and no other suite's."""

    name = "hybrid-only"


class NotAnAdapter:
    """Offers none of any suite's operations."""


class SlowToConfigure(ReferenceEngine):
    """Correct, but each ``configure`` computes for 100 ms of CPU time first."""

    name = "slow-to-configure"

    def configure(self, config):
        deadline = time.thread_time() + 0.1
        while time.thread_time() < deadline:
            pass
        super().configure(config)
